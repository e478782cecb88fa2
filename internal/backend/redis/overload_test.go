package redis

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/redistest"
)

// healthLog records a backend's health changes.
type healthLog struct {
	mu      sync.Mutex
	changes []bool
}

func watchHealth(b *Backend) *healthLog {
	h := &healthLog{}
	b.SubscribeHealth(func(up bool) { h.mu.Lock(); h.changes = append(h.changes, up); h.mu.Unlock() })
	return h
}

func (h *healthLog) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s []string
	for _, up := range h.changes {
		s = append(s, map[bool]string{true: "up", false: "down"}[up])
	}
	return "[" + strings.Join(s, " ") + "]"
}

// newOwnBackend starts a redis-server for this test alone and connects with production
// defaults, opts fields that are set kept.
func newOwnBackend(t *testing.T, opts Options) (*Backend, *redistest.Server) {
	t.Helper()
	r := redistest.Start(t)
	target, err := ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Target = target
	b, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if !b.Healthy() {
		t.Fatal("redis not answering")
	}
	return b, r
}

// TestBudget: a decision's budget is the caller's deadline less a margin, capped by Timeout;
// with no deadline, Timeout. A caller whose deadline leaves nothing is shed as overload before
// any Redis command.
func TestBudget(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{Timeout: 50 * time.Millisecond})
	within := func(ctx context.Context, lo, hi time.Duration) {
		t.Helper()
		if got := b.Budget(ctx); got < lo || got > hi {
			t.Fatalf("budget %v, want within [%v, %v]", got, lo, hi)
		}
	}
	within(context.Background(), 50*time.Millisecond, 50*time.Millisecond)
	// Envoy's default, 20ms: half of what is left, whatever time passes before the call.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	d, _ := ctx.Deadline()
	before := time.Until(d)
	got := b.Budget(ctx)
	after := time.Until(d)
	if want := before - before/2; got > want || got < after-max(after/2, 2*time.Millisecond) || got > 10*time.Millisecond {
		t.Fatalf("budget %v with %v to %v left, want half of what is left (at most 10ms)", got, before, after)
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	within(ctx, 50*time.Millisecond, 50*time.Millisecond) // capped

	counter := &commandCounter{calls: make(chan string, 100)}
	b.rdb.AddHook(counter)
	ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	within(ctx, -time.Hour, 0)
	l := limit.Limit{Rate: 10, Period: time.Second, Burst: 10}
	_, err := b.Decide(ctx, []backend.Request{{Key: "tiny", Limit: l, Cost: 1}}, make([]backend.Decision, 1))
	if !errors.Is(err, backend.ErrOverloaded) {
		t.Fatalf("1ms deadline: %v, want ErrOverloaded", err)
	}
	if n := counter.count(); n != 0 {
		t.Fatalf("a shed decision sent %d Redis commands", n)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestOverloadKeepsBreakerClosed saturates this process (one CPU, far more callers than it can
// serve, each with Envoy's 20ms deadline) against a healthy Redis: decisions that cannot finish
// in time are shed as overload, and the breaker never opens.
func TestOverloadKeepsBreakerClosed(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var logs strings.Builder
	var logMu sync.Mutex
	b, _ := newOwnBackend(t, Options{Coalesce: 64, Logger: slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))})
	health := watchHealth(b)
	l := limit.Limit{Rate: 1 << 30, Period: time.Second, Burst: 1 << 30}
	var ok, overload, other atomic.Int64
	var firstOther atomic.Value
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	// Work that competes for the one CPU, as a saturated process's other requests do.
	for range 4 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				for i := 0; i < 1e5; i++ {
					_ = strconv.Itoa(i)
				}
			}
		})
	}
	for g := range 1000 {
		wg.Go(func() {
			out := make([]backend.Decision, 1)
			reqs := []backend.Request{{Key: "o" + strconv.Itoa(g), Limit: l, Cost: 1}}
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				_, err := b.Decide(ctx, reqs, out)
				cancel()
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, backend.ErrOverloaded):
					overload.Add(1)
				default:
					other.Add(1)
					firstOther.CompareAndSwap(nil, err.Error())
				}
			}
		})
	}
	wg.Wait()
	t.Logf("decided %d, shed as overload %d, other errors %d", ok.Load(), overload.Load(), other.Load())
	if h := health.String(); h != "[]" {
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("health changes %s under overload with Redis healthy, want none; log:\n%s", h, logs.String())
	}
	if overload.Load() == 0 {
		t.Fatal("no decision was shed: the test did not overload this process")
	}
	// Under the test's own load most decisions are shed, and on a machine busy with other work
	// all may be: the breaker's state, not their number, is what the test is about. Once the
	// load is gone, Redis decides again at once.
	if _, err := b.Decide(context.Background(), []backend.Request{{Key: "after", Limit: l, Cost: 1}}, make([]backend.Decision, 1)); err != nil {
		t.Fatalf("after the overload: %v", err)
	}
	if other.Load() > overload.Load()/100 {
		t.Fatalf("%d errors other than overload (first: %v), %d overload", other.Load(), firstOther.Load(), overload.Load())
	}
}

