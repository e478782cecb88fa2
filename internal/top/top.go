// Package top keeps the top talkers: per rule, the keys with the most hits and denials over the
// last minute and the last ten minutes, in bounded memory whatever the number of distinct keys.
//
// Each rule has a ring of space-saving summaries (summary.go): seven of ten seconds each for
// the last minute, eleven of a minute each for the last ten. A window is the slot being filled
// and the whole slots before it, so "the last minute" spans 60 to 70 seconds and "the last ten
// minutes" 10 to 11 minutes. Each slot has Config.Keys counters; a key's hits over a window are
// reported with an error that is at most the window's hits over Config.Keys (the sum, over
// the window's slots, of each slot's smallest count). Every rule's counters are reserved
// against Config.MaxBytes when the rule is first seen; a rule seen when the cap is held is
// not counted (Untracked says how many of its hits were not), until rules idle for ten minutes
// have given their share back.
package top

import (
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/rls-project/rls/internal/descriptors"
)

const (
	shortSlot  = 10 * time.Second
	shortSlots = 7 // the last minute: the slot being filled and the six before it
	longSlot   = time.Minute
	longSlots  = 11 // the last ten minutes

	// MaxTextBytes bounds the descriptor text reported for a key; longer texts are cut and end
	// in "…". A counter keeps the first 128 bytes of the key it counts, rendered when reported.
	MaxTextBytes = 128
	// counterBytes is what one counter takes at most: its record (184 bytes, the key's first
	// 128 among them), its place in its summary's heap (4) and index (about 20), with room to
	// spare.
	counterBytes = 256
	// ruleOverhead is a rule's bookkeeping besides its counters.
	ruleOverhead = 2048

	// DefaultKeys and DefaultMaxBytes are --top-keys's and --top-max-bytes's defaults.
	DefaultKeys     = 64
	DefaultMaxBytes = 32 << 20
	// MaxKeys bounds Config.Keys.
	MaxKeys = 4096
)

// Windows are the windows a query may ask for, by name.
var Windows = map[string]time.Duration{"1m": time.Minute, "10m": 10 * time.Minute}

// RuleBytes is the memory a rule's counters are reserved, with keys counters per slot.
func RuleBytes(keys int) int64 {
	return int64(shortSlots+longSlots)*int64(keys)*counterBytes + ruleOverhead
}

// Config sizes a Top.
type Config struct {
	Keys     int   // counters per rule and slot (the summary's m)
	MaxBytes int64 // every rule's counters together
	// Now is the clock queries read (default time.Now); Observe is handed its time.
	Now func() time.Time
}

// Observation is one descriptor's decision, by the limit that answered for it.
type Observation struct {
	Domain, Rule string // the rule's domain and path
	// Key is the descriptor's backend key: statekey fields (the domain, then each entry's key
	// and value, a shared value as '*' and its pattern), then '#' and the limit's tag, which
	// is ignored so that every limit of a rule counts the descriptor as one key.
	Key       string
	Cost      int64
	Denied    bool  // denied, or would be in shadow mode
	Remaining int64 // what the decision left
	Limit     int64 // the limit's burst
}

type ruleID struct{ domain, rule string }

// ruleTop is one rule's summaries.
type ruleTop struct {
	id    ruleID
	mu    sync.Mutex
	short [shortSlots]*summary
	long  [longSlots]*summary
	last  atomic.Int64 // unix nanoseconds of its last observation
}

// Top is every rule's top talkers. It is safe for concurrent use.
type Top struct {
	cfg       Config
	seed      maphash.Seed
	rules     atomic.Pointer[map[ruleID]*ruleTop]
	mu        sync.Mutex // serializes adding and dropping rules
	used      int64      // bytes reserved, under mu
	untracked atomic.Int64
	// full: the cap held when a rule was last refused; until nextSweep (unix nanoseconds)
	// new rules are refused without looking for idle ones.
	full      atomic.Bool
	nextSweep atomic.Int64
}

// New returns a Top sized by cfg; Keys must be in [1, MaxKeys] and MaxBytes at least
// RuleBytes(Keys).
func New(cfg Config) *Top {
	cfg.Keys = min(max(cfg.Keys, 1), MaxKeys)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t := &Top{cfg: cfg, seed: maphash.MakeSeed()}
	t.rules.Store(&map[ruleID]*ruleTop{})
	return t
}

