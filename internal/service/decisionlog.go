package service

import (
	"context"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
)

// logDecisions gives the decision log (Options.DecisionLog) the descriptors of a decided request
// it asks for: one record each, from the limit that answered for it (limiting), as resp says.
// Only descriptors a rule matched and the backend decided are told: not overrides, nor answers
// of a failure mode. A request the log wants nothing of costs a look-up per descriptor.
func (s *Service) logDecisions(ctx context.Context, req *rlsv3.RateLimitRequest, w *work, resp *rlsv3.RateLimitResponse) {
	if s.decisions.DenialsOnly() && !anyDenied(w.items) {
		return
	}
	var now time.Time
	var caller string
	k := 0
	for i, d := range req.Descriptors {
		var best int
		if best, k = limiting(w.items, i, k); best < 0 {
			continue
		}
		it := &w.items[best]
		r := w.descs[i].rule
		if r == nil || it.via != descriptors.FailureDefault {
			continue
		}
		denied := !it.dec.Allowed
		ok, sample := s.decisions.Wants(req.Domain, r.Path, denied)
		if !ok {
			continue
		}
		if now.IsZero() {
			now, caller = time.Now(), callerOf(ctx)
		}
		st := resp.Statuses[i]
		rec := decisionlog.Record{
			Time: now, Domain: req.Domain, HitsAddend: it.req.Cost, Refund: it.req.Refund,
			Rule: r.Path, Limit: it.limit.Name, Code: st.Code.String(),
			Shadow:    denied && it.req.Mode == backend.Shadow,
			Remaining: max(it.dec.Remaining, 0), ResetSeconds: st.GetDurationUntilReset().AsDuration().Seconds(),
			Caller: caller, Sample: sample,
			Descriptor: make([]descriptors.Entry, len(d.Entries)),
		}
		for j, e := range d.Entries {
			rec.Descriptor[j] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		s.decisions.Write(&rec)
	}
}

// anyDenied reports whether a limit denied one of items.
func anyDenied(items []item) bool {
	for k := range items {
		if !items[k].dec.Allowed {
			return true
		}
	}
	return false
}
