// Package replay decides recorded requests against a rule set offline, at full speed: the
// decision log, JSON Lines of /json bodies with a time, or Envoy JSON access logs through a
// mapping file (input.go), each request decided at its recorded time by the functions the
// service's stores decide with (backend.DecideBatch over descriptors.RuleSet.Match), and the
// outcomes gathered per rule into a report (report.go) as a table, CSV or an HTML page.
package replay

import (
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/statekey"
)

// Request is one recorded request.
type Request struct {
	// Line is where it was read (1-based), for errors.
	Line int
	// Time is when it was decided, in µs since the Unix epoch.
	Time   int64
	Domain string
	Descs  []Desc
	// Count is how many times it stands for (a throttled decision log line: its count times its
	// sample); 0 counts as 1.
	Count int64
}

// Desc is one descriptor of a Request.
type Desc struct {
	Entries []descriptors.Entry
	// Hits is its cost: the descriptor's hits_addend, else the request's, else 1.
	Hits   int64
	Refund bool
}

// Options are the service's flags that change decisions.
type Options struct {
	ShadowMode, QuotaMode bool // --shadow-mode, --quota-mode
}

// Engine decides Requests against one rule set, keeping every key's state in memory exactly
// (no eviction; keys back to a full burst are forgotten now and then). It is not safe for
// concurrent use.
type Engine struct {
	rs     *descriptors.RuleSet
	opts   Options
	states map[string]backend.State
	// sweepAt: the size of states at which keys back to a full burst are next forgotten.
	sweepAt int

	// Scratch, reused by every Decide.
	items    []Item
	reqs     []backend.Request
	cur      []backend.State
	next     []backend.State
	out      []backend.Decision
	replaced []string
	keys     []byte
	ends     []int
	rules    []*descriptors.Rule // each descriptor's match
}

// Item is one limit of one descriptor of a decided request, as the service decides it: its
// descriptor's index, its rule and limit, the backend request and the decision.
type Item struct {
	Desc     int
	Rule     *descriptors.Rule
	Limit    *descriptors.Limit
	Req      backend.Request
	Decision backend.Decision
}

// ErrUnknownDomain is the error of a request whose domain the rules do not define.
var ErrUnknownDomain = errors.New("the rules define no such domain")

// ErrOverride is the error of a descriptor carrying its own limit (an override): its limit is not
// recorded by the inputs replay reads, so such descriptors are not replayed.
var ErrOverride = errors.New("a descriptor's own limit (override) is not replayed")

// NewEngine returns an Engine deciding against rs, every key at a full burst.
func NewEngine(rs *descriptors.RuleSet, opts Options) *Engine {
	return &Engine{rs: rs, opts: opts, states: map[string]backend.State{}, sweepAt: 1 << 16}
}

// Rules returns the engine's rule set.
func (e *Engine) Rules() *descriptors.RuleSet { return e.rs }

// Validate refuses a request the service would answer INVALID_ARGUMENT, as its validate does:
// an empty or overlong domain, no descriptors or too many, too many entries, an empty or
// overlong key, an overlong value, text that is not UTF-8.
func (r *Request) Validate() error {
	switch {
	case r.Domain == "":
		return errors.New("the domain is empty")
	case len(r.Domain) > limit.MaxValueBytes || !utf8.ValidString(r.Domain):
		return fmt.Errorf("the domain is longer than %d bytes or not UTF-8", limit.MaxValueBytes)
	case len(r.Descs) == 0 || len(r.Descs) > limit.MaxDescriptors:
		return fmt.Errorf("%d descriptors: want 1 to %d", len(r.Descs), limit.MaxDescriptors)
	}
	for i, d := range r.Descs {
		if len(d.Entries) > limit.MaxEntries {
			return fmt.Errorf("descriptor %d has %d entries, more than %d", i, len(d.Entries), limit.MaxEntries)
		}
		for j, e := range d.Entries {
			switch {
			case e.Key == "":
				return fmt.Errorf("descriptor %d, entry %d: the key is empty", i, j)
			case len(e.Key) > limit.MaxKeyBytes || !utf8.ValidString(e.Key):
				return fmt.Errorf("descriptor %d, entry %d: the key is longer than %d bytes or not UTF-8", i, j, limit.MaxKeyBytes)
			case len(e.Value) > limit.MaxValueBytes || !utf8.ValidString(e.Value):
				return fmt.Errorf("descriptor %d, entry %d: the value is longer than %d bytes or not UTF-8", i, j, limit.MaxValueBytes)
			}
		}
	}
	return nil
}

