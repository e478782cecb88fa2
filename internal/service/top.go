package service

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/top"
)

// observeTop tells the top talkers each descriptor's decision, by the limit that answers for
// it (limiting), as the metrics count it. Descriptors no rule matched (a request's own
// override among them) are not counted: the top talkers are kept per rule; nor are hits given
// back (is_negative_hits) or a hits_addend of 0.
func (s *Service) observeTop(req *rlsv3.RateLimitRequest, w *work) {
	now := time.Now()
	var o top.Observation
	o.Domain = req.Domain
	k := 0
	for i := range req.Descriptors {
		var best int
		if best, k = limiting(w.items, i, k); best < 0 {
			continue
		}
		r := w.descs[i].rule
		if r == nil {
			continue
		}
		it := &w.items[best]
		if it.req.Refund || it.req.Cost <= 0 {
			continue // hits given back, or none asked for
		}
		o.Rule, o.Key, o.Cost = r.Path, it.req.Key, it.req.Cost
		o.Denied = !it.dec.Allowed // in shadow and quota modes too: what would be denied
		o.Remaining, o.Limit = it.dec.Remaining, it.req.Limit.Burst
		s.top.Observe(now, &o)
	}
}
