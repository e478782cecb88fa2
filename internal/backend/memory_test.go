package backend_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/rlstest"
)

func TestMemoryConformance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) backend.Backend {
		m, err := backend.NewMemory(backend.MemoryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}

// perHour is a limit whose state stays charged for the whole of a test at a fixed instant.
func perHour(rate, burst int64) limit.Limit {
	return limit.Limit{Rate: rate, Period: time.Hour, Burst: burst}
}

func decideOne(t *testing.T, m *backend.Memory, r backend.Request) backend.Decision {
	t.Helper()
	out := make([]backend.Decision, 1)
	if _, err := m.Decide(context.Background(), []backend.Request{r}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// TestMemoryBoundedInBytes: keys count their length plus a fixed overhead against MaxBytes; past
// it the least recently used are forgotten (and then see a full burst), and Evictions counts
// those that still held usage.
func TestMemoryBoundedInBytes(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	const keyLen, perKey, fit = 1000, 1000 + 112, 10
	m, err := backend.NewMemory(backend.MemoryOptions{MaxBytes: fit*perKey + perKey/2, Shards: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	l := perHour(10, 5)
	key := func(i int) string { return fmt.Sprintf("%0*d", keyLen, i) }
	for i := range 30 {
		decideOne(t, m, backend.Request{Key: key(i), Limit: l, Cost: 1})
		if i == fit {
			decideOne(t, m, backend.Request{Key: key(1), Limit: l, Cost: 1}) // 1 is recent again
		}
	}
	if m.Len() != fit || m.Bytes() != fit*perKey || m.Evictions() != 30-fit {
		t.Fatalf("after 30 keys of %d bytes: %d keys, %d bytes, %d evictions; want %d, %d, %d", keyLen, m.Len(), m.Bytes(), m.Evictions(), fit, fit*perKey, 30-fit)
	}
	for _, tc := range []struct {
		i         int
		remaining int64
	}{{29, 3}, {20, 3}, {19, 4}, {1, 4}, {0, 4}} {
		if d := decideOne(t, m, backend.Request{Key: key(tc.i), Limit: l, Cost: 1}); d.Remaining != tc.remaining {
			t.Errorf("key %d: remaining %d, want %d (%s)", tc.i, d.Remaining, tc.remaining, map[bool]string{true: "kept", false: "evicted: a full burst again"}[tc.remaining == 3])
		}
	}
}

func TestMemoryMaxKeys(t *testing.T) {
	m, err := backend.NewMemory(backend.MemoryOptions{MaxKeys: 7, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		decideOne(t, m, backend.Request{Key: fmt.Sprint(i), Limit: perHour(10, 5), Cost: 1})
	}
	if m.Len() != 7 || m.Evictions() != 13 {
		t.Fatalf("%d keys, %d evictions; want 7 and 13", m.Len(), m.Evictions())
	}
}

// TestMemoryKeepsOnlyItsKey: a key that is part of a larger string (as the service builds the
// keys of a request, in one allocation) is copied, so that keeping it does not keep the rest.
func TestMemoryKeepsOnlyItsKey(t *testing.T) {
	m, err := backend.NewMemory(backend.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	func() {
		all := strings.Repeat("k", 1<<20)
		runtime.AddCleanup(unsafe.StringData(all), func(ch chan struct{}) { close(ch) }, released)
		decideOne(t, m, backend.Request{Key: all[:20], Limit: perHour(10, 5), Cost: 1})
	}()
	for range 50 {
		runtime.GC()
		select {
		case <-released:
			if m.Len() != 1 {
				t.Fatalf("%d keys, want 1", m.Len())
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Fatal("the 1 MiB string a 20-byte key was cut from is still kept")
}

func TestMemoryDropsIdleKeys(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m, err := backend.NewMemory(backend.MemoryOptions{Shards: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	l := limit.Limit{Rate: 1, Period: time.Second, Burst: 1}
	for i := range 10 {
		decideOne(t, m, backend.Request{Key: fmt.Sprint(i), Limit: l, Cost: 1})
	}
	now = now.Add(2 * time.Second)
	for range 5 {
		decideOne(t, m, backend.Request{Key: "other", Limit: l, Cost: 0}) // a check stores nothing
	}
	if m.Len() != 0 || m.Bytes() != 0 {
		t.Fatalf("idle keys left: %d keys, %d bytes", m.Len(), m.Bytes())
	}
	if d := decideOne(t, m, backend.Request{Key: "x", Limit: l, Cost: 1}); !d.Allowed {
		t.Fatalf("got %+v", d)
	}
	decideOne(t, m, backend.Request{Key: "x", Limit: l, Cost: 1, Refund: true}) // back to a full burst: forgotten
	if m.Len() != 0 {
		t.Fatalf("a key back to a full burst is kept")
	}
}

func TestNewMemoryRejects(t *testing.T) {
	for _, opts := range []backend.MemoryOptions{
		{MaxBytes: -1}, {MaxBytes: 100}, {MaxKeys: -1}, {Shards: -1},
	} {
		if _, err := backend.NewMemory(opts); err == nil {
			t.Errorf("%+v: accepted", opts)
		}
	}
}

func TestMemoryRejectsRateOutOfRange(t *testing.T) {
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	out := make([]backend.Decision, 1)
	_, err := m.Decide(context.Background(), []backend.Request{{Key: "k", Limit: limit.Limit{Rate: 1<<32 + 1, Period: time.Hour, Burst: 1}, Cost: 1}}, out)
	if !errors.Is(err, limit.ErrInvalid) {
		t.Fatalf("got %v, want limit.ErrInvalid", err)
	}
}

func TestMemoryDecideAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	l := perHour(1<<30, 1<<30)
	reqs := []backend.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}, {Key: "a", Limit: l, Cost: 1, Mode: backend.Quota}}
	out := make([]backend.Decision, len(reqs))
	decide := func() {
		if _, err := m.Decide(context.Background(), reqs, out); err != nil {
			t.Fatal(err)
		}
	}
	decide()
	if n := testing.AllocsPerRun(100, decide); n != 0 {
		t.Fatalf("Decide of keys held allocates %v times per call", n)
	}
}

func BenchmarkMemoryDecide(b *testing.B) {
	m, err := backend.NewMemory(backend.MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	// A long period keeps every key holding usage, as in steady state: no key leaves or re-enters.
	l := limit.Limit{Rate: 1 << 30, Period: 100 * 24 * time.Hour, Burst: 1 << 30}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("5:bench|6:api_key|%d", i)
	}
	b.ReportAllocs()
	cpu := rlstest.ProcessCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		reqs := []backend.Request{{Limit: l, Cost: 1}}
		out := make([]backend.Decision, 1)
		i := 0
		for pb.Next() {
			reqs[0].Key = keys[i%len(keys)]
			i++
			if _, err := m.Decide(context.Background(), reqs, out); err != nil {
				b.Fatal(err)
			}
		}
	})
	rlstest.ReportCPU(b, cpu)
}

// BenchmarkMemoryDecideBatch decides batches of 8 keys held, as a request with several
// descriptors does.
func BenchmarkMemoryDecideBatch(b *testing.B) {
	m, err := backend.NewMemory(backend.MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	l := limit.Limit{Rate: 1 << 30, Period: 100 * 24 * time.Hour, Burst: 1 << 30}
	reqs := make([]backend.Request, 8)
	for i := range reqs {
		reqs[i] = backend.Request{Key: fmt.Sprintf("5:bench|6:api_key|%d", i), Limit: l, Cost: 1}
	}
	out := make([]backend.Decision, len(reqs))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Decide(context.Background(), reqs, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryDecideChurn decides a key not held on every call while earlier keys go idle
// and leave: the path of many distinct keys each seen briefly.
func BenchmarkMemoryDecideChurn(b *testing.B) {
	now := time.Unix(1_700_000_000, 0)
	m, err := backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return now }})
	if err != nil {
		b.Fatal(err)
	}
	l := limit.Limit{Rate: 1, Period: 100 * time.Microsecond, Burst: 1} // a key is idle 100µs after
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("5:bench|6:api_key|%d", i)
	}
	reqs := []backend.Request{{Limit: l, Cost: 1}}
	out := make([]backend.Decision, 1)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(10 * time.Microsecond)
		reqs[0].Key = keys[i%len(keys)]
		i++
		if _, err := m.Decide(context.Background(), reqs, out); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if m.Len() > 1000 {
		b.Fatalf("%d keys held: idle keys do not leave", m.Len())
	}
}

func TestMemoryClocked(t *testing.T) {
	backendtest.RunClocked(t, func(t *testing.T, clock *backendtest.Clock) backend.Backend {
		m, err := backend.NewMemory(backend.MemoryOptions{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}

// TestMemoryCountsWindowState: a window algorithm's state counts against MaxBytes on top of
// the key's fixed cost, a sliding log by its length, and leaves with its key.
func TestMemoryCountsWindowState(t *testing.T) {
	now := time.Date(2026, 11, 11, 12, 0, 30, 0, time.UTC)
	m, err := backend.NewMemory(backend.MemoryOptions{Shards: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	decideOne(t, m, backend.Request{Key: "gcra", Limit: backendtest.PerMinute(limit.GCRA, 3), Cost: 1})
	decideOne(t, m, backend.Request{Key: "fixd", Limit: backendtest.PerMinute(limit.FixedWindow, 3), Cost: 1})
	decideOne(t, m, backend.Request{Key: "slog", Limit: backendtest.PerMinute(limit.SlidingLog, 3), Cost: 1})
	decideOne(t, m, backend.Request{Key: "conc", Limit: limit.Limit{Rate: 3, Burst: 3, Period: time.Minute, Algorithm: limit.Concurrency}, Cost: 1, Slot: "id-1"})
	// 4-byte keys at 112 bytes each; an extState of 72 bytes; a log of cap 2 (one entry); a
	// slot of 24 bytes and its 4-byte id.
	if got, want := m.Bytes(), int64(4*(4+112)+72+72+16+72+24+4); got != want {
		t.Fatalf("bytes %d, want %d", got, want)
	}
	if err := m.Reset(context.Background(), []string{"gcra", "fixd", "slog", "conc"}); err != nil {
		t.Fatal(err)
	}
	if m.Bytes() != 0 || m.Len() != 0 {
		t.Fatalf("after reset: %d keys, %d bytes", m.Len(), m.Bytes())
	}
}

func TestMemorySlots(t *testing.T) {
	backendtest.RunSlots(t, func(t *testing.T, clock *backendtest.Clock) backend.Backend {
		m, err := backend.NewMemory(backend.MemoryOptions{Now: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}
