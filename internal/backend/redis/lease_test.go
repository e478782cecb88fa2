package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

const testLifetime = 50 * time.Millisecond

// newLeasedBackends returns n backends on the Redis in env, sharing one key prefix, as n
// replicas of rls would, with leases of lifetime (0: none).
func newLeasedBackends(t *testing.T, env string, n int, lifetime time.Duration) []*Backend {
	t.Helper()
	prefix := fmt.Sprintf("lease-%d:", time.Now().UnixNano())
	var bs []*Backend
	for range n {
		bs = append(bs, newTestBackend(t, env, Options{Coalesce: 16, KeyPrefix: prefix, LeaseLifetime: lifetime}))
	}
	return bs
}

// check reads key's state under l without charging it.
func check(t *testing.T, b *Backend, key string, l limit.Limit) backend.Decision {
	t.Helper()
	out := make([]backend.Decision, 1)
	if _, err := b.core.Decide(context.Background(), []backend.Request{{Key: key, Limit: l}}, out); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// holdLease sends requests on key to b, from a few goroutines, until b holds a lease on it with
// at least least hits left, and returns how many were admitted.
func holdLease(t *testing.T, b *Backend, key string, l limit.Limit, least int64) int64 {
	t.Helper()
	var admitted atomic.Int64
	deadline := time.Now().Add(10 * time.Second)
	for b.leases.held.Load() < least {
		if time.Now().After(deadline) {
			t.Fatalf("no lease on %s after 10s of requests (leases charged %d)", key, b.leases.taken.Load())
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				out := make([]backend.Decision, 1)
				for range 20 {
					ok, err := b.Decide(context.Background(), []backend.Request{{Key: key, Limit: l, Cost: 1}}, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
					if b.leases.held.Load() >= least {
						return
					}
				}
			})
		}
		wg.Wait()
	}
	return admitted.Load()
}

