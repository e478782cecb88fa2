package rlqs

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultLogEvery is how often, at most, each kind of warning a client can cause is logged.
const DefaultLogEvery = 10 * time.Second

// throttle logs warnings that clients can cause at will (malformed reports, streams refused at
// a bound) at most once per cause per interval: the first of an interval is logged, with how
// many of that cause were not logged since the last line. It is safe for concurrent use.
type throttle struct {
	log   *slog.Logger
	every time.Duration
	now   func() time.Time

	mu     sync.Mutex
	causes map[string]*throttled // by cause: a fixed set, named by rls, never by a client
}

type throttled struct {
	last       time.Time
	suppressed int
}

func newThrottle(log *slog.Logger, every time.Duration, now func() time.Time) *throttle {
	return &throttle{log: log, every: every, now: now, causes: map[string]*throttled{}}
}

// Warn logs msg and args at WARN unless a warning of cause was logged less than the interval
// ago; then it only counts it, for the next line of cause ("suppressed": how many were not logged).
func (t *throttle) Warn(cause, msg string, args ...any) {
	now := t.now()
	t.mu.Lock()
	c := t.causes[cause]
	if c == nil {
		c = &throttled{}
		t.causes[cause] = c
	}
	if !c.last.IsZero() && now.Sub(c.last) < t.every {
		c.suppressed++
		t.mu.Unlock()
		return
	}
	n := c.suppressed
	c.last, c.suppressed = now, 0
	t.mu.Unlock()
	if n > 0 {
		args = append(args, "suppressed", n, "suppressed_over", t.every.String())
	}
	t.log.Warn(msg, append(args, "cause", cause)...)
}
