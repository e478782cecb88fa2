package decisionlog

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxKeys is Options.MaxKeys when unset.
const DefaultMaxKeys = 10000

// flushEvery is how often lines buffered are written out when no interval ends sooner.
const flushEvery = time.Second

// Options says what the log writes.
type Options struct {
	// Interval throttles each key (domain, rule, descriptor and code): its first decision in an
	// interval is written at once, the ones after it are counted, and when the interval ends
	// one line with the latest of them and their count is written. 0: every decision a line.
	Interval time.Duration
	// MaxKeys bounds the keys the throttle holds at once (0: DefaultMaxKeys). A decision of a
	// new key when it is full ends the interval early: the counts held are written and the
	// throttle starts empty, so its memory stays bounded and no decision goes uncounted.
	MaxKeys int
	// Rules names the rules whose every decision is written, not only their denials:
	// "DOMAIN/PATH" (a rule's path as /debug/rules shows it), "DOMAIN" for every rule of a
	// domain, or "*" for every rule.
	Rules []string
	// Sample writes one in Sample of those rules' admitted decisions (≤ 1: every one). Denials
	// are never sampled.
	Sample int64
}

// Log is a decision log. Its methods are safe for concurrent use.
type Log struct {
	interval time.Duration
	maxKeys  int
	sample   int64
	allRules bool
	domains  map[string]bool
	rules    map[string]bool // "domain/path"
	seen     atomic.Int64    // chosen rules' admitted decisions, for sampling

	mu        sync.Mutex
	w         *bufio.Writer
	buf       []byte
	key       []byte
	keys      map[string]*pending
	windowEnd time.Time
	err       error // the first write error
	closed    bool

	stop chan struct{}
	done chan struct{}
}

// pending is a key's latest decision in the current interval and how many came after the one
// written at its start.
type pending struct {
	rec   Record
	count int64
}

// ParseRules checks the names of Options.Rules.
func ParseRules(names []string) error {
	for _, n := range names {
		if n == "" || strings.TrimSpace(n) != n {
			return fmt.Errorf("decision log rule %q: want DOMAIN, DOMAIN/PATH or *", n)
		}
	}
	return nil
}

// New returns a Log writing to w and starts its background flush; Close stops it.
func New(w io.Writer, opts Options) (*Log, error) {
	if opts.Interval < 0 || opts.MaxKeys < 0 {
		return nil, errors.New("decision log: interval and max keys must be ≥ 0")
	}
	if err := ParseRules(opts.Rules); err != nil {
		return nil, err
	}
	l := &Log{
		interval: opts.Interval, maxKeys: cmp.Or(opts.MaxKeys, DefaultMaxKeys), sample: max(opts.Sample, 1),
		domains: map[string]bool{}, rules: map[string]bool{},
		w: bufio.NewWriterSize(w, 64<<10), keys: map[string]*pending{},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	for _, n := range opts.Rules {
		switch {
		case n == "*":
			l.allRules = true
		case strings.Contains(n, "/"):
			l.rules[n] = true
		default:
			l.domains[n] = true
		}
	}
	go l.run()
	return l, nil
}

func (l *Log) run() {
	defer close(l.done)
	every := flushEvery
	if l.interval > 0 {
		every = min(every, l.interval)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			l.Flush(now)
		}
	}
}

// Wants reports whether a decision of rule (its path) in domain is to be written, and the sample
// it stands for: every denial; an admitted decision of a rule Options.Rules names, one in Sample.
// It is cheap, for the decision path to ask before building a Record.
func (l *Log) Wants(domain, rule string, denied bool) (bool, int64) {
	if denied {
		return true, 1
	}
	if !l.chosen(domain, rule) {
		return false, 0
	}
	if l.sample <= 1 {
		return true, 1
	}
	return l.seen.Add(1)%l.sample == 1, l.sample
}

// DenialsOnly reports whether the log wants denials alone (no Options.Rules): then a request
// none of whose limits denied has nothing to tell it.
func (l *Log) DenialsOnly() bool { return !l.allRules && len(l.domains) == 0 && len(l.rules) == 0 }

func (l *Log) chosen(domain, rule string) bool {
	if l.allRules || l.domains[domain] {
		return true
	}
	if len(l.rules) == 0 {
		return false
	}
	return l.rules[domain+"/"+rule]
}

// Write writes r (its Count is set here), throttled by its key. r.Time is taken as the time of
// the decision; the log does not keep r or its slices.
func (l *Log) Write(r *Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if l.interval <= 0 {
		r.Count = 1
		l.line(r)
		return
	}
	if !r.Time.Before(l.windowEnd) {
		l.flushLocked()
		l.windowEnd = r.Time.Add(l.interval)
	}
	l.key = appendKey(l.key[:0], r)
	if p, ok := l.keys[string(l.key)]; ok {
		p.count++
		desc := p.rec.Descriptor
		p.rec = *r
		p.rec.Descriptor = append(desc[:0], r.Descriptor...)
		return
	}
	if len(l.keys) >= l.maxKeys {
		l.flushLocked()
		l.windowEnd = r.Time.Add(l.interval)
	}
	p := &pending{rec: *r}
	p.rec.Descriptor = slices.Clone(r.Descriptor)
	l.keys[string(l.key)] = p
	r.Count = 1
	l.line(r)
}

// appendKey appends the throttle key of r: its domain, rule, code and entries, each
// length-prefixed.
func appendKey(b []byte, r *Record) []byte {
	field := func(s string) {
		b = append(b, byte(len(s)>>24), byte(len(s)>>16), byte(len(s)>>8), byte(len(s)))
		b = append(b, s...)
	}
	field(r.Domain)
	field(r.Rule)
	field(r.Limit)
	field(r.Code)
	if r.Shadow {
		b = append(b, 's')
	}
	for _, e := range r.Descriptor {
		field(e.Key)
		field(e.Value)
	}
	return b
}

// line writes one record; l.mu is held.
func (l *Log) line(r *Record) {
	l.buf = append(r.AppendJSON(l.buf[:0]), '\n')
	if _, err := l.w.Write(l.buf); err != nil && l.err == nil {
		l.err = err
	}
}

// Flush ends the current interval if it is over at now, writing the counts it held, and writes
// out the lines buffered.
func (l *Log) Flush(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if !now.Before(l.windowEnd) {
		l.flushLocked()
	}
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
}

// flushLocked writes the line of each key that counted decisions after its first, oldest
// first, and empties the throttle.
func (l *Log) flushLocked() {
	var due []*pending
	for _, p := range l.keys {
		if p.count > 0 {
			due = append(due, p)
		}
	}
	slices.SortFunc(due, func(a, b *pending) int { return a.rec.Time.Compare(b.rec.Time) })
	for _, p := range due {
		p.rec.Count = p.count
		l.line(&p.rec)
	}
	clear(l.keys)
}

// Keys returns how many keys the throttle holds now (at most Options.MaxKeys).
func (l *Log) Keys() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// Err returns the first error writing the log met, if any.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Close writes the counts held and the lines buffered and stops the background flush. Writes
// after Close are dropped.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return l.err
	}
	l.flushLocked()
	if err := l.w.Flush(); err != nil && l.err == nil {
		l.err = err
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	return l.Err()
}