// Decide decides r once at r.Time and returns whether it is admitted and its items, one per
// limit that applies, grouped by descriptor in order (valid until the next Decide). It charges
// what the batch rule says, as a store would.
func (e *Engine) Decide(r *Request) (admitted bool, items []Item, err error) {
	if err := r.Validate(); err != nil {
		return false, nil, err
	}
	if !e.rs.HasDomain(r.Domain) {
		return false, nil, fmt.Errorf("domain %q: %w", r.Domain, ErrUnknownDomain)
	}
	e.translate(r)
	n := len(e.items)
	if n == 0 {
		return true, e.items, nil
	}
	e.reqs = slices.Grow(e.reqs[:0], n)[:n]
	e.cur = slices.Grow(e.cur[:0], n)[:n]
	e.next = slices.Grow(e.next[:0], n)[:n]
	e.out = slices.Grow(e.out[:0], n)[:n]
	for i := range e.items {
		e.reqs[i] = e.items[i].Req
		e.cur[i] = e.states[e.reqs[i].Key]
	}
	now := r.Time
	if backend.DecideBatch(e.cur, e.reqs, now, e.out, e.next) {
		for i := range e.reqs {
			if laterSameKey(e.reqs, i) {
				continue
			}
			if e.next[i].Fresh(now) {
				delete(e.states, e.reqs[i].Key)
			} else {
				e.states[e.reqs[i].Key] = e.next[i]
			}
		}
		if len(e.states) >= e.sweepAt {
			e.sweep(now)
		}
	}
	for i := range e.items {
		e.items[i].Decision = e.out[i]
	}
	return backend.Admitted(e.reqs, e.out), e.items, nil
}

// laterSameKey reports whether reqs[i].Key occurs again after i.
func laterSameKey(reqs []backend.Request, i int) bool {
	for j := i + 1; j < len(reqs); j++ {
		if reqs[j].Key == reqs[i].Key {
			return true
		}
	}
	return false
}

// sweep forgets the keys back to a full burst at now, and sets when to sweep next: when the map
// has doubled, so that sweeping costs O(1) a decision.
func (e *Engine) sweep(now int64) {
	for k, s := range e.states {
		if s.Fresh(now) {
			delete(e.states, k)
		}
	}
	e.sweepAt = max(1<<16, 2*len(e.states))
}

// Keys returns how many keys hold state.
func (e *Engine) Keys() int { return len(e.states) }

// translate turns r into e.items: one per limit of each descriptor its rule matches, with the
// key, limit, cost and mode the service gives it. It restates service.translate for descriptors
// without an override (TestReplayMatchesService holds the two equal): the limits a matched
// limit's replaces names are dropped from the whole request; the key is the domain and entries
// (under share_threshold the pattern for the value), each length-prefixed, then '#' and the
// limit's tag.
func (e *Engine) translate(r *Request) {
	e.items = e.items[:0]
	e.replaced = e.replaced[:0]
	e.keys = e.keys[:0]
	e.ends = e.ends[:0]
	e.rules = slices.Grow(e.rules[:0], len(r.Descs))[:len(r.Descs)]
	for i := range r.Descs {
		rule := e.rs.Match(r.Domain, r.Descs[i].Entries)
		e.rules[i] = rule
		if rule == nil {
			continue
		}
		for j := range rule.Limits {
			e.replaced = append(e.replaced, rule.Limits[j].Replaces...)
		}
	}
	for i, rule := range e.rules {
		if rule == nil {
			continue
		}
		d := &r.Descs[i]
		mode := backend.Enforce
		switch {
		case rule.ShadowMode || e.opts.ShadowMode:
			mode = backend.Shadow
		case rule.QuotaMode || e.opts.QuotaMode:
			mode = backend.Quota
		}
		for j := range rule.Limits {
			l := &rule.Limits[j]
			if l.Name != "" && len(e.replaced) > 0 && slices.Contains(e.replaced, l.Name) {
				continue
			}
			e.keys = appendKey(e.keys, r.Domain, d.Entries, rule.Share, l.KeyTag)
			e.ends = append(e.ends, len(e.keys))
			e.items = append(e.items, Item{Desc: i, Rule: rule, Limit: l,
				Req: backend.Request{Limit: l.Spec, Cost: d.Hits, Refund: d.Refund, Mode: mode}})
		}
	}
	if len(e.items) > 0 {
		keys := string(e.keys)
		start := 0
		for k := range e.items {
			e.items[k].Req.Key = keys[start:e.ends[k]]
			start = e.ends[k]
		}
	}
}

// appendKey appends the key of one limit of a descriptor as the service's appendKey does.
func appendKey(b []byte, domain string, entries []descriptors.Entry, share []string, tag string) []byte {
	b = statekey.AppendField(b, domain)
	for i, en := range entries {
		b = statekey.AppendField(b, en.Key)
		if i < len(share) && share[i] != "" {
			b = append(b, '*')
			b = statekey.AppendField(b, share[i])
		} else {
			b = statekey.AppendField(b, en.Value)
		}
	}
	b = append(b, '#')
	return append(b, tag...)
}

// Limiting returns the index among items of the item that answers for descriptor desc, as the
// service's response picks it: the limit that denies or, when all admit, the one with least
// remaining; -1 when no limit applies to it.
func Limiting(items []Item, desc int) int {
	best := -1
	for k := range items {
		if items[k].Desc != desc {
			continue
		}
		if best < 0 {
			best = k
			continue
		}
		if backend.Tighter(&items[best].Decision, &items[k].Decision) {
			best = k
		}
	}
	return best
}
