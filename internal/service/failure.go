package service

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// FailureMode is what rls answers for a descriptor when its backend is unavailable; see
// descriptors.FailureMode. The zero value answers as FailError.
type FailureMode = descriptors.FailureMode

// The failure modes, as the service names them.
const (
	FailError = descriptors.FailureError
	FailAllow = descriptors.FailureAllow
	FailDeny  = descriptors.FailureDeny
	FailLocal = descriptors.FailureLocal
)

// ParseFailureMode parses "error", "allow", "deny" or "local".
func ParseFailureMode(s string) (FailureMode, error) { return descriptors.ParseFailureMode(s) }

// failureModeOf returns the failure mode of a descriptor that matched r (nil: none, or an
// override): its rule's, else the default, else FailError. It never returns FailureDefault.
func (s *Service) failureModeOf(r *descriptors.Rule) FailureMode {
	if r != nil && r.FailureMode != descriptors.FailureDefault {
		return r.FailureMode
	}
	if s.failure == descriptors.FailureDefault {
		return FailError
	}
	return s.failure
}

// AnswersWithoutBackend reports whether some decision still answers while the backend is
// unavailable: the default failure mode is not error, or some rule in force has failure_mode
// allow, deny or local. Readiness follows it (rls stays in its Service while a rule answers).
func (s *Service) AnswersWithoutBackend() bool {
	return s.failureModeOf(nil) != FailError || s.someRuleAnswers.Load()
}

// ruleAnswers reports whether some rule of rs sets a failure mode other than error.
func ruleAnswers(rs *descriptors.RuleSet) bool {
	if rs == nil {
		return false
	}
	for _, d := range rs.Domains {
		for _, r := range d.Rules {
			if r.FailureMode != descriptors.FailureDefault && r.FailureMode != descriptors.FailureError {
				return true
			}
		}
	}
	return false
}

// failurePolicy answers every item of a request whose backend is unavailable, by the item's
// failure mode: allow admits (without a count to report), deny refuses for one emission
// interval (at least a second), and local is left undecided for the local backend, which then
// only checks when a deny already refuses the request. When any item's mode is error the request
// fails as a whole: every item is then marked FailError and stands reports false.
//
// It sets every item's via and decision whatever the mix of modes, so that what follows
// (response, metrics) always sees a complete request. It does no I/O.
func failurePolicy(items []item) (stands, local bool) {
	denied := false
	for k := range items {
		it := &items[k]
		it.via = it.fail
		switch it.fail {
		case FailAllow:
			it.dec = backend.Decision{Allowed: true}
		case FailDeny:
			l := it.req.Limit
			retry := time.Duration(0)
			if l.Rate > 0 {
				retry = l.Period / time.Duration(l.Rate)
			}
			it.dec = backend.Decision{RetryAfter: max(retry, time.Second), ResetAfter: l.Period}
			denied = denied || it.req.Mode == backend.Enforce
		case FailLocal:
			it.dec = backend.Decision{}
			local = true
		default:
			markFailed(items)
			return false, false
		}
	}
	if local && denied {
		for k := range items {
			if items[k].via == FailLocal {
				items[k].req.Cost = 0 // the request is refused anyway: check, don't charge
			}
		}
	}
	return true, local
}

// markFailed marks every item of a request that fails as a whole.
func markFailed(items []item) {
	for k := range items {
		items[k].via = FailError
		items[k].dec = backend.Decision{}
	}
}

// decideLocal decides the items that failurePolicy left to the local backend.
func (s *Service) decideLocal(ctx context.Context, w *work) error {
	if s.localBackend == nil {
		return errors.New("no local backend")
	}
	w.localReqs = w.localReqs[:0]
	for k := range w.items {
		if w.items[k].via == FailLocal {
			w.localReqs = append(w.localReqs, w.items[k].req)
		}
	}
	n := len(w.localReqs)
	w.localOut = append(w.localOut[:0], make([]backend.Decision, n)...)
	if _, err := s.localBackend.Decide(ctx, w.localReqs, w.localOut); err != nil {
		return err
	}
	j := 0
	for k := range w.items {
		if w.items[k].via == FailLocal {
			w.items[k].dec = w.localOut[j]
			j++
		}
	}
	return nil
}

// failed answers a request whose backend call failed. Unavailability (backend.ErrUnavailable,
// overload included) goes through the failure policy; any other error is a bug or a
// misconfiguration: INTERNAL, logged at Error. The client never sees the error's text, which can
// carry internal addresses; the log has it at Debug.
func (s *Service) failed(ctx context.Context, req *rlsv3.RateLimitRequest, w *work, err error) (*rlsv3.RateLimitResponse, error) {
	s.log.LogAttrs(ctx, slog.LevelDebug, "backend failed", slog.String("domain", req.GetDomain()), slog.Any("err", err))
	if !errors.Is(err, backend.ErrUnavailable) {
		s.metrics.backendError(err)
		s.errLog.Log(slog.LevelError, "backend error", "backend error", "err", err)
		markFailed(w.items)
		return nil, status.Error(codes.Internal, internalMessage)
	}
	switch {
	case errors.Is(err, errInflight):
		s.metrics.inflightShed()
	case errors.Is(err, backend.ErrOverloaded):
		s.metrics.overloadShed()
	default:
		s.metrics.backendError(err)
	}
	stands, local := failurePolicy(w.items)
	if stands && local {
		if lerr := s.decideLocal(ctx, w); lerr != nil {
			s.log.LogAttrs(ctx, slog.LevelDebug, "local backend failed", slog.Any("err", lerr))
			markFailed(w.items)
			stands = false
		}
	}
	if !stands {
		s.recordFailed(req, w)
		return nil, status.Error(codes.Unavailable, unavailableMessage(err))
	}
	w.reqs = w.reqs[:0]
	w.out = w.out[:0]
	for k := range w.items {
		w.reqs = append(w.reqs, w.items[k].req)
		w.out = append(w.out, w.items[k].dec)
	}
	return s.response(req, w, backend.Admitted(w.reqs, w.out)), nil
}

// clientMessage is what a client is told of a backend error.
func clientMessage(err error) string {
	if !errors.Is(err, backend.ErrUnavailable) {
		return internalMessage
	}
	return unavailableMessage(err)
}

// internalMessage answers a backend error other than unavailability.
const internalMessage = "rate limit backend error"

// unavailableMessage is what a client is told when the backend is unavailable: a short kind,
// never the error's text (addresses, the store's own messages).
func unavailableMessage(err error) string {
	const msg = "rate limit backend unavailable"
	var ne net.Error
	switch {
	case errors.Is(err, errInflight):
		return "rls overloaded: too many requests in flight"
	case errors.Is(err, backend.ErrOverloaded):
		return msg + ": overloaded"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return msg + ": timeout"
	case errors.Is(err, context.Canceled):
		return msg + ": canceled"
	}
	return msg
}

// backendErrorInterval is how often backend errors other than unavailability are logged: the
// first at once, then at most one line a second summing up the others (logthrottle).
const backendErrorInterval = time.Second
