package descriptors

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// Limit is one configured limit of a rule.
type Limit struct {
	Name            string
	RequestsPerUnit uint32
	Unit            limit.Unit
	UnitMultiplier  uint32 // ≥ 1
	Burst           uint32
	Replaces        []string
	Timezone        string // fixed_window's timezone as the rule file names it, "" for UTC
	// KeyTag names the limit's state among its rule's limits: the backend key of a descriptor
	// is its domain and entries, '#', then KeyTag. It is "0" for a rule's singular rate_limit
	// (whatever its name: the key envoyproxy/ratelimit's format has always had), and for a
	// limit of a rate_limits list "n<len>:<name>" when it is named, else "p<seconds>s/<algorithm>"
	// with, for a fixed_window aligned otherwise than Period-long windows from the epoch, what
	// aligns it ("+<offset>s" or "/<calendar unit>@<zone>"). Never its rate or burst, nor its
	// place in the list: an edit that changes a limit's rate keeps its state (re-expressed), and
	// one that adds, removes or reorders a rule's limits moves no state from one to another.
	// Computed once at load; "" for a limit not loaded from a rule (an override's).
	KeyTag string
	// Spec is the limit as it is decided, whatever its algorithm (Spec.Algorithm); Spec.Overdraft
	// is the rule's overdraft: true.
	Spec limit.Limit
}