// TestLeaseHotKey: a hot key far below its limit is decided mostly without Redis: script calls
// are a small fraction of decisions, and every decision is admitted.
func TestLeaseHotKey(t *testing.T) {
	for _, env := range []string{singleEnv, clusterEnv} {
		t.Run(env, func(t *testing.T) {
			b := newLeasedBackends(t, env, 1, testLifetime)[0]
			counter := &commandCounter{calls: make(chan string, 1<<20)}
			b.rdb.AddHook(counter)
			if b.cluster {
				for _, n := range b.topo.Load().masters {
					n.rdb.AddHook(counter)
				}
			}
			l := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
			var decided, denied atomic.Int64
			stop := time.Now().Add(time.Second)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					out := make([]backend.Decision, 1)
					for time.Now().Before(stop) {
						ok, err := b.Decide(context.Background(), []backend.Request{{Key: "hot", Limit: l, Cost: 1}}, out)
						if err != nil {
							t.Error(err)
							return
						}
						decided.Add(1)
						if !ok {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			calls := counter.count()
			t.Logf("%d decisions, %d Redis commands, %d from leases, %d leases, %d hits given back",
				decided.Load(), calls, b.leases.local.Load(), b.leases.taken.Load(), b.leases.returned.Load())
			if denied.Load() > 0 {
				t.Fatalf("%d of %d denied, far below the limit", denied.Load(), decided.Load())
			}
			if int64(calls)*5 > decided.Load() {
				t.Fatalf("%d Redis commands for %d decisions: want fewer than a fifth", calls, decided.Load())
			}
			if b.leases.local.Load() == 0 || b.leases.taken.Load() == 0 {
				t.Fatal("no decision from a lease")
			}
		})
	}
}

// TestLeaseExact is the race experiment with leases: three replicas, two callers each, on one
// key of 1000 hits whose budget does not grow (the script's clock stands still, at the start of
// a 10s window, so that the key's expiry in Redis is 10s away), 4000 requests: exactly 1000 are
// admitted, leases were taken, and once the replicas close (giving back what their leases hold)
// Redis holds exactly the hits admitted.
func TestLeaseExact(t *testing.T) {
	for _, tc := range []struct {
		env string
		alg limit.Algorithm
	}{{singleEnv, limit.GCRA}, {singleEnv, limit.FixedWindow}, {clusterEnv, limit.GCRA}} {
		t.Run(tc.env+"/"+tc.alg.String(), func(t *testing.T) {
			// A lease is at most what the rate restores in a lifetime: 10 hits.
			bs := newLeasedBackends(t, tc.env, 3, 100*time.Millisecond)
			now := time.Now().UnixMicro()/10e6*10e6 + 1
			for _, b := range bs {
				b.scriptNow = func() int64 { return now }
			}
			l := limit.Limit{Rate: 1000, Period: 10 * time.Second, Burst: 1000, Algorithm: tc.alg}
			var admitted, sent atomic.Int64
			var wg sync.WaitGroup
			for c := range 6 {
				b := bs[c%3]
				wg.Go(func() {
					out := make([]backend.Decision, 1)
					for sent.Add(1) <= 4000 {
						ok, err := b.Decide(context.Background(), []backend.Request{{Key: "race", Limit: l, Cost: 1}}, out)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			var taken uint64
			for _, b := range bs {
				taken += b.leases.taken.Load()
			}
			t.Logf("admitted %d of 4000; %d leases", admitted.Load(), taken)
			if admitted.Load() != 1000 {
				t.Fatalf("admitted %d of 4000, want exactly 1000", admitted.Load())
			}
			if taken == 0 {
				t.Fatal("no lease was taken: the test did not exercise leases")
			}
			for _, b := range bs {
				b.Close()
			}
			probe := newTestBackend(t, tc.env, Options{KeyPrefix: bs[0].prefix})
			probe.scriptNow = bs[0].scriptNow
			if d := check(t, probe, "race", l); d.Remaining != 0 {
				t.Fatalf("after close: %d remaining in Redis, want 0", d.Remaining)
			}
		})
	}
}

// TestLeaseMixed: a batch of a leased key and a key at its limit is decided all or nothing: the
// leased hits are taken only when Redis admits the rest, and put back otherwise.
func TestLeaseMixed(t *testing.T) {
	b := newLeasedBackends(t, singleEnv, 1, 10*time.Second)[0]
	now := time.Now().UnixMicro()
	b.scriptNow = func() int64 { return now }
	hot := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	small := limit.Limit{Rate: 2, Period: time.Hour, Burst: 2}
	// Three hits at least: the two batches admitted take two, and a lease used up would be
	// replaced by the next request's.
	holdLease(t, b, "hot", hot, 3)
	held := b.leases.held.Load()
	before := check(t, b, "hot", hot).Remaining
	reqs := []backend.Request{{Key: "hot", Limit: hot, Cost: 1}, {Key: "small", Limit: small, Cost: 1}}
	out := make([]backend.Decision, 2)
	for i := range 6 {
		ok, err := b.Decide(context.Background(), reqs, out)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 2; ok != want {
			t.Fatalf("batch %d: admitted %v, want %v", i, ok, want)
		}
		if !out[0].Allowed || out[1].Allowed != (i < 2) {
			t.Fatalf("batch %d: decisions %+v", i, out)
		}
	}
	if got := b.leases.held.Load(); got != held-2 {
		t.Fatalf("lease holds %d hits after 2 admitted and 4 refused batches, want %d (%d before)", got, held-2, held)
	}
	if got := check(t, b, "hot", hot).Remaining; got != before {
		t.Fatalf("hot key's remaining in Redis %d, want %d: the leased hits were charged there already", got, before)
	}
}

// TestLeaseGivenBack: a rule reload (PurgeCache) and Close give back what leases hold: Redis
// then holds exactly the hits admitted.
func TestLeaseGivenBack(t *testing.T) {
	for _, how := range []string{"reload", "close"} {
		t.Run(how, func(t *testing.T) {
			bs := newLeasedBackends(t, singleEnv, 2, 10*time.Second)
			b, other := bs[0], bs[1]
			now := time.Now().UnixMicro()
			b.scriptNow = func() int64 { return now }
			other.scriptNow = b.scriptNow
			l := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
			admitted := holdLease(t, b, "k", l, 1)
			held := b.leases.held.Load()
			if d := check(t, other, "k", l); d.Remaining != l.Burst-admitted-held {
				t.Fatalf("with a lease of %d: %d remaining, want %d", held, d.Remaining, l.Burst-admitted-held)
			}
			if how == "reload" {
				b.PurgeCache()
				deadline := time.Now().Add(5 * time.Second)
				for b.leases.returned.Load() < uint64(held) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			} else {
				b.Close()
			}
			if got := b.leases.returned.Load(); got != uint64(held) {
				t.Fatalf("%d hits given back, want the %d held", got, held)
			}
			if d := check(t, other, "k", l); d.Remaining != l.Burst-admitted {
				t.Fatalf("after the %s: %d remaining, want %d", how, d.Remaining, l.Burst-admitted)
			}
		})
	}
}

// TestLeaseBound: a lease is never more than the key's rate restores in one lifetime, so a
// replica that dies holding one delays the key's budget by at most a lifetime. With Redis's
// clock, a replica takes a lease and drops it without giving it back (as if killed): the key's
// reset is at most a lifetime away, and a lifetime later the key has a full burst again.
func TestLeaseBound(t *testing.T) {
	lifetime := 200 * time.Millisecond
	bs := newLeasedBackends(t, singleEnv, 2, lifetime)
	b, other := bs[0], bs[1]
	l := limit.Limit{Rate: 10_000, Period: time.Second, Burst: 10_000}
	admitted := holdLease(t, b, "k", l, 1)
	held := b.leases.held.Load()
	if max := l.Rate * int64(lifetime) / int64(l.Period); held > max {
		t.Fatalf("lease of %d hits: more than the %d the rate restores in a lifetime", held, max)
	}
	b.leases.forget([]string{"k"}) // dropped, as by a replica killed
	d := check(t, other, "k", l)
	t.Logf("lease of %d dropped: %d remaining, reset after %v", held, d.Remaining, d.ResetAfter)
	// The hits admitted take their own time to be restored: at most theirs, and the lifetime.
	if bound := lifetime + time.Duration(admitted)*l.Period/time.Duration(l.Rate); d.ResetAfter > bound {
		t.Fatalf("reset after %v with a lease of %d dropped and %d admitted: want at most the lifetime and theirs, %v",
			d.ResetAfter, held, admitted, bound)
	}
	time.Sleep(d.ResetAfter)
	if d := check(t, other, "k", l); d.Remaining != l.Burst {
		t.Fatalf("%v after: %d remaining, want the full %d", d.ResetAfter, d.Remaining, l.Burst)
	}
}

// TestJobGrowsOverSlots: one backend decides batches of 1 to 64 keys on as many Cluster slots,
// growing and reusing its pooled jobs (as the refunds of many leases do at once): each is
// decided, none panics.
func TestJobGrowsOverSlots(t *testing.T) {
	b := newTestBackend(t, clusterEnv, Options{})
	l := limit.Limit{Rate: 100, Period: time.Second, Burst: 100}
	for n := 1; n <= 64; n++ {
		reqs := make([]backend.Request, n)
		for i := range reqs {
			reqs[i] = backend.Request{Key: fmt.Sprintf("grow-%d-%d", n, i), Limit: l, Cost: 1}
		}
		out := make([]backend.Decision, n)
		ok, err := b.Decide(context.Background(), reqs, out)
		if err != nil || !ok {
			t.Fatalf("%d keys: admitted=%v err=%v", n, ok, err)
		}
	}
}

// TestLeaseRefundsBesideAStalledMaster: on a Cluster, leases on keys of two masters end while
// one master is stopped (SIGSTOP): the healthy master gets back exactly what its key's lease
// held, and only the stopped master's refund is dropped.
func TestLeaseRefundsBesideAStalledMaster(t *testing.T) {
	c, b := startOwnCluster(t, Options{Timeout: 200 * time.Millisecond, HealthInterval: -1, LeaseLifetime: 10 * time.Second})
	now := time.Now().UnixMicro()
	b.scriptNow = func() int64 { return now }
	byMaster := keysByMaster(t, c, b, "lr-", 1)
	masters := c.Masters()
	healthy, stalled := byMaster[masters[0]][0], byMaster[masters[1]][0]
	l := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
	admitted := holdLease(t, b, healthy, l, 1)
	heldHealthy := b.leases.held.Load()
	holdLease(t, b, stalled, l, heldHealthy+1)
	heldStalled := b.leases.held.Load() - heldHealthy

	c.Stop(masters[1])
	defer c.Cont(masters[1])
	b.leases.endExpired(true)
	b.leases.giveBack()
	if got := int64(b.leases.returned.Load()); got != heldHealthy {
		t.Errorf("%d hits given back, want the healthy master's %d", got, heldHealthy)
	}
	if got := int64(b.leases.dropped.Load()); got != heldStalled {
		t.Errorf("%d hits dropped, want the stalled master's %d", got, heldStalled)
	}
	if d := check(t, b, healthy, l); d.Remaining != l.Burst-admitted {
		t.Fatalf("healthy master's key: %d remaining, want %d: its lease's %d hits not given back", d.Remaining, l.Burst-admitted, heldHealthy)
	}
}
