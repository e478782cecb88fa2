package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
)

// slotOps counts the requests of limits on requests in flight (a rule's concurrency), by domain,
// rule (as rls_decisions_total names it) and op: acquired (a slot held, or renewed), refused
// (an acquire denied: N held), released (a release decided; releasing a slot not held does
// nothing and counts here too). Labels are bounded by the rule set.
func newSlotOps() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_slot_operations_total",
		Help: "Requests of concurrency limits by domain, rule and op: acquired (a slot held or renewed), refused (max_in_flight held), released (a release decided, whether or not it named a slot held).",
	}, []string{"domain", "rule", "op"})
}

// countSlots counts the slot requests of a decided request in rls_slot_operations_total.
func (m *Metrics) countSlots(w *work, admitted bool) {
	if m == nil || m.slotOps == nil {
		return
	}
	for k := range w.items {
		it := &w.items[k]
		if it.req.Limit.Algorithm != limit.Concurrency || it.via != descriptors.FailureDefault {
			continue
		}
		r := w.descs[it.desc].rule
		if r == nil {
			continue
		}
		op := ""
		switch {
		case it.req.Refund:
			if admitted {
				op = "released"
			}
		case it.req.Cost <= 0:
		case !it.dec.Allowed:
			op = "refused"
		case admitted:
			op = "acquired"
		}
		if op != "" {
			m.slotOps.WithLabelValues(r.Domain, ruleLabel(r, it.limit), op).Inc()
		}
	}
}
