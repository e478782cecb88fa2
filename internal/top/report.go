package top

import (
	"cmp"
	"slices"
	"time"
)

// MaxRules bounds the rules one report holds: those with the most denials, then hits.
const MaxRules = 50

// Query says what a report holds.
type Query struct {
	Domain, Rule string        // only this domain, this rule's path; "" for any
	Window       time.Duration // time.Minute or 10*time.Minute
	ByHits       bool          // sort keys by hits; default by denials, then hits
	Keys         int           // keys per rule, at most Config.Keys
}

// Report is the top talkers, as /debug/top serves them.
type Report struct {
	At     time.Time `json:"at"`
	Window string    `json:"window"`
	// From is where the window begins: the start of its oldest slot.
	From time.Time `json:"from"`
	Sort string    `json:"sort"`
	// Counters is the counters each rule keeps per slot: a key's error is at most the rule's
	// hits over it.
	Counters     int          `json:"counters"`
	Rules        []RuleReport `json:"rules"`
	RulesOmitted int          `json:"rules_omitted,omitempty"`
	// Untracked is the hits of rules not counted since the start: the memory cap held.
	Untracked int64 `json:"untracked_hits,omitempty"`
}

// RuleReport is one rule's top talkers.
type RuleReport struct {
	Domain  string `json:"domain"`
	Rule    string `json:"rule"`
	Hits    int64  `json:"hits"`    // exact
	Denials int64  `json:"denials"` // exact
	// MaxError bounds every key's error in this window: at most Hits / Counters.
	MaxError int64       `json:"max_error"`
	Keys     []KeyReport `json:"keys"`
}

// KeyReport is one key. Its true hits are within Error of Hits, either way (an overestimate in
// the slots that count it, nothing in those that do not); its true denials are in
// [Denials, Denials+Error].
type KeyReport struct {
	Descriptor string `json:"descriptor"`
	Hits       int64  `json:"hits"`
	Denials    int64  `json:"denials"`
	Error      int64  `json:"error"`
	Remaining  int64  `json:"remaining"` // what the key's last decision left
	Limit      int64  `json:"limit"`     // of its limit's burst
}

// Report returns the top talkers q asks for.
func (t *Top) Report(q Query) Report {
	now := t.cfg.Now()
	long := q.Window > time.Minute
	rep := Report{At: now.UTC(), Window: "1m", Sort: "denials", Counters: t.cfg.Keys, Rules: []RuleReport{},
		Untracked: t.untracked.Load()}
	slotLen, slots := shortSlot, int64(shortSlots)
	if long {
		rep.Window, slotLen, slots = "10m", longSlot, longSlots
	}
	if q.ByHits {
		rep.Sort = "hits"
	}
	cur := now.UnixNano() / int64(slotLen)
	rep.From = time.Unix(0, (cur-slots+1)*int64(slotLen)).UTC()
	keys := min(max(q.Keys, 1), t.cfg.Keys)
	for id, r := range *t.rules.Load() {
		if (q.Domain != "" && id.domain != q.Domain) || (q.Rule != "" && id.rule != q.Rule) {
			continue
		}
		rr := r.report(long, cur, slots, keys, q.ByHits)
		if rr.Hits > 0 {
			rep.Rules = append(rep.Rules, rr)
		}
	}
	slices.SortFunc(rep.Rules, func(a, b RuleReport) int {
		return cmp.Or(cmp.Compare(b.Denials, a.Denials), cmp.Compare(b.Hits, a.Hits),
			cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule))
	})
	if len(rep.Rules) > MaxRules {
		rep.RulesOmitted = len(rep.Rules) - MaxRules
		rep.Rules = rep.Rules[:MaxRules]
	}
	return rep
}

// report merges the rule's slots from cur-slots+1 to cur: a key's counts are summed over the
// slots that count it, and each slot that does not adds its smallest count to the key's error.
func (r *ruleTop) report(long bool, cur, slots int64, keys int, byHits bool) RuleReport {
	rr := RuleReport{Domain: r.id.domain, Rule: r.id.rule, Keys: []KeyReport{}}
	ring := r.short[:]
	if long {
		ring = r.long[:]
	}
	type agg struct {
		KeyReport
		seen int64 // the latest slot that counted it
	}
	merged := map[uint64]*agg{}
	var mins int64 // the sum of the window's slots' smallest counts
	r.mu.Lock()
	for _, s := range ring {
		if s.slot <= cur-slots || s.slot > cur {
			continue
		}
		rr.Hits += s.total
		rr.Denials += s.denied
		mins += s.min()
		for i := range s.cs {
			c := &s.cs[i]
			a := merged[c.hash]
			if a == nil {
				a = &agg{KeyReport: KeyReport{Descriptor: c.text()}, seen: -1}
				merged[c.hash] = a
			}
			a.Hits += c.count
			a.Denials += c.denials
			a.Error += c.err - s.min() // this slot's min is added to every key below
			if s.slot > a.seen {
				a.seen, a.Remaining, a.Limit = s.slot, c.remaining, c.limit
			}
		}
	}
	r.mu.Unlock()
	rr.MaxError = mins
	out := make([]KeyReport, 0, len(merged))
	for _, a := range merged {
		a.Error += mins
		out = append(out, a.KeyReport)
	}
	slices.SortFunc(out, func(a, b KeyReport) int {
		if byHits {
			return cmp.Or(cmp.Compare(b.Hits, a.Hits), cmp.Compare(b.Denials, a.Denials), cmp.Compare(a.Descriptor, b.Descriptor))
		}
		return cmp.Or(cmp.Compare(b.Denials, a.Denials), cmp.Compare(b.Hits, a.Hits), cmp.Compare(a.Descriptor, b.Descriptor))
	})
	rr.Keys = append(rr.Keys, out[:min(keys, len(out))]...)
	return rr
}
