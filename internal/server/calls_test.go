package server

import (
	"context"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/tap"

	"github.com/rls-project/rls/internal/rlstest"
)

const srl = rlsv3.RateLimitService_ShouldRateLimit_FullMethodName

func testGate(t testing.TB, timeout time.Duration, max int64) *callGate {
	t.Helper()
	g, err := newCallGate(timeout, max, prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	g.unary = map[string]bool{srl: true}
	return g
}

func (g *callGate) openCalls() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// age makes c look as if it had been waiting for its message for evictAfter.
func (g *callGate) age(c *call) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c.start = c.start.Add(-evictAfter)
}

// open opens a call as gRPC does: a stream context the transport cancels when the call ends,
// passed through the tap.
func open(g *callGate) (ctx context.Context, end context.CancelFunc, err error) {
	stream, end := context.WithCancel(context.Background())
	ctx, err = g.tap(stream, &tap.Info{FullMethodName: srl})
	if err != nil {
		end()
	}
	return ctx, end, err
}

// awaitOpen waits until the gate counts n calls open: a call's end runs on a goroutine of its
// own once its stream's context is cancelled.
func awaitOpen(t *testing.T, g *callGate, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for g.openCalls() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls open, want %d", g.openCalls(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// At the bound a call is refused while the calls open are younger than evictAfter or have
// their message; past it the oldest still waiting for its message gives its place and is
// cancelled, and its end gives back nothing.
func TestCallGateEvictsOldestWaiting(t *testing.T) {
	g := testGate(t, 0, 2)
	old, endOld, err := open(g)
	if err != nil {
		t.Fatal(err)
	}
	defer endOld()
	arrived, endArrived, err := open(g)
	if err != nil {
		t.Fatal(err)
	}
	defer endArrived()
	arrived.Value(callKey{}).(*call).arrived()
	if _, _, err := open(g); err != errTooManyCalls {
		t.Fatalf("a third call at once: %v, want refused", err)
	}
	g.age(old.Value(callKey{}).(*call)) // as if waiting a second
	third, endThird, err := open(g)
	if err != nil {
		t.Fatalf("a third call with one waiting a second: %v", err)
	}
	defer endThird()
	if context.Cause(old) != errEvicted || arrived.Err() != nil || third.Err() != nil {
		t.Fatalf("causes: oldest %v, arrived %v, new %v; want only the oldest evicted", context.Cause(old), context.Cause(arrived), context.Cause(third))
	}
	if got := rlstest.CounterValue(t, g.slow.WithLabelValues(reasonEvicted)); got != 1 {
		t.Fatalf("evicted counted %v, want 1", got)
	}
	endOld() // the evicted call ends: its place is the new call's already
	time.Sleep(10 * time.Millisecond)
	awaitOpen(t, g, 2)
	endArrived()
	endThird()
	awaitOpen(t, g, 0)
}

// A call whose message has not arrived by the deadline is cancelled and counted; one whose
// message arrived is not.
func TestCallGateMessageTimeout(t *testing.T) {
	g := testGate(t, 50*time.Millisecond, 0)
	slow, endSlow, _ := open(g)
	defer endSlow()
	prompt, endPrompt, _ := open(g)
	defer endPrompt()
	prompt.Value(callKey{}).(*call).arrived()
	select {
	case <-slow.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the slow call was not cancelled")
	}
	if context.Cause(slow) != errSlowMessage {
		t.Fatalf("cause %v", context.Cause(slow))
	}
	time.Sleep(100 * time.Millisecond)
	if prompt.Err() != nil {
		t.Fatalf("the call whose message arrived was cancelled: %v", context.Cause(prompt))
	}
	if got := rlstest.CounterValue(t, g.slow.WithLabelValues(reasonTimeout)); got != 1 {
		t.Fatalf("message timeouts counted %v, want 1", got)
	}
}

// Calls opening, arriving, timing out, being evicted and ending all at once never hold more
// places than the bound, and give every place back.
func TestCallGateConcurrent(t *testing.T) {
	const bound = 8
	g := testGate(t, 5*time.Millisecond, bound)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 200 {
				ctx, end, err := open(g)
				if n := g.openCalls(); n > bound {
					t.Errorf("%d calls open, bound %d", n, bound)
				}
				if err != nil {
					continue
				}
				c := ctx.Value(callKey{}).(*call)
				switch (w + i) % 4 {
				case 0: // a prompt call: its handler returns
					c.arrived()
					if c.stopEnd() {
						c.end()
					}
					end()
				case 1: // its message arrives late, or never
					time.Sleep(time.Duration(i%3) * 3 * time.Millisecond)
					c.arrived()
					end()
				case 2: // evictable at once
					g.age(c)
					go func() { time.Sleep(time.Millisecond); end() }()
				default: // reset by its client
					end()
				}
			}
		})
	}
	wg.Wait()
	awaitOpen(t, g, 0)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.arriving.head != nil || g.arriving.tail != nil {
		t.Fatal("calls left on the list of calls waiting for their message")
	}
}

// Each call waiting for its message is cancelled at its own deadline, never before: the gate's
// one timer is armed again for the next oldest call after each sweep, and rests once no call
// waits.
func TestCallGateMessageTimeoutEach(t *testing.T) {
	const timeout = 60 * time.Millisecond
	g := testGate(t, timeout, 4)
	type opened struct {
		ctx   context.Context
		start time.Time
	}
	var calls []opened
	for range 3 {
		start := time.Now()
		ctx, end, err := open(g)
		if err != nil {
			t.Fatal(err)
		}
		defer end()
		calls = append(calls, opened{ctx, start})
		time.Sleep(timeout / 3)
	}
	for i, c := range calls {
		select {
		case <-c.ctx.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("call %d was not cancelled", i)
		}
		if waited := time.Since(c.start); waited < timeout {
			t.Errorf("call %d cancelled after %v, before its deadline of %v", i, waited, timeout)
		}
		if context.Cause(c.ctx) != errSlowMessage {
			t.Errorf("call %d: cause %v", i, context.Cause(c.ctx))
		}
	}
	awaitOpen(t, g, 0)
	if got := rlstest.CounterValue(t, g.slow.WithLabelValues(reasonTimeout)); got != 3 {
		t.Fatalf("message timeouts counted %v, want 3", got)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed || g.arriving.head != nil {
		t.Fatalf("armed %v with calls listed %v: want the timer at rest and the list empty", g.armed, g.arriving.head != nil)
	}
}

// BenchmarkCallGate: an ordinary call's way through the gate: its headers (the tap), its
// message (the interceptor), its handler, its end.
func BenchmarkCallGate(b *testing.B) {
	g := testGate(b, defaultGRPCMessageTimeout, defaultGRPCMaxCalls)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ctx, end, err := open(g)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = g.interceptor(ctx, nil, nil, func(context.Context, any) (any, error) { return nil, nil })
			end()
		}
	})
}