// TestTinyDeadlines: many callers with 1ms deadlines beside an ordinary one: they are shed, the
// breaker stays closed, and the ordinary caller is answered normally every time.
func TestTinyDeadlines(t *testing.T) {
	// The ordinary caller's budget is generous: on a loaded machine under the race detector,
	// 50ms can pass waiting for a CPU, which is not what this test is about.
	b, _ := newOwnBackend(t, Options{Coalesce: 64, Timeout: 2 * time.Second})
	health := watchHealth(b)
	l := limit.Limit{Rate: 1 << 30, Period: time.Second, Burst: 1 << 30}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var shed atomic.Int64
	for g := range 32 {
		wg.Go(func() {
			out := make([]backend.Decision, 1)
			reqs := []backend.Request{{Key: "tiny" + strconv.Itoa(g), Limit: l, Cost: 1}}
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				if _, err := b.Decide(ctx, reqs, out); errors.Is(err, backend.ErrOverloaded) {
					shed.Add(1)
				}
				cancel()
				time.Sleep(100 * time.Microsecond) // a caller's own round trip
			}
		})
	}
	defer func() { close(done); wg.Wait() }()
	out := make([]backend.Decision, 1)
	// One request back every hour: none while the test runs, however slow the machine (at
	// 1000 an hour, one came back every 3.6s, and a busy run took longer than that).
	ordinary := limit.Limit{Rate: 1000, Period: 1000 * time.Hour, Burst: 1000}
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ok, err := b.Decide(ctx, []backend.Request{{Key: "ordinary", Limit: ordinary, Cost: 1}}, out)
		cancel()
		if err != nil || !ok || out[0].Remaining != int64(999-i) {
			t.Fatalf("ordinary call %d: admitted=%v err=%v %+v, want admitted with %d remaining", i, ok, err, out[0], 999-i)
		}
	}
	if h := health.String(); h != "[]" {
		t.Fatalf("health changes %s, want none", h)
	}
	if shed.Load() == 0 {
		t.Fatal("no 1ms caller was shed")
	}
}

// TestRedisStopsAnswering: with Redis stopped (SIGSTOP), every decision still answers within its
// budget, the breaker opens once a probe on its own connection gets no answer, and it closes
// again when Redis answers.
func TestRedisStopsAnswering(t *testing.T) {
	b, r := newOwnBackend(t, Options{Coalesce: 64})
	health := watchHealth(b)
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	decide := func(i int) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		budget := b.Budget(ctx)
		start := time.Now()
		_, err := b.Decide(ctx, []backend.Request{{Key: "s" + strconv.Itoa(i), Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		return time.Since(start) - budget, err
	}
	if _, err := decide(0); err != nil {
		t.Fatal(err)
	}
	if err := r.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var opened time.Duration
	var late, veryLate, total atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := 0; time.Since(stopped) < 3*time.Second; i++ {
				over, err := decide(g*1000 + i)
				if !errors.Is(err, backend.ErrUnavailable) {
					t.Errorf("Redis stopped: %v, want ErrUnavailable", err)
					return
				}
				total.Add(1)
				if over > 100*time.Millisecond {
					late.Add(1)
				}
				if over > 900*time.Millisecond {
					veryLate.Add(1)
				}
				time.Sleep(time.Millisecond) // a caller's own round trip
			}
		})
	}
	for b.Healthy() && time.Since(stopped) < 5*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	opened = time.Since(stopped)
	wg.Wait()
	if b.Healthy() {
		t.Fatalf("breaker still closed %v after Redis stopped", opened)
	}
	t.Logf("breaker opened %v after Redis stopped", opened)
	// None waits for Redis (its socket timeout is 1s); on a busy machine a few may wait for a
	// CPU.
	if n, v := late.Load(), veryLate.Load(); v > 0 || n > total.Load()/20 {
		t.Fatalf("of %d decisions, %d answered more than 100ms past their budget, %d more than 900ms", total.Load(), n, v)
	}
	if err := r.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !b.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("breaker still open 5s after Redis came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; ; i++ {
		if _, err := decide(1<<30 + i); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h := health.String(); h != "[down up]" {
		t.Fatalf("health changes %s, want [down up]", h)
	}
}

