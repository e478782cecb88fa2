package service

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/internal/descriptors"
)

// Stats counts descriptor decisions in a scheme other than rls's own metrics: envoyproxy/ratelimit's
// statsd names (internal/statsd). Count runs on the decision path, once per descriptor that a limit
// decided: it must neither block nor keep d.
type Stats interface {
	Count(d StatsDecision)
}

// StatsDecision is one descriptor's decision, as envoyproxy/ratelimit's counters see it.
type StatsDecision struct {
	Domain  string                                   // the request's
	Rule    *descriptors.Rule                        // the rule matched; nil: the request's own override
	Entries []*ratelimitv3.RateLimitDescriptor_Entry // the request descriptor's
	Hits    uint64                                   // the cost asked
	Outcome StatsOutcome
}

// StatsOutcome is a decision's outcome in envoyproxy/ratelimit's terms.
type StatsOutcome uint8

const (
	StatsWithin StatsOutcome = iota // admitted, below the near-limit ratio
	StatsNear                       // admitted, at or past the near-limit ratio
	StatsOver                       // denied
	StatsShadow                     // denied, answered OK in shadow mode
)

// countStats tells s.stats of a decision; one the failure mode answered is not told: the
// backend's error is counted apart, as envoyproxy/ratelimit counts a Redis error.
func (s *Service) countStats(domain string, d *ratelimitv3.RateLimitDescriptor, r *descriptors.Rule, it *item, o outcome) {
	var so StatsOutcome
	switch o {
	case outcomeOK:
		so = StatsWithin
	case outcomeNearLimit:
		so = StatsNear
	case outcomeOverLimit:
		so = StatsOver
	case outcomeShadowMode:
		so = StatsShadow
	default:
		return
	}
	s.stats.Count(StatsDecision{Domain: domain, Rule: r, Entries: d.Entries, Hits: uint64(max(it.req.Cost, 0)), Outcome: so})
}
