package redis

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/redistest"
)

// TestClusterNodeLeavesMap: a master that hands all its slots to the others leaves the slot map;
// within a reload of the map its node is closed: its goroutines end (health check, senders),
// rls's connections to it close (the decisions', the probe's, the control client's), its metric
// series go, and a decision that still held it fails as Redis unavailable, at once.
func TestClusterNodeLeavesMap(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 4, Replicas: -1})
	masters := c.Masters()
	leaving, to := masters[3], masters[0]
	var key string
	for i := 0; key == ""; i++ {
		if k := "leave-" + strconv.Itoa(i); c.MasterFor("rls:"+k) == leaving {
			key = k
		}
	}
	// The test's own connections to leaving are named, and those open before rls starts are
	// counted out: what is left is rls's.
	admin := map[string]*goredis.Client{}
	for _, a := range masters {
		admin[a] = namedClient(t, a)
	}
	before := clientIDs(t, admin[leaving])
	target, err := ParseURL("redis-cluster://" + strings.Join(masters[:3], ","))
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target, KeyPrefix: "rls:", Coalesce: 8, CoalescePipelines: 2,
		HealthInterval: 20 * time.Millisecond, Timeout: 5 * time.Second, ReadTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	out := make([]backend.Decision, 1)
	if _, err := b.Decide(context.Background(), []backend.Request{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	n := b.topo.Load().owner[slot(storedKey(b.prefix, key))]
	if n == nil || n.name != leaving {
		t.Fatalf("the key's node %v, want %s", n, leaving)
	}
	waitFor(t, "the probe's connection", func() bool { return rlsClients(t, admin[leaving], before) >= 2 })
	if got := goroutinesIn("(*node).healthLoop"); got != 4 {
		t.Fatalf("%d health checks, want 4", got)
	}
	if got := goroutinesIn("pipeline.(*Coalescer[...]).run"); got != 8 {
		t.Fatalf("%d senders, want 8", got)
	}
	if !seriesOf(t, b, leaving) {
		t.Fatalf("no metric series of %s", leaving)
	}

	// Every slot of leaving goes to another master, and leaving stays a master of none (not a
	// replica of the master that took its last slot): it is no longer in CLUSTER SLOTS.
	if err := admin[leaving].ConfigSet(context.Background(), "cluster-allow-replica-migration", "no").Err(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	moveAllSlots(t, admin, leaving, to)
	t.Logf("slots moved in %v", time.Since(began))
	b.topo.requestReload(reasonPeriodic)
	waitFor(t, "the node closed", func() bool {
		n.closeMu.Lock()
		defer n.closeMu.Unlock()
		return n.closed
	})
	waitFor(t, "its goroutines ended", func() bool {
		return goroutinesIn("(*node).healthLoop") == 3 && goroutinesIn("pipeline.(*Coalescer[...]).run") == 6
	})
	waitFor(t, "its connections closed", func() bool {
		if n := rlsClients(t, admin[leaving], before); n != 0 {
			list, _ := admin[leaving].ClientList(context.Background()).Result()
			t.Logf("%d connections:\n%s", n, list)
			return false
		}
		return true
	})
	if seriesOf(t, b, leaving) {
		t.Fatalf("metric series of %s after it left the slot map", leaving)
	}
	if _, err := b.Decide(context.Background(), []backend.Request{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
		t.Fatalf("the key, now on %s: %v", to, err)
	}

	// A decision that took the node from the map before it was closed.
	j := newJob()
	if err := j.plan(b, []backend.Request{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	j.groups = j.groups[:0]
	j.addToGroup(n, &j.calls[0])
	start := time.Now()
	if err := j.sendGroups(context.Background(), time.Now().Add(5*time.Second)); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("a decision on the closed node: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a decision on the closed node took %v", d)
	}
	n.kickProbe() // starts nothing
	if n.probing.Load() || n.probeSent.Load() != 0 {
		t.Fatal("a probe started on a closed node")
	}
}

// moveAllSlots moves every slot of the master from, and its keys, to the master to, as redis-cli
// --cluster reshard does one slot at a time: here each step is one pipeline for all of them.
func moveAllSlots(t *testing.T, admin map[string]*goredis.Client, from, to string) {
	t.Helper()
	ctx := context.Background()
	src, dst := admin[from], admin[to]
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	cmd := goredis.NewClusterSlotsCmd(ctx, "cluster", "slots")
	_ = src.Process(ctx, cmd)
	ranges, err := cmd.Result()
	if err != nil {
		t.Fatal(err)
	}
	var slots []int
	for _, r := range ranges {
		if len(r.Nodes) > 0 && r.Nodes[0].ID == srcID {
			for s := r.Start; s <= r.End; s++ {
				slots = append(slots, s)
			}
		}
	}
	step := func(cl *goredis.Client, args ...any) {
		t.Helper()
		pipe := cl.Pipeline()
		for _, s := range slots {
			a := append([]any{"cluster", "setslot", s}, args...)
			pipe.Do(ctx, a...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("CLUSTER SETSLOT %v on %s: %v", args, cl.Options().Addr, err)
		}
	}
	step(dst, "importing", srcID)
	step(src, "migrating", dstID)
	keys, err := src.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(to)
	for _, k := range keys {
		if err := src.Migrate(ctx, host, port, k, 0, 5*time.Second).Err(); err != nil {
			t.Fatalf("MIGRATE %s: %v", k, err)
		}
	}
	step(dst, "node", dstID)
	step(src, "node", dstID)
	for addr, cl := range admin {
		if addr != from && addr != to {
			step(cl, "node", dstID)
		}
	}
}

// goroutinesIn counts the goroutines whose stack holds fn.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			count++
		}
	}
	return count
}

// namedClient is a client of the node at addr whose connections are named rls-test.
func namedClient(t *testing.T, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 2, OnConnect: func(ctx context.Context, cn *goredis.Conn) error {
		return cn.ClientSetName(ctx, "rls-test").Err()
	}})
	t.Cleanup(func() { c.Close() })
	return c
}

// clientIDs returns the ids of the connections to admin's node.
func clientIDs(t *testing.T, admin *goredis.Client) map[string]bool {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		id, _, _ := strings.Cut(line, " ")
		ids[id] = true
	}
	return ids
}

// rlsClients counts the connections to admin's node but for the test's own: named rls-test, or
// open before (in before).
func rlsClients(t *testing.T, admin *goredis.Client, before map[string]bool) int {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		id, _, _ := strings.Cut(line, " ")
		if !before[id] && !strings.Contains(line, " name=rls-test ") {
			n++
		}
	}
	return n
}

// seriesOf reports whether b's metrics hold a series of the node at addr.
func seriesOf(t *testing.T, b *Backend, addr string) bool {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "node" && lp.GetValue() == addr {
					return true
				}
			}
		}
	}
	return false
}
