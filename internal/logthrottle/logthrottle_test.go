package logthrottle

import (
	"bytes"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSpace(l.b.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func newLogger(w *lockedBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, nil))
}

var suppressedAttr = regexp.MustCompile(` suppressed=([0-9]+)`)

// count returns the lines of msg in lines, and how many occurrences they account for: one for
// each line without a count, the count of each line with one.
func count(lines []string, msg string) (n, occurrences int) {
	for _, l := range lines {
		if !strings.Contains(l, "msg="+msg+" ") && !strings.Contains(l, `msg="`+msg+`"`) && !strings.HasSuffix(l, "msg="+msg) {
			continue
		}
		n++
		if m := suppressedAttr.FindStringSubmatch(l); m != nil {
			s, _ := strconv.Atoi(m[1])
			occurrences += s
		} else {
			occurrences++
		}
	}
	return n, occurrences
}

// TestOneLinePerInterval: within one interval, a thousand lines of a cause log one line at once
// and, at the interval's end (Flush here), one with the 999 suppressed and the latest line's
// attributes; another cause is throttled apart.
func TestOneLinePerInterval(t *testing.T) {
	var buf lockedBuffer
	th := New(newLogger(&buf), time.Hour)
	for i := range 1000 {
		th.Warn("refused", "request refused", "remote", fmt.Sprint("10.0.0.", i))
	}
	th.Warn("other", "something else")
	lines := buf.lines()
	if n, s := count(lines, "request refused"); n != 1 || s != 1 {
		t.Fatalf("before the interval ends: %d lines for %d occurrences, want the first line only:\n%s", n, s, strings.Join(lines, "\n"))
	}
	if !strings.Contains(lines[0], "remote=10.0.0.0") || strings.Contains(lines[0], "suppressed") {
		t.Errorf("first line %q: want the first occurrence, without a count", lines[0])
	}
	if n, _ := count(lines, "something else"); n != 1 {
		t.Errorf("another cause was suppressed with the first: %q", lines)
	}
	th.Flush()
	lines = buf.lines()
	if n, s := count(lines, "request refused"); n != 2 || s != 1000 || !strings.Contains(lines[len(lines)-1], "suppressed=999") {
		t.Fatalf("after the interval: %d lines for %d occurrences, want 2 for 1000, the last with 999 suppressed:\n%s", n, s, strings.Join(lines, "\n"))
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, "remote=10.0.0.999") || !strings.Contains(last, "level=WARN") {
		t.Errorf("summary line %q: want the latest occurrence's attributes at warn", last)
	}
	th.Flush() // nothing more to say
	if got := len(buf.lines()); got != len(lines) {
		t.Errorf("a second Flush logged %d more lines", got-len(lines))
	}
}

// TestIntervalsEnd: with a short interval and real timers, lines from 8 goroutines are all
// accounted for (logged or counted as suppressed) and the lines logged are a few per interval
// elapsed, however many were asked for.
func TestIntervalsEnd(t *testing.T) {
	var buf lockedBuffer
	const every = 50 * time.Millisecond
	th := New(newLogger(&buf), every)
	const workers, per = 8, 2000
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				th.Warn("refused", "request refused", "worker", w)
				if i%200 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	// The last interval's count comes by its timer.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, s := count(buf.lines(), "request refused")
		if s == workers*per {
			intervals := int(elapsed/every) + 2
			if n > 2*intervals {
				t.Fatalf("%d lines over %v (%d intervals of %v): want at most 2 per interval", n, elapsed, intervals, every)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines for %d occurrences, want %d accounted for", n, s, workers*per)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNoThrottle: an interval of 0 logs every line; a level the logger drops costs nothing.
func TestNoThrottle(t *testing.T) {
	var buf lockedBuffer
	th := New(newLogger(&buf), 0)
	for range 5 {
		th.Warn("c", "m")
	}
	if n, _ := count(buf.lines(), "m"); n != 5 {
		t.Errorf("interval 0: %d lines, want 5", n)
	}
	quiet := New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelError})), time.Hour)
	quiet.Warn("c", "dropped")
	quiet.Flush()
	if n, _ := count(buf.lines(), "dropped"); n != 0 || len(quiet.causes) != 0 {
		t.Errorf("a dropped level was kept: %d lines, %d causes", n, len(quiet.causes))
	}
}

// TestCausesBounded: causes past MaxCauses share one, so the map cannot grow without bound: the
// first MaxCauses causes log a line each, the 500 past them one line and, at Close, one with the
// other 499 suppressed.
func TestCausesBounded(t *testing.T) {
	var buf lockedBuffer
	th := New(newLogger(&buf), time.Hour)
	for i := range MaxCauses + 500 {
		th.Warn(strconv.Itoa(i), "m")
	}
	if len(th.causes) != MaxCauses+1 {
		t.Errorf("%d causes kept, want %d", len(th.causes), MaxCauses+1)
	}
	th.Close()
	if n, s := count(buf.lines(), "m"); s != MaxCauses+500 || n != MaxCauses+2 {
		t.Errorf("%d lines for %d occurrences, want %d lines for %d", n, s, MaxCauses+2, MaxCauses+500)
	}
}
