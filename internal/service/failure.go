package service

import (
	"context"
	"time"

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

// failureModeOf returns the failure mode for descriptor i: its rule's, else the default.
func (s *Service) failureModeOf(r *descriptors.Rule) FailureMode {
	if r != nil && r.FailureMode != descriptors.FailureDefault {
		return r.FailureMode
	}
	if s.failure == descriptors.FailureDefault {
		return FailError
	}
	return s.failure
}

// decideFailed answers a batch whose backend failed, following each descriptor's failure mode.
// It reports ok=false when any descriptor's mode is FailError: the whole request then fails.
func (s *Service) decideFailed(ctx context.Context, w *work) (admitted, ok bool) {
	local := w.local[:0]
	denied := false
	w.via = w.via[:0]
	for k := range w.reqs {
		mode := s.failureModeOf(w.rules[w.owner[k]])
		w.via = append(w.via, mode)
		switch mode {
		case FailError:
			return false, false
		case FailAllow:
			w.out[k] = backend.Decision{Allowed: true}
		case FailDeny:
			retry := time.Duration(0)
			if l := w.reqs[k].Limit; l.Rate > 0 {
				retry = l.Period / time.Duration(l.Rate)
			}
			w.out[k] = backend.Decision{RetryAfter: max(retry, time.Second), ResetAfter: w.reqs[k].Limit.Period}
			denied = denied || w.reqs[k].Mode == backend.Enforce
		case FailLocal:
			local = append(local, k)
		}
	}
	w.local = local
	if len(local) > 0 {
		if s.localBackend == nil {
			return false, false
		}
		reqs := w.localReqs[:0]
		for _, k := range local {
			r := w.reqs[k]
			if denied {
				r.Cost = 0 // the request is denied anyway: check, don't charge
			}
			reqs = append(reqs, r)
		}
		w.localReqs = reqs
		out := append(w.localOut[:0], make([]backend.Decision, len(reqs))...)
		w.localOut = out
		if _, err := s.localBackend.Decide(ctx, reqs, out); err != nil {
			return false, false
		}
		for i, k := range local {
			w.out[k] = out[i]
		}
	}
	return backend.Admitted(w.reqs, w.out), true
}