// TestRefusedCredentials: a Redis that starts refusing this client (requirepass set and the
// connections dropped: every call answers NOAUTH) opens the breaker and reports unhealthy, with
// errors that carry no addresses; once it accepts the client again, the breaker closes.
func TestRefusedCredentials(t *testing.T) {
	b, r := newOwnBackend(t, Options{BreakerCooldown: 20 * time.Millisecond})
	health := watchHealth(b)
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	ctx := context.Background()
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	decide := func() error {
		_, err := b.Decide(ctx, []backend.Request{{Key: "auth", Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		return err
	}
	if err := decide(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "client", "kill", "type", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	var last error
	for i := 0; b.Healthy() && i < 20; i++ {
		last = decide()
		if !errors.Is(last, backend.ErrUnavailable) {
			t.Fatalf("call %d refused by Redis: %v, want ErrUnavailable", i, last)
		}
	}
	if b.Healthy() {
		t.Fatalf("still healthy after 20 refused calls (last: %v)", last)
	}
	if msg := last.Error(); strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, r.Addr()) {
		t.Fatalf("error %q names an address", msg)
	}
	if err := admin.ConfigSet(ctx, "requirepass", "").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !b.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("breaker still open 5s after Redis accepts the client again")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := decide(); err != nil {
		t.Fatalf("after Redis accepts the client again: %v", err)
	}
	if h := health.String(); h != "[down up]" {
		t.Fatalf("health changes %s, want [down up]", h)
	}
}

// TestRedisRefuses: with production defaults, a Redis that is gone (connections refused) fails
// each decision at once with ErrUnavailable, a Redis failure rather than an overload shed, and
// the breaker opens after its threshold of such failures. When Redis is back, the breaker closes
// and stays closed: the decisions that follow succeed, even though the decisions' pool had given
// up dialling (go-redis answers with its last dial error once a pool has failed as many dials
// as its size, until a background dial, once a second, succeeds).
func TestRedisRefuses(t *testing.T) {
	for _, coalesce := range []int{0, 64} {
		t.Run("coalesce="+strconv.Itoa(coalesce), func(t *testing.T) {
			// A pool of 2 gives up after 2 failed dials, before the breaker opens.
			b, r := newOwnBackend(t, Options{Coalesce: coalesce, PoolSize: 2})
			health := watchHealth(b)
			l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
			key := 0
			decide := func() (time.Duration, error) {
				key++
				start := time.Now()
				_, err := b.Decide(context.Background(), []backend.Request{{Key: "r" + strconv.Itoa(key), Limit: l, Cost: 1}}, make([]backend.Decision, 1))
				return time.Since(start), err
			}
			if _, err := decide(); err != nil {
				t.Fatal(err)
			}
			r.Kill()
			killed := time.Now()
			for i := 0; b.Healthy(); i++ {
				took, err := decide()
				if !errors.Is(err, backend.ErrUnavailable) || errors.Is(err, backend.ErrOverloaded) {
					t.Fatalf("decision %d with Redis gone: %v, want a Redis failure (ErrUnavailable, not ErrOverloaded)", i, err)
				}
				// The budget is 50 ms: a refused dial takes far less, unless it is retried.
				if took >= 50*time.Millisecond {
					t.Fatalf("decision %d with Redis gone took %v: the whole budget", i, took)
				}
				if i == 20 {
					t.Fatalf("breaker still closed after %d refused decisions (threshold 5)", i+1)
				}
			}
			t.Logf("breaker opened %v after Redis was killed", time.Since(killed))
			// Long enough for the decisions' pool to be waiting for its background dial.
			time.Sleep(1200 * time.Millisecond)
			r.Start()
			back := time.Now()
			for !b.Healthy() {
				if time.Since(back) > 5*time.Second {
					t.Fatal("breaker still open 5s after Redis came back")
				}
				time.Sleep(time.Millisecond)
			}
			t.Logf("breaker closed %v after Redis came back", time.Since(back))
			for i := range 50 {
				if _, err := decide(); err != nil {
					t.Fatalf("decision %d after the breaker closed: %v (health changes %s)", i, err, health)
				}
			}
			if h := health.String(); h != "[down up]" {
				t.Fatalf("health changes %s, want [down up]", h)
			}
		})
	}
}
