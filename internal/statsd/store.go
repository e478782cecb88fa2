package statsd

import (
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/internal/service"
)

// The counters of a series, in envoyproxy/ratelimit's order and names.
const (
	totalHits = iota
	overLimit
	nearLimit
	withinLimit
	shadowMode
	nCounters
)

var counterNames = [nCounters]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// OverflowKey ends the name of the series that counts a detailed_metric or value_to_metric
// rule's values past the cap; alone, it names the series that counts past the cap of series.
const OverflowKey = "_overflow_"

// DefaultMaxSeries is the default bound on the series of a Store.
const DefaultMaxSeries = 10000

// Series is one stats key's counters.
type Series struct {
	Key string // "domain.key_value.key", sanitised as envoyproxy/ratelimit does
	c   [nCounters]atomic.Uint64
}

func (s *Series) add(hits uint64, o service.StatsOutcome) {
	s.c[totalHits].Add(hits)
	switch o {
	case service.StatsWithin:
		s.c[withinLimit].Add(hits)
	case service.StatsNear:
		s.c[withinLimit].Add(hits)
		s.c[nearLimit].Add(hits)
	case service.StatsOver:
		s.c[overLimit].Add(hits)
	case service.StatsShadow:
		s.c[overLimit].Add(hits)
		s.c[shadowMode].Add(hits)
	}
}

// ruleKey names a rule across reloads.
type ruleKey struct{ domain, path string }

// Store holds envoyproxy/ratelimit's per-rule counters. It is safe for concurrent use.
type Store struct {
	maxValues int // per detailed rule
	maxSeries int

	mu       sync.RWMutex
	byRule   map[ruleKey]*Series // rules without request values in their key
	byName   map[string]*Series  // every series, by the key it was built as (before sanitising)
	values   map[ruleKey]int     // series per detailed rule
	list     []*Series           // every series, in creation order
	overflow *Series             // past maxSeries
	bufs     sync.Pool
}

// NewStore returns a Store that keeps at most maxValues series per detailed_metric or
// value_to_metric rule (past it, the rule's overflow series) and maxSeries in all (past it, one
// overflow series); 0 takes service.DefaultDetailedMetricValues and DefaultMaxSeries.
func NewStore(maxValues, maxSeries int) *Store {
	if maxValues <= 0 {
		maxValues = service.DefaultDetailedMetricValues
	}
	if maxSeries <= 0 {
		maxSeries = DefaultMaxSeries
	}
	st := &Store{maxValues: maxValues, maxSeries: maxSeries, byRule: map[ruleKey]*Series{},
		byName: map[string]*Series{}, values: map[ruleKey]int{}}
	st.bufs.New = func() any { b := make([]byte, 0, 128); return &b }
	return st
}

// Count counts one descriptor decision (service.Stats).
func (st *Store) Count(d service.StatsDecision) {
	r := d.Rule
	if r != nil && !r.DetailedMetric && !r.ValueToMetric {
		k := ruleKey{r.Domain, r.Path}
		st.mu.RLock()
		s := st.byRule[k]
		st.mu.RUnlock()
		if s == nil {
			s = st.ruleSeries(k, d.Entries)
		}
		s.add(d.Hits, d.Outcome)
		return
	}
	bp := st.bufs.Get().(*[]byte)
	b := requestKey((*bp)[:0], d)
	st.mu.RLock()
	s := st.byName[string(b)]
	st.mu.RUnlock()
	if s == nil {
		s = st.requestSeries(b, d)
	}
	*bp = b
	st.bufs.Put(bp)
	s.add(d.Hits, d.Outcome)
}

// ruleSeries finds or makes the series of a rule whose key holds no request value.
func (st *Store) ruleSeries(k ruleKey, entries []*ratelimitv3.RateLimitDescriptor_Entry) *Series {
	name := string(ruleName(nil, k.domain, k.path, entries))
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := st.byRule[k]; s != nil {
		return s
	}
	s := st.byName[name]
	if s == nil {
		s = st.newSeriesLocked(name)
	}
	if s != st.overflow {
		st.byRule[k] = s
	}
	return s
}

// requestSeries finds or makes the series of key b, built from a request's values.
func (st *Store) requestSeries(b []byte, d service.StatsDecision) *Series {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s := st.byName[string(b)]; s != nil {
		return s
	}
	if r := d.Rule; r != nil {
		k := ruleKey{r.Domain, r.Path}
		if st.values[k] >= st.maxValues {
			name := string(ruleName(nil, r.Domain, r.Path, d.Entries)) + "." + OverflowKey
			if s := st.byName[name]; s != nil {
				return s
			}
			return st.newSeriesLocked(name)
		}
		s := st.newSeriesLocked(string(b))
		if s != st.overflow {
			st.values[k]++
		}
		return s
	}
	return st.newSeriesLocked(string(b))
}

