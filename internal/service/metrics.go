package service

import (
	"context"
	"errors"
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
// rules, never a request's values, except for rules with detailed_metric or value_to_metric,
// whose values are capped per rule (Options.DetailedMetricValues): cardinality is bounded by the
// rule set and that cap.
type Metrics struct {
	decisions  *prometheus.CounterVec
	hits       *prometheus.CounterVec
	latency    prometheus.Histogram
	errors     *prometheus.CounterVec
	overload   prometheus.Counter
	inflight   prometheus.Counter
	newKeys    prometheus.Counter
	loads      *prometheus.CounterVec
	generation prometheus.Gauge
	lastLoad   prometheus.Gauge
	lastOK     prometheus.Gauge
	algorithms *prometheus.GaugeVec
	slotOps    *prometheus.CounterVec // slotmetrics.go
	nearRatio  float64

	mu    sync.RWMutex
	rules map[*descriptors.Limit]*ruleCounters // for the rule set in force; reset on SetRules
	// detailed holds the values seen per detailed_metric rule, by domain and path; kept across
	// reloads so that a reload does not lift the cap.
	detailed map[ruleID]*detailedValues
}

// ruleID names a rule across reloads.
type ruleID struct{ domain, path string }

// detailedValues are the counters of one detailed_metric rule's values, at most max of them.
type detailedValues struct {
	mu       sync.Mutex
	seen     map[string]*ruleCounters
	overflow *ruleCounters // nil until the first value past the cap
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
			Help: "Backend decisions that failed, by kind: timeout and unavailable (answered by the failure mode), canceled (the caller left first), other (answered INTERNAL). Overload sheds are counted apart.",
		}, []string{"kind"}),
		overload: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_overload_shed_total",
			Help: "Requests shed because this process could not decide them in time with the backend healthy; answered by the failure mode.",
		}),
		inflight: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_inflight_shed_total",
			Help: "Requests shed because the requests already in flight held --max-inflight-bytes; answered by the failure mode.",
		}),
		newKeys: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_new_keys_refused_total",
			Help: "Requests refused RESOURCE_EXHAUSTED because their caller created more than --max-new-keys-per-caller new keys a second.",
		}),
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
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_config_last_load_successful",
			Help: "1 unless the last rule set load failed (the rules in force stay those loaded before it): 0 from a failed load until the next successful one.",
		}),
		algorithms: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rls_rule_algorithm",
			Help: "The limits in force by domain, rule (as rls_decisions_total names it) and algorithm (gcra, fixed_window, sliding_window, sliding_log, concurrency): how many. Join on domain and rule to break decisions down by algorithm.",
		}, []string{"domain", "rule", "algorithm"}),
		slotOps:   newSlotOps(),
		nearRatio: nearLimitRatio,
		rules:     map[*descriptors.Limit]*ruleCounters{},
		detailed:  map[ruleID]*detailedValues{},
	}
	for _, c := range []prometheus.Collector{m.decisions, m.hits, m.latency, m.errors, m.overload, m.inflight, m.newKeys, m.loads, m.generation, m.lastLoad, m.lastOK, m.algorithms, m.slotOps} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"success", "failure"} {
		m.loads.WithLabelValues(r)
	}
	m.lastOK.Set(1)
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
		m.lastOK.Set(0)
		return
	}
	m.loads.WithLabelValues("success").Inc()
	m.lastOK.Set(1)
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

// appendDetailedLabel appends the rule label of a detailed_metric or value_to_metric rule: the
// request's keys and values.
func appendDetailedLabel(b []byte, entries []*ratelimitv3.RateLimitDescriptor_Entry) []byte {
	for i, e := range entries {
		if i > 0 {
			b = append(b, '/')
		}
		b = append(b, e.GetKey()...)
		b = append(b, '=')
		b = append(b, e.GetValue()...)
	}
	return b
}

// overflowSuffix ends the rule label under which a detailed_metric rule's values past the cap
// are counted.
const overflowSuffix = "/_overflow_"

