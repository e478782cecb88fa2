package descriptors

import (
	"fmt"
	"strings"
	"time"

	"github.com/rls-project/rls/internal/backend"
)

// Unit is a rate-limit unit of time.
type Unit uint8

// Units, numbered as envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
const (
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Month
	Year
	Week
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "month", "year", "week"}

var unitSeconds = [...]int64{0, 1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 7 * 86400}

// ParseUnit parses a unit name, in any case.
func ParseUnit(s string) (Unit, bool) {
	for u, name := range unitNames {
		if u != int(UnitUnknown) && strings.EqualFold(s, name) {
			return Unit(u), true
		}
	}
	return UnitUnknown, false
}

func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "unknown"
}

// Seconds is the unit's length: a month is 30 days, a year 365 days, as in the reference service.
func (u Unit) Seconds() int64 {
	if int(u) < len(unitSeconds) {
		return unitSeconds[u]
	}
	return 0
}

// Limit is one configured limit of a rule.
type Limit struct {
	Name            string
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32 // ≥ 1
	Burst           uint32
	Replaces        []string
	// GCRA is the limit as the backend decides it.
	GCRA backend.Limit
}

// NewLimit builds a Limit, defaulting burst to requestsPerUnit and multiplier to 1 when 0.
func NewLimit(name string, requestsPerUnit uint32, unit Unit, multiplier, burst uint32) Limit {
	if multiplier == 0 {
		multiplier = 1
	}
	if burst == 0 {
		burst = requestsPerUnit
	}
	return Limit{
		Name: name, RequestsPerUnit: requestsPerUnit, Unit: unit, UnitMultiplier: multiplier, Burst: burst,
		GCRA: backend.Limit{
			Rate:   int64(requestsPerUnit),
			Period: time.Duration(unit.Seconds()*int64(multiplier)) * time.Second,
			Burst:  int64(burst),
		},
	}
}

// Rule is what a request descriptor matched: a node of the tree with its limits and options.
type Rule struct {
	Domain string
	// Path names the matched node: its keys and values from the root, "key=value/key2".
	Path string
	// Limits must all admit a request. Empty for an unlimited rule.
	Limits    []Limit
	Unlimited bool
	// Options, as in api.Descriptor.
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	Metadata       map[string]any
	FailureMode    FailureMode // FailureDefault: the server's
	// Share holds, per entry depth, the wildcard pattern whose matching values share one bucket
	// (share_threshold), or "". Nil when no level shares.
	Share []string
	// Source is where the rule is defined: "file:line".
	Source string
}

// Entry is one key/value entry of a request descriptor.
type Entry struct{ Key, Value string }

// RuleSet is an immutable set of loaded rules. It is safe for concurrent use.
type RuleSet struct {
	domains map[string]*level
	// Files lists the files the set was loaded from, in load order.
	Files []string
	// Domains lists the domains in the set, sorted, with the file each came from.
	Domains []DomainInfo
}

// DomainInfo describes one loaded domain.
type DomainInfo struct {
	Name  string
	File  string
	Rules []*Rule // every node with a limit or an allow-list, depth first in file order
}

type level struct {
	byKey map[string]*keyNodes
}

type keyNodes struct {
	exact map[string]*node
	wild  []wildNode
	def   *node
}

type wildNode struct {
	segs []string // the pattern split at '*'
	node *node
}

type node struct {
	rule     *Rule // nil: no limit (allow-listed)
	children *level
}

// Match returns the rule that entries match in domain, or nil when none does (unknown domain,
// a miss, a request deeper than the tree, or a node without a limit). It allocates nothing.
func (rs *RuleSet) Match(domain string, entries []Entry) *Rule {
	if rs == nil || len(entries) == 0 {
		return nil
	}
	lv := rs.domains[domain]
	for i := range entries {
		if lv == nil {
			return nil
		}
		nd, _ := lv.byKey[entries[i].Key].find(entries[i].Value)
		if nd == nil {
			return nil
		}
		if i == len(entries)-1 {
			return nd.rule
		}
		lv = nd.children
	}
	return nil
}

// How find matched: exactly, by the key's default, or (≥ 0) by that wildcard of keyNodes.wild.
const (
	matchExact   = -1
	matchDefault = -2
)

// find returns the node that value matches among the nodes of one key, in the reference's
// order: the exact value, else the first wildcard in file order, else the key's default. A nil
// kn (an unknown key) matches nothing.
func (kn *keyNodes) find(value string) (*node, int) {
	if kn == nil {
		return nil, matchDefault
	}
	if nd := kn.exact[value]; nd != nil {
		return nd, matchExact
	}
	for i, w := range kn.wild {
		if globMatch(w.segs, value) {
			return w.node, i
		}
	}
	return kn.def, matchDefault
}

// HasDomain reports whether the set has rules for domain.
func (rs *RuleSet) HasDomain(domain string) bool {
	_, ok := rs.domains[domain]
	return ok
}

// globMatch matches v against a pattern split at '*' (segs has at least two parts).
func globMatch(segs []string, v string) bool {
	first, last := segs[0], segs[len(segs)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	v = v[len(first) : len(v)-len(last)]
	for _, s := range segs[1 : len(segs)-1] {
		i := strings.Index(v, s)
		if i < 0 {
			return false
		}
		v = v[i+len(s):]
	}
	return true
}

// Explain matches like Match and also says, when no rule applies, why: the domain is unknown,
// an entry matched no node (naming it), the request is deeper than the tree, or the matched node
// has no limit (it allow-lists). It allocates; it is for debugging, not the hot path.
func (rs *RuleSet) Explain(domain string, entries []Entry) (*Rule, string) {
	if len(entries) == 0 {
		return nil, "the descriptor has no entries"
	}
	lv, ok := rs.domains[domain]
	if !ok {
		return nil, fmt.Sprintf("domain %q has no rules", domain)
	}
	path := ""
	for i, e := range entries {
		if lv == nil {
			return nil, fmt.Sprintf("the request is deeper than the rules: %s has no children to match entry %d (%s)", path, i, e.Key)
		}
		kn := lv.byKey[e.Key]
		nd, how := kn.find(e.Value)
		via := e.Key
		switch {
		case how == matchExact:
			via += "=" + e.Value
		case how >= 0:
			via += "=" + strings.Join(kn.wild[how].segs, "*")
		}
		if nd == nil {
			where := "at the top level"
			if path != "" {
				where = "under " + path
			}
			return nil, fmt.Sprintf("no rule matches entry %d (key %q) %s", i, e.Key, where)
		}
		if path != "" {
			path += "/"
		}
		path += via
		if i == len(entries)-1 {
			if nd.rule == nil {
				return nil, fmt.Sprintf("%s has no rate_limit: allow-listed", path)
			}
			return nd.rule, ""
		}
		lv = nd.children
	}
	return nil, ""
}