// Observe counts o at now.
func (t *Top) Observe(now time.Time, o *Observation) {
	id := ruleID{o.Domain, o.Rule}
	r := (*t.rules.Load())[id]
	if r == nil {
		if r = t.addRule(id, now); r == nil {
			t.untracked.Add(max(o.Cost, 1))
			return
		}
	}
	ident := keyIdentity(o.Key)
	h := maphash.String(t.seed, ident)
	ns := now.UnixNano()
	r.last.Store(ns)
	ss, ls := ns/int64(shortSlot), ns/int64(longSlot)
	r.mu.Lock()
	s := r.short[ss%shortSlots]
	if s.slot != ss {
		s.reset(ss)
	}
	s.add(h, o, ident)
	l := r.long[ls%longSlots]
	if l.slot != ls {
		l.reset(ls)
	}
	l.add(h, o, ident)
	r.mu.Unlock()
}

// addRule adds the rule id, first dropping rules idle for longer than the long window when the
// cap is held; nil when the cap still holds.
func (t *Top) addRule(id ruleID, now time.Time) *ruleTop {
	if t.full.Load() && now.UnixNano() < t.nextSweep.Load() {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.rules.Load()
	if r := old[id]; r != nil {
		return r
	}
	need := RuleBytes(t.cfg.Keys)
	if t.used+need > t.cfg.MaxBytes {
		if t.full.Load() && now.UnixNano() < t.nextSweep.Load() {
			return nil
		}
		t.nextSweep.Store(now.Add(time.Second).UnixNano()) // look for idle rules once a second at most
	}
	m := make(map[ruleID]*ruleTop, len(old)+1)
	idleBefore := now.Add(-longSlots * longSlot).UnixNano()
	for k, r := range old {
		if t.used+need > t.cfg.MaxBytes && r.last.Load() < idleBefore {
			t.used -= need
			continue
		}
		m[k] = r
	}
	if t.used+need > t.cfg.MaxBytes {
		if len(m) != len(old) {
			t.rules.Store(&m)
		}
		t.full.Store(true)
		return nil
	}
	t.full.Store(t.used+need+need > t.cfg.MaxBytes)
	r := &ruleTop{id: id}
	for i := range r.short {
		r.short[i] = newSummary(t.cfg.Keys)
	}
	for i := range r.long {
		r.long[i] = newSummary(t.cfg.Keys)
	}
	m[id] = r
	t.used += need
	t.rules.Store(&m)
	return r
}

// keyIdentity is key without the limit's tag: its statekey fields up to the '#' that follows
// them.
func keyIdentity(key string) string {
	i := 0
	for i < len(key) {
		if key[i] == '*' { // a shared value: '*' then its pattern as a field
			i++
			continue
		}
		n, j := 0, i
		for j < len(key) && key[j] >= '0' && key[j] <= '9' {
			n = n*10 + int(key[j]-'0')
			j++
		}
		if j == i || j >= len(key) || key[j] != ':' || n > len(key)-j-1 {
			return key[:i] // the tag, or anything else that is not a field
		}
		i = j + 1 + n
	}
	return key
}

// descriptorText renders a key's identity as the descriptor it came from, "k=v,k2=v2" (the
// domain left out), with ',', '=' and '%' percent-encoded as rls inspect reads them, and a
// shared value as '*' and its pattern; cut to MaxTextBytes. cut says ident is the start of a
// longer identity: its last field may be partial, and the text ends in "…".
func descriptorText(ident string, cut bool) string {
	var b []byte
	fields := 0
	shared := false
	for i := 0; i < len(ident) && len(b) <= MaxTextBytes; {
		if ident[i] == '*' {
			shared = true
			i++
			continue
		}
		c := i
		for c < len(ident) && ident[c] != ':' {
			c++
		}
		n, err := strconv.Atoi(ident[i:c])
		if err != nil || c == len(ident) {
			cut = true
			break
		}
		end := c + 1 + n
		if end > len(ident) {
			end, cut = len(ident), true
		}
		f := ident[c+1 : end]
		i = end
		fields++
		switch {
		case fields == 1: // the domain
			continue
		case fields%2 == 0:
			if len(b) > 0 {
				b = append(b, ',')
			}
		default:
			b = append(b, '=')
			if shared {
				b = append(b, '*')
				shared = false
			}
		}
		b = descriptors.AppendEscaped(b, f)
	}
	if len(b) > MaxTextBytes {
		i := MaxTextBytes
		for i > 0 && !utf8.RuneStart(b[i]) {
			i--
		}
		b, cut = b[:i], true
	}
	if cut {
		// A cut identity may end inside a character: drop its first bytes.
		for k := 0; k < utf8.UTFMax-1 && len(b) > 0; k++ {
			if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size > 1 {
				break
			}
			b = b[:len(b)-1]
		}
		return string(b) + "…"
	}
	return string(b)
}