// detailedCounters returns the counters of one value (label) of a detailed_metric rule r: its
// own while the rule has fewer than max values, else the rule's overflow counters. first reports
// the rule's first overflow.
func (m *Metrics) detailedCounters(r *descriptors.Rule, label []byte, max int) (c *ruleCounters, first bool) {
	id := ruleID{r.Domain, r.Path}
	m.mu.RLock()
	dv := m.detailed[id]
	m.mu.RUnlock()
	if dv == nil {
		m.mu.Lock()
		if dv = m.detailed[id]; dv == nil {
			dv = &detailedValues{seen: map[string]*ruleCounters{}}
			m.detailed[id] = dv
		}
		m.mu.Unlock()
	}
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if c := dv.seen[string(label)]; c != nil {
		return c, false
	}
	if len(dv.seen) < max {
		c := m.resolve(r.Domain, string(label))
		dv.seen[string(label)] = c
		return c, false
	}
	if dv.overflow == nil {
		dv.overflow = m.resolve(r.Domain, r.Path+overflowSuffix)
		first = true
	}
	return dv.overflow, first
}

// reset forgets resolved counters and describes the limits of rs (nil: none) in
// rls_rule_algorithm; called when the rule set changes.
func (m *Metrics) reset(rs *descriptors.RuleSet) {
	if m == nil {
		return
	}
	m.mu.Lock()
	clear(m.rules)
	m.mu.Unlock()
	m.algorithms.Reset()
	if rs == nil {
		return
	}
	for _, d := range rs.Domains {
		for _, r := range d.Rules {
			for i := range r.Limits {
				l := &r.Limits[i]
				m.algorithms.WithLabelValues(r.Domain, ruleLabel(r, l), l.Spec.Algorithm.String()).Inc()
			}
		}
	}
}

// backendError counts a failed backend decision by kind.
func (m *Metrics) backendError(err error) {
	if m == nil {
		return
	}
	kind := "other"
	switch {
	case !errors.Is(err, backend.ErrUnavailable):
	case errors.Is(err, context.Canceled):
		// The caller left before the backend answered (under overload, mostly because its
		// deadline passed while the call waited in this process): not the backend failing.
		kind = "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		kind = "timeout"
	default:
		kind = "unavailable"
	}
	m.errors.WithLabelValues(kind).Inc()
}

// overloadShed counts a request shed by overload.
func (m *Metrics) overloadShed() {
	if m == nil {
		return
	}
	m.overload.Inc()
}

// inflightShed counts a request shed because the requests in flight held their bound.
func (m *Metrics) inflightShed() {
	if m == nil {
		return
	}
	m.inflight.Inc()
}

// record counts the decision of descriptor d, matched to r, whose deciding item is it.
func (s *Service) record(domain string, d *ratelimitv3.RateLimitDescriptor, r *descriptors.Rule, w *work, it *item) {
	m := s.metrics
	var c *ruleCounters
	if r != nil && (r.DetailedMetric || r.ValueToMetric) {
		w.label = appendDetailedLabel(w.label[:0], d.Entries)
		var first bool
		if c, first = m.detailedCounters(r, w.label, s.detailedMax); first {
			s.log.Warn("detailed_metric: more distinct values than the cap; further values count under the overflow label",
				"domain", r.Domain, "rule", r.Path, "cap", s.detailedMax, "label", r.Path+overflowSuffix)
		}
	} else {
		ruleDomain := ""
		if r != nil {
			ruleDomain = r.Domain
		}
		c = m.counters(r, it.limit, ruleDomain)
	}
	o := s.outcome(it)
	c.hits.Add(float64(it.req.Cost))
	c.outcome[o].Inc()
	if s.stats != nil {
		s.countStats(domain, d, r, it, o)
	}
}

// outcome classifies an item's decision.
func (s *Service) outcome(it *item) outcome {
	switch it.via {
	case FailAllow:
		return outcomeFailureAllow
	case FailDeny:
		return outcomeFailureDeny
	case FailLocal:
		return outcomeFailureLocal
	case FailError:
		return outcomeFailureError
	}
	d := it.dec
	switch {
	case !d.Allowed && it.req.Mode == backend.Shadow:
		return outcomeShadowMode
	case !d.Allowed:
		return outcomeOverLimit
	}
	burst := it.req.Limit.Burst
	if s.metrics.nearRatio > 0 && burst > 0 && float64(burst-d.Remaining) >= s.metrics.nearRatio*float64(burst) {
		return outcomeNearLimit
	}
	return outcomeOK
}

// recordFailed counts the descriptors of a request answered UNAVAILABLE, by the first item of
// each: failurePolicy or markFailed has marked every item.
func (s *Service) recordFailed(req *rlsv3.RateLimitRequest, w *work) {
	if s.metrics == nil {
		return
	}
	seen := -1
	for k := range w.items {
		if i := w.items[k].desc; i != seen {
			seen = i
			s.record(req.Domain, req.Descriptors[i], w.descs[i].rule, w, &w.items[k])
		}
	}
}