// newSeriesLocked adds the series named name, or returns the overflow series when the store
// holds its bound.
func (st *Store) newSeriesLocked(name string) *Series {
	if len(st.list) >= st.maxSeries {
		if st.overflow == nil {
			st.overflow = &Series{Key: OverflowKey}
			st.list = append(st.list, st.overflow)
		}
		return st.overflow
	}
	s := &Series{Key: Sanitize(name)}
	st.byName[name] = s
	st.list = append(st.list, s)
	return s
}

// Series returns every series, in creation order.
func (st *Store) Series() []*Series {
	st.mu.RLock()
	defer st.mu.RUnlock()
	return slices.Clone(st.list)
}

// Value is one counter of s by its envoyproxy/ratelimit name (total_hits, over_limit,
// near_limit, within_limit, shadow_mode); 0 for another name.
func (s *Series) Value(name string) uint64 {
	if i := slices.Index(counterNames[:], name); i >= 0 {
		return s.c[i].Load()
	}
	return 0
}

// requestKey appends the key of a decision whose key holds request values: every level's
// key_value for detailed_metric (and for an override, keys only: an override's values are a
// request's own); for value_to_metric, the rule's levels with the last one's value the request's.
func requestKey(b []byte, d service.StatsDecision) []byte {
	r := d.Rule
	switch {
	case r == nil:
		b = append(b, d.Domain...)
		for _, e := range d.Entries {
			b = append(b, '.')
			b = append(b, e.GetKey()...)
		}
		return b
	case r.DetailedMetric:
		b = append(b, r.Domain...)
		for _, e := range d.Entries {
			b = append(b, '.')
			b = append(b, e.GetKey()...)
			if v := e.GetValue(); v != "" {
				b = append(b, '_')
				b = append(b, v...)
			}
		}
		return b
	}
	// value_to_metric: the rule's key to its last level, then the request's value there.
	b = ruleName(b, r.Domain, r.Path, d.Entries)
	if n := len(d.Entries); n > 0 {
		last := d.Entries[n-1]
		if i := strings.LastIndexByte(string(b), '.'); i >= 0 {
			b = append(b[:i+1], last.GetKey()...)
			if v := last.GetValue(); v != "" {
				b = append(b, '_')
				b = append(b, v...)
			}
		}
	}
	return b
}

// ruleName appends envoyproxy/ratelimit's stats key of the rule at path ("key=value/key2", as
// descriptors.Rule names it) in domain: "domain.key_value.key2". A value may hold '/', so the
// levels are read with the request's keys, which the rule matched level by level.
func ruleName(b []byte, domain, path string, entries []*ratelimitv3.RateLimitDescriptor_Entry) []byte {
	b = append(b, domain...)
	rest := path
	for i, e := range entries {
		key := e.GetKey()
		if !strings.HasPrefix(rest, key) || (len(rest) > len(key) && rest[len(key)] != '=' && rest[len(key)] != '/') {
			break
		}
		b = append(b, '.')
		b = append(b, key...)
		rest = rest[len(key):]
		if rest == "" {
			return b
		}
		if rest[0] == '/' {
			rest = rest[1:]
			continue
		}
		rest = rest[1:] // '='
		v := rest
		if i+1 < len(entries) {
			next := "/" + entries[i+1].GetKey()
			if strings.HasPrefix(rest, e.GetValue()+next) {
				v = e.GetValue()
			} else if j := strings.Index(rest, next); j >= 0 {
				v = rest[:j]
			}
		}
		b = append(b, '_')
		b = append(b, v...)
		rest = strings.TrimPrefix(rest[len(v):], "/")
		if rest == "" {
			return b
		}
	}
	if rest != "" {
		// Levels the request's keys do not account for (not expected): the path as it is.
		b = append(b, '.')
		b = append(b, strings.NewReplacer("=", "_", "/", ".").Replace(rest)...)
	}
	return b
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// Sanitize makes a stats key as envoyproxy/ratelimit does (its utils.SanitizeStatName): ':' and
// '|' become '_', and so do the dots of an IPv4 address.
func Sanitize(s string) string {
	s = strings.NewReplacer(":", "_", "|", "_").Replace(s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}
