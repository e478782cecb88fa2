package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/redistest"
)

// startOwnCluster starts a Cluster of three masters without replicas, for a test that changes
// it, and a backend on it. (With two, a master that stops leaves the other in a minority,
// refusing every key.)
func startOwnCluster(t *testing.T, opts Options) (*redistest.Cluster, *Backend) {
	t.Helper()
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, Replicas: -1, PartialCoverage: true})
	target, err := ParseURL(c.URL())
	if err != nil {
		t.Fatal(err)
	}
	opts.Target = target
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = "f:"
	}
	b, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if !b.Healthy() {
		t.Fatal("backend not healthy on a new Cluster")
	}
	return c, b
}

// keysByMaster returns n keys on each master of c, named prefix and a number.
func keysByMaster(t *testing.T, c *redistest.Cluster, b *Backend, prefix string, n int) map[string][]string {
	t.Helper()
	var keys, stored []string
	for i := range 64 * n {
		k := prefix + strconv.Itoa(i)
		keys, stored = append(keys, k), append(stored, storedKey(b.prefix, k))
	}
	out := map[string][]string{}
	for i, m := range c.Owners(stored) {
		if len(out[m]) < n {
			out[m] = append(out[m], keys[i])
		}
	}
	return out
}

// scriptCalls returns the script calls node addr ran.
func scriptCalls(t *testing.T, c *redistest.Cluster, addr string) int64 {
	t.Helper()
	n, err := redistest.ScriptRuns(context.Background(), c.Client(addr))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A call whose slot moved to another master (MOVED: it ran nothing) is sent once to the new
// owner and decided there; the old owner ran nothing, and the slot map is reloaded.
func TestClusterMovedSentOnce(t *testing.T) {
	c, b := startOwnCluster(t, Options{Timeout: 5 * time.Second, HealthInterval: -1})
	ctx := context.Background()
	byMaster := keysByMaster(t, c, b, "mv-", 2)
	masters := c.Masters()
	from, to := masters[0], masters[1]
	l := limit.Limit{Rate: 10, Period: time.Hour, Burst: 10}
	decide := func(key string) error {
		_, err := b.Decide(ctx, []backend.Request{{Key: key, Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		return err
	}
	// The first key warms the connections; the second's slot is moved before rls knows it.
	if err := decide(byMaster[from][0]); err != nil {
		t.Fatal(err)
	}
	key := byMaster[from][1]
	s := slot(storedKey(b.prefix, key))
	toID, err := c.Client(to).ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{to, from} {
		if err := c.Client(m).Do(ctx, "cluster", "setslot", s, "node", toID).Err(); err != nil {
			t.Fatalf("moving slot %d to %s on %s: %v", s, to, m, err)
		}
	}
	fromRan := scriptCalls(t, c, from)
	toRan := scriptCalls(t, c, to)
	movedBefore := b.topo.reloads[0].Load()
	if err := decide(key); err != nil {
		t.Fatalf("deciding a key whose slot moved: %v, want it decided by the new owner", err)
	}
	fromAfter := scriptCalls(t, c, from)
	toAfter := scriptCalls(t, c, to)
	if fromAfter != fromRan || toAfter != toRan+1 {
		t.Fatalf("script calls run: old owner %d → %d, new owner %d → %d; want the old owner none and the new one 1",
			fromRan, fromAfter, toRan, toAfter)
	}
	stored := storedKey(b.prefix, key)
	if n, err := c.Client(to).Exists(ctx, stored).Result(); err != nil || n != 1 {
		t.Fatalf("the key's state on the new owner: %d, %v; want it there", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.topo.reloads[0].Load() == movedBefore || b.topo.Load().owner[s].name != to {
		if time.Now().After(deadline) {
			t.Fatalf("the slot map was not reloaded after MOVED (moved reloads %d)", b.topo.reloads[0].Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A master that hangs fails only the decisions on its slots: the other master's keys are
// decided throughout, the hung master's fail as Redis slow and then, once its breaker opens,
// at once; the backend stays healthy and says it is degraded. After it answers again, its keys
// are decided again.
func TestClusterHungMasterFailsOnlyItsSlots(t *testing.T) {
	c, b := startOwnCluster(t, Options{Timeout: 50 * time.Millisecond, BreakerCooldown: 100 * time.Millisecond, ProbeTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	byMaster := keysByMaster(t, c, b, "hung-", 8)
	pairKeys := keysByMaster(t, c, b, "pair-", 1)
	masters := c.Masters()
	hung, healthy := masters[0], masters[1]
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	decide := func(key string) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := b.Decide(ctx, []backend.Request{{Key: key, Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		return err
	}
	for _, k := range append(byMaster[hung], byMaster[healthy]...) {
		if err := decide(k); err != nil {
			t.Fatal(err)
		}
	}
	// A key of the healthy master asked alone and beside a key of the hung one: what the
	// healthy master charged for a decision that failed is given back.
	tight := limit.Limit{Rate: 1, Period: time.Hour, Burst: 100}
	pair := []backend.Request{{Key: pairKeys[healthy][0], Limit: tight, Cost: 1}, {Key: pairKeys[hung][0], Limit: tight, Cost: 1}}
	out := make([]backend.Decision, 2)
	if _, err := b.Decide(ctx, pair, out); err != nil || out[0].Remaining != 99 {
		t.Fatalf("the pair before the fault: %v, %+v", err, out)
	}
	c.Stop(hung)
	stopped := time.Now()
	var healthyErrs, slow, open, others, pairs int
	for time.Since(stopped) < time.Second { // less than cluster-node-timeout: no failover
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := b.Decide(ctx, pair, out); err == nil {
			t.Fatal("a pair with a key of the hung master decided")
		}
		cancel()
		pairs++
		for _, k := range byMaster[healthy] {
			if err := decide(k); err != nil {
				healthyErrs++
				t.Logf("healthy master's key %s: %v", k, err)
			}
		}
		err := decide(byMaster[hung][0])
		n := b.topo.nodeFor(hung)
		switch {
		case errors.Is(err, n.errOpen):
			open++
		case errors.Is(err, n.errSlow):
			slow++
		case err != nil:
			others++
		default:
			t.Fatal("a key of the hung master decided")
		}
	}
	if healthyErrs > 0 {
		t.Errorf("%d failures of the healthy master's keys while the other master hung, want 0", healthyErrs)
	}
	if open == 0 {
		t.Errorf("the hung master's breaker never opened (slow %d, other errors %d)", slow, others)
	}
	if !b.Healthy() || !strings.Contains(b.Degraded(), "slots unavailable") {
		t.Errorf("healthy %v, degraded %q with one master down: want healthy and degraded", b.Healthy(), b.Degraded())
	}
	if b.topo.nodeFor(hung).slow.Load() == 0 {
		t.Errorf("no decision counted as Redis slow (slow errors seen %d, overload and others %d)", slow, others)
	}
	t.Logf("hung master: %d failed as slow, %d fast with the breaker open, %d otherwise (overload)", slow, open, others)
	c.Cont(hung)
	deadline := time.Now().Add(5 * time.Second)
	for decide(byMaster[hung][0]) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the master's keys not decided 5 s after it answered again")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b.Degraded() != "" {
		t.Errorf("degraded %q with every master answering", b.Degraded())
	}
	time.Sleep(1500 * time.Millisecond) // the charges given back in the background: within 1 s
	alone := []backend.Request{pair[0]}
	if _, err := b.Decide(ctx, alone, out[:1]); err != nil || out[0].Remaining != 98 {
		t.Fatalf("the healthy key of %d failed pairs: %v, remaining %d; want 98 (each failed pair's charge given back)", pairs, err, out[0].Remaining)
	}
}

// A master that lost its data is found by its epoch key, once per loss.
func TestClusterStateLossFound(t *testing.T) {
	c, b := startOwnCluster(t, Options{HealthInterval: 50 * time.Millisecond})
	masters := c.Masters()
	// Wait until every master's epoch is known.
	deadline := time.Now().Add(5 * time.Second)
	for _, m := range masters {
		for !b.topo.nodeFor(m).epochKnown() {
			if time.Now().After(deadline) {
				t.Fatalf("no epoch known for %s", m)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if n := b.resets.Load(); n != 0 {
		t.Fatalf("%d data losses found on a new Cluster", n)
	}
	if err := c.Client(masters[1]).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for b.resets.Load() == 0 {
		if time.Now().After(deadline.Add(5 * time.Second)) {
			t.Fatal("a flushed master not found")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // several intervals
	if n := b.resets.Load(); n != 1 {
		t.Fatalf("%d data losses counted for one flush, want 1", n)
	}
}
