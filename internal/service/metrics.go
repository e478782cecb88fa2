package service

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// outcome is a descriptor decision's outcome, an index into outcomes: the values of
// rls_decisions_total's outcome label.
type outcome int

const (
	outcomeOK outcome = iota
	outcomeNearLimit
	outcomeOverLimit
	outcomeShadowMode
	outcomeFailureAllow
	outcomeFailureDeny
	outcomeFailureLocal
	outcomeFailureError
)

var outcomes = [...]string{"ok", "near_limit", "over_limit", "shadow_mode",
	"failure_allow", "failure_deny", "failure_local", "failure_error"}

// Metrics are the service's Prometheus metrics. Labels carry a domain and a rule from the loaded
// rules, never a request's values, except for rules with detailed_metric or value_to_metric:
// cardinality is bounded by the rule set.
type Metrics struct {
	decisions  *prometheus.CounterVec
	hits       *prometheus.CounterVec
	latency    prometheus.Histogram
	errors     *prometheus.CounterVec
	loads      *prometheus.CounterVec
	generation prometheus.Gauge
	lastLoad   prometheus.Gauge
	nearRatio  float64

	mu    sync.RWMutex
	rules map[*descriptors.Limit]*ruleCounters // for the rule set in force; reset on SetRules
}

// ruleCounters are one rule's counters, resolved once so the hot path does no label lookup.
type ruleCounters struct {
	outcome [len(outcomes)]prometheus.Counter
	hits    prometheus.Counter
}

// NewMetrics registers the service's metrics with reg. A descriptor whose admitted decision
// leaves it with at least nearLimitRatio of its burst used counts as near_limit (0 disables).
func NewMetrics(reg prometheus.Registerer, nearLimitRatio float64) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_decisions_total",
			Help: "Descriptor decisions by domain, rule and outcome (ok, near_limit, over_limit, shadow_mode, failure_allow, failure_deny, failure_local, failure_error).",
		}, []string{"domain", "rule", "outcome"}),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_hits_total",
			Help: "Hits (the sum of costs) asked of each rule.",
		}, []string{"domain", "rule"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rls_backend_request_duration_seconds",
			Help:    "Time of one backend decision (all descriptors of a request), errors included.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_backend_errors_total",
			Help: "Backend decisions that failed, by kind (timeout, unavailable, other).",
		}, []string{"kind"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_config_loads_total",
			Help: "Rule set loads by result (success, failure).",
		}, []string{"result"}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_generation",
			Help: "Generation of the rule set in force: 1 at start, +1 per successful reload.",
		}),
		lastLoad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_last_success_timestamp_seconds",
			Help: "Unix time of the last successful rule set load.",
		}),
		nearRatio: nearLimitRatio,
		rules:     map[*descriptors.Limit]*ruleCounters{},
	}
	for _, c := range []prometheus.Collector{m.decisions, m.hits, m.latency, m.errors, m.loads, m.generation, m.lastLoad} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"success", "failure"} {
		m.loads.WithLabelValues(r)
	}
	for _, k := range []string{"timeout", "unavailable", "other"} {
		m.errors.WithLabelValues(k)
	}
	return m, nil
}

// ConfigLoad records a rule set load.
func (m *Metrics) ConfigLoad(ok bool, generation uint64, at time.Time) {
	if m == nil {
		return
	}
	if !ok {
		m.loads.WithLabelValues("failure").Inc()
		return
	}
	m.loads.WithLabelValues("success").Inc()
	m.generation.Set(float64(generation))
	m.lastLoad.Set(float64(at.UnixNano()) / 1e9)
}

// ruleLabel names a limit in labels: its name, else the rule's path.
func ruleLabel(r *descriptors.Rule, l *descriptors.Limit) string {
	if l.Name != "" {
		return l.Name
	}
	return r.Path
}

// counters returns the counters of limit l of rule r (nil r: a request's override).
func (m *Metrics) counters(r *descriptors.Rule, l *descriptors.Limit, domain string) *ruleCounters {
	if r == nil {
		return m.resolve(domain, "override")
	}
	m.mu.RLock()
	c := m.rules[l]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	c = m.resolve(r.Domain, ruleLabel(r, l))
	m.mu.Lock()
	m.rules[l] = c
	m.mu.Unlock()
	return c
}

func (m *Metrics) resolve(domain, rule string) *ruleCounters {
	c := &ruleCounters{hits: m.hits.WithLabelValues(domain, rule)}
	for i, o := range outcomes {
		c.outcome[i] = m.decisions.WithLabelValues(domain, rule, o)
	}
	return c
}

// detailedLabel is the rule label of a detailed_metric or value_to_metric rule: the request's
// keys and values.
func detailedLabel(entries []descriptors.Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// reset forgets resolved counters; called when the rule set changes.
func (m *Metrics) reset() {
	if m == nil {
		return
	}
	m.mu.Lock()
	clear(m.rules)
	m.mu.Unlock()
}

// backendError counts a failed backend decision by kind.
func (m *Metrics) backendError(err error) {
	if m == nil {
		return
	}
	kind := "other"
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		kind = "timeout"
	case errors.Is(err, backend.ErrUnavailable):
		kind = "unavailable"
	}
	m.errors.WithLabelValues(kind).Inc()
}

// record counts descriptor i's decision, whose deciding backend request is k.
func (s *Service) record(d *ratelimitv3.RateLimitDescriptor, r *descriptors.Rule, w *work, k int) {
	m := s.metrics
	var c *ruleCounters
	if r != nil && (r.DetailedMetric || r.ValueToMetric) {
		es := make([]descriptors.Entry, len(d.Entries))
		for i, e := range d.Entries {
			es[i] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		c = m.resolve(r.Domain, detailedLabel(es))
	} else {
		domain := ""
		if r != nil {
			domain = r.Domain
		}
		c = m.counters(r, w.lims[k], domain)
	}
	c.hits.Add(float64(w.reqs[k].Cost))
	c.outcome[s.outcome(w, k)].Inc()
}

// outcome classifies backend request k's decision.
func (s *Service) outcome(w *work, k int) outcome {
	if w.failed {
		switch w.via[k] {
		case FailAllow:
			return outcomeFailureAllow
		case FailDeny:
			return outcomeFailureDeny
		case FailLocal:
			return outcomeFailureLocal
		}
		return outcomeFailureError
	}
	d := w.out[k]
	switch {
	case !d.Allowed && w.reqs[k].Mode == backend.Shadow:
		return outcomeShadowMode
	case !d.Allowed:
		return outcomeOverLimit
	}
	burst := w.reqs[k].Limit.Burst
	if s.metrics.nearRatio > 0 && burst > 0 && float64(burst-d.Remaining) >= s.metrics.nearRatio*float64(burst) {
		return outcomeNearLimit
	}
	return outcomeOK
}

// recordFailedRequest counts the descriptors of a request answered UNAVAILABLE.
func (s *Service) recordFailedRequest(req *rlsv3.RateLimitRequest, w *work) {
	if s.metrics == nil {
		return
	}
	for k := range w.reqs {
		w.via[k] = FailError
	}
	seen := -1
	for k := range w.reqs {
		if i := w.owner[k]; i != seen {
			seen = i
			s.record(req.Descriptors[i], w.rules[i], w, k)
		}
	}
}