// NewLimit builds a Limit, defaulting burst to requestsPerUnit and multiplier to 1 when 0. A
// period too long for a time.Duration (a large multiplier of a long unit) saturates at the
// longest whole number of seconds one holds, which Spec.Validate rejects as longer than
// limit.MaxTolerance: it never wraps round to a short period.
func NewLimit(name string, requestsPerUnit uint32, unit limit.Unit, multiplier, burst uint32) Limit {
	if multiplier == 0 {
		multiplier = 1
	}
	if burst == 0 {
		burst = requestsPerUnit
	}
	const longest = math.MaxInt64 / int64(time.Second)
	secs := int64(longest)
	if s := unit.Seconds(); s == 0 || int64(multiplier) <= longest/s {
		secs = s * int64(multiplier)
	}
	return Limit{
		Name: name, RequestsPerUnit: requestsPerUnit, Unit: unit, UnitMultiplier: multiplier, Burst: burst,
		Spec: limit.Limit{
			Rate:   int64(requestsPerUnit),
			Period: time.Duration(secs) * time.Second,
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

// Entry is one key/value entry of a request descriptor. In JSON (the HTTP endpoints' answers)
// it is {"key": ..., "value": ...}, as in the descriptors /json takes.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

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

// smallSet is the size up to which a level's keys, a key's exact values and its wildcards are
// searched in a slice rather than through a map or an index: faster there, and much smaller.
const smallSet = 8

// level is one level of the tree: the nodes of each key.
type level struct {
	keys  []keyNodes
	byKey map[string]int32 // key → index in keys; nil when there are at most smallSet keys
}

// keyNodes are the nodes of one key of a level. Exact values are found by a map (or, when few,
// a slice), wildcards through an index of their literal prefix and suffix (or, when few, in
// file order), so the cost of a value does not grow with the wildcards it does not match.
type keyNodes struct {
	key      string
	def      *node
	exact    []exactNode      // when at most smallSet exact values
	exactMap map[string]*node // else
	wild     []wildNode       // in file order
	wildIdx  *wildIndex       // nil when at most smallSet wildcards
}

type exactNode struct {
	value string
	node  *node
}

// wildNode is a value with '*' in it: pattern[:pre] is its literal prefix, the last suf bytes
// its literal suffix.
type wildNode struct {
	pattern  string
	pre, suf int
	node     *node
}

// wildIndex groups the wildcards of a key by their literal prefix and suffix. A value can only
// match a wildcard whose prefix and suffix it starts and ends with, so a lookup tries each
// (prefix length, suffix length) pair that occurs, and within a group only the patterns whose
// middle parts differ.
type wildIndex struct {
	lens   []wildLens           // the pairs that occur, by prefix length
	groups map[wildKey][2]int32 // → cands[start:end]
	cands  []int32              // indexes into wild, by group, in file order within one
}

type wildLens struct{ pre, suf int }

type wildKey struct{ pre, suf string }

type node struct {
	rule     *Rule // nil: no limit (allow-listed)
	children *level
}

func newWildNode(pattern string, nd *node) wildNode {
	return wildNode{pattern: pattern, pre: strings.IndexByte(pattern, '*'), suf: len(pattern) - 1 - strings.LastIndexByte(pattern, '*'), node: nd}
}

// match reports whether v matches the pattern: its prefix, its suffix, and between them each
// middle part in order, leftmost first.
func (w *wildNode) match(v string) bool {
	if len(v) < w.pre+w.suf || v[:w.pre] != w.pattern[:w.pre] || v[len(v)-w.suf:] != w.pattern[len(w.pattern)-w.suf:] {
		return false
	}
	return w.matchMiddle(v[w.pre : len(v)-w.suf])
}

// matchMiddle matches the pattern's middle parts (between its first and last '*') in v.
func (w *wildNode) matchMiddle(v string) bool {
	if w.pre+w.suf+1 >= len(w.pattern) {
		return true // one '*', or "**" with nothing between
	}
	mid := w.pattern[w.pre+1 : len(w.pattern)-w.suf-1]
	for mid != "" {
		seg := mid
		if i := strings.IndexByte(mid, '*'); i >= 0 {
			seg, mid = mid[:i], mid[i+1:]
		} else {
			mid = ""
		}
		if seg == "" {
			continue
		}
		i := strings.Index(v, seg)
		if i < 0 {
			return false
		}
		v = v[i+len(seg):]
	}
	return true
}

// index makes lv.byKey when the level has many keys.
func (lv *level) index() {
	if len(lv.keys) <= smallSet {
		return
	}
	lv.byKey = make(map[string]int32, len(lv.keys))
	for i := range lv.keys {
		lv.byKey[lv.keys[i].key] = int32(i)
	}
}

// lookup returns key's nodes, or nil. A nil level has none.
func (lv *level) lookup(key string) *keyNodes {
	if lv == nil {
		return nil
	}
	if lv.byKey != nil {
		if i, ok := lv.byKey[key]; ok {
			return &lv.keys[i]
		}
		return nil
	}
	for i := range lv.keys {
		if lv.keys[i].key == key {
			return &lv.keys[i]
		}
	}
	return nil
}

// setExact keeps the exact values of m, in a slice when few.
func (kn *keyNodes) setExact(m map[string]*node) {
	if len(m) > smallSet {
		kn.exactMap = m
		return
	}
	for v, nd := range m {
		kn.exact = append(kn.exact, exactNode{v, nd})
	}
}

// indexWild makes kn.wildIdx when the key has many wildcards.
func (kn *keyNodes) indexWild() {
	kn.wild = slices.Clip(kn.wild)
	if len(kn.wild) <= smallSet {
		return
	}
	type entry struct {
		k wildKey
		i int32
	}
	es := make([]entry, len(kn.wild))
	for i := range kn.wild {
		w := &kn.wild[i]
		es[i] = entry{wildKey{w.pattern[:w.pre], w.pattern[len(w.pattern)-w.suf:]}, int32(i)}
	}
	// Grouped, and in file order within a group (the sort is stable and es is in file order).
	slices.SortStableFunc(es, func(a, b entry) int {
		if c := strings.Compare(a.k.pre, b.k.pre); c != 0 {
			return c
		}
		return strings.Compare(a.k.suf, b.k.suf)
	})
	idx := &wildIndex{groups: map[wildKey][2]int32{}, cands: make([]int32, len(es))}
	lens := map[wildLens]bool{}
	for i, e := range es {
		idx.cands[i] = e.i
		g, ok := idx.groups[e.k]
		if !ok {
			g[0] = int32(i)
			lens[wildLens{len(e.k.pre), len(e.k.suf)}] = true
		}
		g[1] = int32(i + 1)
		idx.groups[e.k] = g
	}
	for l := range lens {
		idx.lens = append(idx.lens, l)
	}
	slices.SortFunc(idx.lens, func(a, b wildLens) int {
		if a.pre != b.pre {
			return a.pre - b.pre
		}
		return a.suf - b.suf
	})
	kn.wildIdx = idx
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
		nd, _ := lv.lookup(entries[i].Key).find(entries[i].Value)
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
	if kn.exactMap != nil {
		if nd := kn.exactMap[value]; nd != nil {
			return nd, matchExact
		}
	} else {
		for i := range kn.exact {
			if kn.exact[i].value == value {
				return kn.exact[i].node, matchExact
			}
		}
	}
	if i := kn.findWild(value); i >= 0 {
		return kn.wild[i].node, i
	}
	return kn.def, matchDefault
}

// findWild returns the index of the first wildcard, in file order, that value matches, or -1.
func (kn *keyNodes) findWild(value string) int {
	idx := kn.wildIdx
	if idx == nil {
		for i := range kn.wild {
			if kn.wild[i].match(value) {
				return i
			}
		}
		return -1
	}
	best := -1
	for _, l := range idx.lens {
		if l.pre > len(value) {
			break
		}
		if l.pre+l.suf > len(value) {
			continue
		}
		g, ok := idx.groups[wildKey{value[:l.pre], value[len(value)-l.suf:]}]
		if !ok {
			continue
		}
		mid := value[l.pre : len(value)-l.suf]
		for _, c := range idx.cands[g[0]:g[1]] {
			if best >= 0 && int(c) >= best {
				break
			}
			if kn.wild[c].matchMiddle(mid) {
				best = int(c)
				break
			}
		}
	}
	return best
}

// HasDomain reports whether the set has rules for domain.
func (rs *RuleSet) HasDomain(domain string) bool {
	_, ok := rs.domains[domain]
	return ok
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
		kn := lv.lookup(e.Key)
		nd, how := kn.find(e.Value)
		via := e.Key
		switch {
		case how == matchExact:
			via += "=" + e.Value
		case how >= 0:
			via += "=" + kn.wild[how].pattern
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
