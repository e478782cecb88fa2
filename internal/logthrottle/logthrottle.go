// Package logthrottle keeps log lines that a client can cause at will (a refused request, a
// malformed report) from flooding the log: per cause, the first line is logged at once, and
// the ones that follow within the interval are counted instead. At the end of an interval
// that counted any, one line is logged with the latest one's message and attributes and
// "suppressed", how many were not logged. So each cause logs at most two lines per interval
// whatever the rate, and no occurrence goes unaccounted for.
package logthrottle

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// MaxCauses bounds the causes a Throttle keeps: a cause is meant to be a fixed string of the
// code, never client text, so this is only a guard. Past it, lines of new causes share one.
const MaxCauses = 1024

// overflowCause is the cause of lines past MaxCauses.
const overflowCause = "logthrottle: other causes"

// Throttle throttles log lines by cause. Its methods are safe for concurrent use; the zero
// value is not usable: use New.
type Throttle struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	causes map[string]*cause
	closed bool
}

// cause is one cause's state: when its window began, and what it suppressed since.
type cause struct {
	start      time.Time
	suppressed int
	level      slog.Level
	msg        string
	args       []any
	timer      *time.Timer // armed while suppressed > 0
}

// New returns a Throttle logging to log at most one line per cause per every (plus the count at
// its end). every <= 0 throttles nothing: every line is logged.
func New(log *slog.Logger, every time.Duration) *Throttle {
	return &Throttle{log: log, every: every, causes: map[string]*cause{}}
}

// Warn logs msg with args at warn level, throttled by cause.
func (t *Throttle) Warn(cause, msg string, args ...any) {
	t.Log(slog.LevelWarn, cause, msg, args...)
}

// Log logs msg with args at level, throttled by cause: a fixed string naming why the line is
// logged ("key reset refused"), never client text.
func (t *Throttle) Log(level slog.Level, causeName, msg string, args ...any) {
	if t.every <= 0 {
		t.log.Log(context.Background(), level, msg, args...)
		return
	}
	if !t.log.Enabled(context.Background(), level) {
		return
	}
	now := time.Now()
	t.mu.Lock()
	c, ok := t.causes[causeName]
	if !ok && len(t.causes) >= MaxCauses {
		causeName = overflowCause
		c, ok = t.causes[causeName]
	}
	if !ok {
		c = &cause{}
		t.causes[causeName] = c
	}
	if c.suppressed == 0 && (c.start.IsZero() || now.Sub(c.start) >= t.every) {
		c.start = now
		t.mu.Unlock()
		t.log.Log(context.Background(), level, msg, args...)
		return
	}
	c.suppressed++
	c.level, c.msg, c.args = level, msg, args
	if c.timer == nil && !t.closed {
		c.timer = time.AfterFunc(c.start.Add(t.every).Sub(now), func() { t.flush(causeName) })
	}
	t.mu.Unlock()
}

// flush logs what cause suppressed, if anything, and starts its next window.
func (t *Throttle) flush(causeName string) {
	t.mu.Lock()
	c := t.causes[causeName]
	if c == nil || c.suppressed == 0 {
		t.mu.Unlock()
		return
	}
	n, level, msg, args := c.suppressed, c.level, c.msg, c.args
	c.suppressed, c.args, c.timer = 0, nil, nil
	c.start = time.Now()
	t.mu.Unlock()
	t.log.Log(context.Background(), level, msg, append(append([]any(nil), args...), "suppressed", n)...)
}

// Flush logs at once what every cause suppressed so far, as the ends of their intervals would.
func (t *Throttle) Flush() {
	t.mu.Lock()
	var names []string
	for name, c := range t.causes {
		if c.suppressed > 0 {
			if c.timer != nil {
				c.timer.Stop()
			}
			names = append(names, name)
		}
	}
	t.mu.Unlock()
	for _, name := range names {
		t.flush(name)
	}
}

// Close flushes, and stops arming timers: lines suppressed after it are logged by the next
// Flush only. It is for shutdown.
func (t *Throttle) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.Flush()
}
