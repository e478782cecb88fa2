package redistest

//lint:file-ignore SA1019 the helper reads the slot map with CLUSTER SLOTS, deprecated since Redis 7.0 but answered by every version; CLUSTER SHARDS would need 7.0

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ClusterOptions says what Redis Cluster StartCluster starts.
type ClusterOptions struct {
	Masters     int           // masters, each with a share of the 16384 slots (default 3)
	Replicas    int           // replicas of each master (default 1; -1 for none)
	NodeTimeout time.Duration // cluster-node-timeout (default 2s)
	// PartialCoverage sets cluster-require-full-coverage no: the masters keep serving their
	// slots while some other slots have no master. By default (yes) every node refuses every
	// key (CLUSTERDOWN) from the moment a master is marked failed until its replica takes over.
	PartialCoverage bool
}

// Cluster is a Redis Cluster of redis-server processes on loopback ports, without persistence,
// stopped when the test ends.
type Cluster struct {
	t     testing.TB
	opts  ClusterOptions
	dir   string // the nodes' directories are in it
	mu    sync.Mutex
	nodes []*clusterNode
	// owned is, by master address, the slot ranges it served when the slot map was last read
	// (at start, and by WaitPromoted): what WaitPromoted waits to see served by another node.
	owned map[string][][2]int64
}

type clusterNode struct {
	srv     *Server
	admin   *goredis.Client
	stopped bool // SIGSTOP sent, no SIGCONT yet
	killed  bool
}

// Node is one node of a Cluster as it is now.
type Node struct {
	Addr   string // 127.0.0.1:port
	Port   int
	Pid    int
	Role   string // "master" or "replica" (as the node says of itself; "" when it does not answer)
	Master string // a replica's master, by address
	// Slots is how many hash slots a master serves, as the node says of itself.
	Slots   int
	Stopped bool // SIGSTOP sent, no SIGCONT yet
	Killed  bool
}

// StartCluster starts a Redis Cluster with opts and waits until every node reports
// cluster_state:ok, agrees on the nodes and their roles, and every replica is in sync with its
// master. It fails the test, saying how to install them, when redis-server or redis-cli is
// missing. Everything is stopped when the test ends (stopped nodes are resumed first).
func StartCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: run the tests with scripts/test, which installs it (Debian: apt-get install -y redis-server)")
	}
	if opts.Masters == 0 {
		opts.Masters = 3
	}
	switch {
	case opts.Replicas == 0:
		opts.Replicas = 1
	case opts.Replicas < 0:
		opts.Replicas = 0
	}
	if opts.NodeTimeout == 0 {
		opts.NodeTimeout = 2 * time.Second
	}
	// One directory for every node, made before stopAll is registered: cleanups run last first,
	// so the logs are still there for stopAll to show.
	c := &Cluster{t: t, opts: opts, dir: t.TempDir()}
	t.Cleanup(c.stopAll)
	coverage := "yes"
	if opts.PartialCoverage {
		coverage = "no"
	}
	total := opts.Masters * (1 + opts.Replicas)
	for range total {
		n := c.startNode("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(opts.NodeTimeout.Milliseconds(), 10),
			"--cluster-require-full-coverage", coverage,
			// A replica syncs at once, not after the default 5 s wait for more replicas.
			"--repl-diskless-sync-delay", "0")
		c.nodes = append(c.nodes, n)
	}
	if err := c.create(); err != nil {
		t.Fatalf("creating the Redis Cluster: %v\n%s", err, c.Logs())
	}
	if err := c.waitHealthy(60 * time.Second); err != nil {
		t.Fatalf("the Redis Cluster did not become healthy: %v\n%s", err, c.Logs())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	owned, err := c.readOwned()
	if err != nil {
		t.Fatalf("reading the slot map: %v\n%s", err, c.Logs())
	}
	c.owned = owned
	return c
}

// create makes the first opts.Masters nodes masters, each of an equal share of the slots, and
// the others replicas of them in turn, as redis-cli --cluster create does, without its pauses
// of a second.
func (c *Cluster) create() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	masters := c.nodes[:c.opts.Masters]
	ids := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		id, err := n.admin.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER MYID: %v", n.srv.Addr(), err)
		}
		ids[i] = id
		// Distinct epochs, so that the masters' claims on their slots never collide.
		if err := n.admin.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER SET-CONFIG-EPOCH: %v", n.srv.Addr(), err)
		}
	}
	for i, n := range masters {
		lo, hi := i*16384/len(masters), (i+1)*16384/len(masters)-1
		if err := n.admin.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER ADDSLOTSRANGE %d %d: %v", n.srv.Addr(), lo, hi, err)
		}
	}
	for _, n := range c.nodes[1:] {
		if err := c.nodes[0].admin.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(n.srv.port)).Err(); err != nil {
			return fmt.Errorf("%s: CLUSTER MEET %s: %v", c.nodes[0].srv.Addr(), n.srv.Addr(), err)
		}
	}
	// A replica can replicate a master once it knows it.
	for i, n := range c.nodes[len(masters):] {
		master := ids[i%len(masters)]
		for {
			err := n.admin.Do(ctx, "CLUSTER", "REPLICATE", master).Err()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("%s: CLUSTER REPLICATE %s: %v", n.srv.Addr(), master, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// startNode starts one redis-server on a loopback port whose cluster bus port (+10000) is free too.
func (c *Cluster) startNode(args ...string) *clusterNode {
	c.t.Helper()
	dir, err := os.MkdirTemp(c.dir, "node")
	if err != nil {
		c.t.Fatal(err)
	}
	s := &Server{t: c.t, dir: dir, args: args}
	for attempt := 0; ; attempt++ {
		s.port = freeClusterPort(c.t)
		if s.start() {
			break
		}
		if attempt == 4 {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			c.t.Fatalf("redis-server did not start on 5 free ports:\n%s", log)
		}
	}
	// The admin client tries a command again, at once, on a connection that died: a test may
	// kill every client connection of the node (CLIENT KILL TYPE normal) under it.
	return &clusterNode{srv: s, admin: goredis.NewClient(&goredis.Options{
		Addr: s.Addr(), Protocol: 2, MaxRetries: 2, MinRetryBackoff: time.Millisecond,
		MaxRetryBackoff: 10 * time.Millisecond, DialTimeout: time.Second, ReadTimeout: time.Second,
		WriteTimeout: time.Second, PoolSize: 2, DisableIdentity: true,
	})}
}

// freeClusterPort returns a loopback port that was free a moment ago, with its cluster bus port
// (the port + 10000) free too.
func freeClusterPort(t testing.TB) int {
	t.Helper()
	for range 200 {
		p := 20000 + rand.IntN(30000)
		free := true
		for _, q := range []int{p, p + 10000} {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return p
		}
	}
	t.Fatal("no free loopback port with a free cluster bus port")
	return 0
}

// waitHealthy waits until every running node reports cluster_state:ok, knows every node with no
// failure or handshake flag and with the same roles, and every replica's link to its master is up.
func (c *Cluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = c.healthy(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v: %w", timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitHealthy waits until the cluster is whole and in sync again (as StartCluster does), such as
// after a failed master was resumed and rejoined as a replica. Killed nodes are left out: their
// replicas serve in their place.
func (c *Cluster) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := c.waitHealthy(timeout); err != nil {
		t.Fatalf("the Redis Cluster did not become healthy again: %v\n%s", err, c.Logs())
	}
}

func (c *Cluster) healthy() error {
	c.mu.Lock()
	live := c.liveLocked()
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var want string
	for _, n := range live {
		addr := n.srv.Addr()
		info, err := n.admin.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %v", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: not cluster_state:ok", addr)
		}
		view, err := c.view(ctx, n)
		if err != nil {
			return err
		}
		if want == "" {
			want = view
		} else if view != want {
			return fmt.Errorf("the nodes disagree: %s sees %q, another %q", addr, view, want)
		}
		repl, err := n.admin.Info(ctx, "replication").Result()
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %v", addr, err)
		}
		if strings.Contains(repl, "role:slave") &&
			(!strings.Contains(repl, "master_link_status:up") || !strings.Contains(repl, "master_sync_in_progress:0")) {
			return fmt.Errorf("%s: replica not in sync with its master", addr)
		}
	}
	masters := strings.Count(want, " master")
	if masters != c.opts.Masters {
		return fmt.Errorf("%d masters, want %d: %q", masters, c.opts.Masters, want)
	}
	return nil
}

// view is the cluster as node n sees it, in a form every node in agreement gives alike: each
// node's address and role (and a replica's master), sorted; an error when any node is flagged
// failing, in handshake, without address or disconnected.
func (c *Cluster) view(ctx context.Context, n *clusterNode) (string, error) {
	addr := n.srv.Addr()
	out, err := n.admin.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("%s: CLUSTER NODES: %v", addr, err)
	}
	lines := parseNodes(out)
	byID := map[string]string{}
	for _, l := range lines {
		byID[l.id] = l.addr
	}
	var view []string
	for _, l := range lines {
		if l.hasFlag("fail") || l.hasFlag("fail?") || l.hasFlag("handshake") || l.hasFlag("noaddr") {
			if c.isKilled(l.addr) {
				continue // a killed node stays known to the others, flagged failed
			}
			return "", fmt.Errorf("%s sees %s flagged %s", addr, l.addr, l.flags)
		}
		if l.link != "connected" {
			return "", fmt.Errorf("%s sees %s %s", addr, l.addr, l.link)
		}
		switch {
		case l.hasFlag("master"):
			view = append(view, l.addr+" master")
		default:
			view = append(view, l.addr+" replica of "+byID[l.master])
		}
	}
	slices.Sort(view)
	return strings.Join(view, ", "), nil
}

func (c *Cluster) isKilled(addr string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeLocked(addr)
	return n != nil && n.killed
}

// nodeLine is one line of CLUSTER NODES.
type nodeLine struct {
	id, addr, flags, master, link string
	slots                         [][2]int64
}

func (l nodeLine) hasFlag(f string) bool { return slices.Contains(strings.Split(l.flags, ","), f) }

func parseNodes(out string) []nodeLine {
	var lines []nodeLine
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		l := nodeLine{id: f[0], addr: addr, flags: f[2], master: f[3], link: f[7]}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.ParseInt(lo, 10, 64)
			b, err2 := strconv.ParseInt(hi, 10, 64)
			if err1 == nil && err2 == nil {
				l.slots = append(l.slots, [2]int64{a, b})
			}
		}
		lines = append(lines, l)
	}
	return lines
}

// liveLocked returns the nodes neither killed nor stopped.
func (c *Cluster) liveLocked() []*clusterNode {
	var live []*clusterNode
	for _, n := range c.nodes {
		if !n.killed && !n.stopped {
			live = append(live, n)
		}
	}
	return live
}

func (c *Cluster) nodeLocked(addr string) *clusterNode {
	for _, n := range c.nodes {
		if n.srv.Addr() == addr {
			return n
		}
	}
	return nil
}

func (c *Cluster) node(addr string) *clusterNode {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeLocked(addr)
	if n == nil {
		c.t.Fatalf("%s is no node of this cluster", addr)
	}
	return n
}

// readOwned reads, from a running node, the slot ranges each master serves.
func (c *Cluster) readOwned() (map[string][][2]int64, error) {
	var err error
	for _, n := range c.liveLocked() {
		var slots []goredis.ClusterSlot
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		slots, err = n.admin.ClusterSlots(ctx).Result()
		cancel()
		if err != nil {
			continue
		}
		owned := map[string][][2]int64{}
		for _, s := range slots {
			if len(s.Nodes) > 0 {
				owned[s.Nodes[0].Addr] = append(owned[s.Nodes[0].Addr], [2]int64{int64(s.Start), int64(s.End)})
			}
		}
		return owned, nil
	}
	return nil, fmt.Errorf("no running node answered CLUSTER SLOTS: %v", err)
}

// URL is the redis-cluster:// URL of the masters as they were at start.
func (c *Cluster) URL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var addrs []string
	for _, n := range c.nodes[:c.opts.Masters] {
		addrs = append(addrs, n.srv.Addr())
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}

// Nodes returns every node, with its role as it says of itself now.
func (c *Cluster) Nodes() []Node {
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	c.mu.Unlock()
	var out []Node
	for _, n := range nodes {
		c.mu.Lock()
		nd := Node{Addr: n.srv.Addr(), Port: n.srv.port, Stopped: n.stopped, Killed: n.killed}
		if n.srv.cmd != nil {
			nd.Pid = n.srv.cmd.Process.Pid
		}
		c.mu.Unlock()
		if !nd.Stopped && !nd.Killed {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			out, err := n.admin.ClusterNodes(ctx).Result()
			cancel()
			if err == nil {
				lines := parseNodes(out)
				byID := map[string]string{}
				for _, l := range lines {
					byID[l.id] = l.addr
				}
				for _, l := range lines {
					if !l.hasFlag("myself") {
						continue
					}
					nd.Role = "replica"
					if l.hasFlag("master") {
						nd.Role = "master"
					}
					nd.Master = byID[l.master]
					for _, r := range l.slots {
						nd.Slots += int(r[1] - r[0] + 1)
					}
				}
			}
		}
		out = append(out, nd)
	}
	return out
}

// Masters returns the addresses of the nodes that serve slots now, sorted.
func (c *Cluster) Masters() []string {
	var m []string
	for _, n := range c.Nodes() {
		if n.Role == "master" && n.Slots > 0 {
			m = append(m, n.Addr)
		}
	}
	slices.Sort(m)
	return m
}

// Client returns an admin client of the node at addr (one connection pool per node, closed when
// the test ends). It is for commands to that node itself: it follows no redirection. It fails
// the test when addr is no node of the cluster.
func (c *Cluster) Client(addr string) *goredis.Client { return c.node(addr).admin }

// MasterFor returns the address of the master that serves key now, from the slot map of a
// running node.
func (c *Cluster) MasterFor(key string) string {
	c.t.Helper()
	return c.Owners([]string{key})[0]
}

// Owners returns, for each key, the address of the master serving it now (CLUSTER KEYSLOT and
// CLUSTER SLOTS from a running node).
func (c *Cluster) Owners(keys []string) []string {
	c.t.Helper()
	c.mu.Lock()
	live := c.liveLocked()
	c.mu.Unlock()
	var lastErr error
	for _, n := range live {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		owners, err := owners(ctx, n.admin, keys)
		cancel()
		if err == nil {
			return owners
		}
		lastErr = err
	}
	c.t.Fatalf("no running node told the owners of keys: %v", lastErr)
	return nil
}

func owners(ctx context.Context, admin *goredis.Client, keys []string) ([]string, error) {
	slots, err := admin.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	pipe := admin.Pipeline()
	cmds := make([]*goredis.IntCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.ClusterKeySlot(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := make([]string, len(keys))
	for i, cmd := range cmds {
		s := int(cmd.Val())
		for _, r := range slots {
			if r.Start <= s && s <= r.End && len(r.Nodes) > 0 {
				out[i] = r.Nodes[0].Addr
			}
		}
		if out[i] == "" {
			return nil, fmt.Errorf("slot %d of %q has no master", s, keys[i])
		}
	}
	return out, nil
}

// GroupByMaster returns keys grouped by the master serving each now.
func (c *Cluster) GroupByMaster(keys []string) map[string][]string {
	c.t.Helper()
	groups := map[string][]string{}
	for i, o := range c.Owners(keys) {
		groups[o] = append(groups[o], keys[i])
	}
	return groups
}

// Kill sends SIGKILL to the node at addr and waits until it is gone.
func (c *Cluster) Kill(addr string) {
	c.t.Helper()
	n := c.node(addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.killed {
		return
	}
	n.srv.Kill()
	n.killed, n.stopped = true, false
}

// Stop sends SIGSTOP to the node at addr: it stalls, its connections open and silent.
func (c *Cluster) Stop(addr string) { c.signal(addr, syscall.SIGSTOP) }

// Cont sends SIGCONT to the node at addr, stopped by Stop.
func (c *Cluster) Cont(addr string) { c.signal(addr, syscall.SIGCONT) }

func (c *Cluster) signal(addr string, sig syscall.Signal) {
	c.t.Helper()
	n := c.node(addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.killed {
		c.t.Fatalf("%v to %s: it was killed", sig, addr)
	}
	if err := n.srv.Signal(sig); err != nil {
		c.t.Fatalf("%v to %s: %v", sig, addr, err)
	}
	n.stopped = sig == syscall.SIGSTOP
}

// WaitPromoted waits until the slots that deadAddr served (when the slot map was last read: at
// start or by the last WaitPromoted) are all served by another node, in the view of any running
// node, polled every 10 ms. It returns that node and the first instant a poll saw it, and fails
// the test after timeout.
func (c *Cluster) WaitPromoted(t testing.TB, deadAddr string, timeout time.Duration) (string, time.Time) {
	t.Helper()
	c.mu.Lock()
	ranges := c.owned[deadAddr]
	c.mu.Unlock()
	if len(ranges) == 0 {
		t.Fatalf("%s served no slots", deadAddr)
	}
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		live := c.liveLocked()
		c.mu.Unlock()
		for _, n := range live {
			if n.srv.Addr() == deadAddr {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			slots, err := n.admin.ClusterSlots(ctx).Result()
			cancel()
			if err != nil {
				continue
			}
			at := time.Now()
			if owner := takenOver(slots, ranges, deadAddr); owner != "" {
				c.settle(deadAddr, ranges, owner)
				return owner, at
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the fault, the slots of %s are not served by another node:\n%s", timeout, deadAddr, c.Logs())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle waits (up to 10 s) until every running node sees owner serve ranges, so that what
// follows (MasterFor, Owners) asks any node alike, and reads the slot map again.
func (c *Cluster) settle(dead string, ranges [][2]int64, owner string) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		live := c.liveLocked()
		c.mu.Unlock()
		agree := true
		for _, n := range live {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			slots, err := n.admin.ClusterSlots(ctx).Result()
			cancel()
			if err != nil || takenOver(slots, ranges, dead) != owner {
				agree = false
				break
			}
		}
		if agree {
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if owned, err := c.readOwned(); err == nil {
		c.owned = owned
	}
}

// takenOver returns the node serving every slot of ranges in slots, when it is one node other
// than dead, else "".
func takenOver(slots []goredis.ClusterSlot, ranges [][2]int64, dead string) string {
	owner := ""
	for _, want := range ranges {
		for s := want[0]; s <= want[1]; {
			got := ""
			next := s + 1
			for _, r := range slots {
				if int64(r.Start) <= s && s <= int64(r.End) && len(r.Nodes) > 0 {
					got, next = r.Nodes[0].Addr, int64(r.End)+1
				}
			}
			if got == "" || got == dead || (owner != "" && got != owner) {
				return ""
			}
			owner, s = got, next
		}
	}
	return owner
}

// ClusterStateOK reports whether the node at addr says cluster_state:ok (false when it does not
// answer within timeout, or is no node of the cluster). It may be called from any goroutine.
func (c *Cluster) ClusterStateOK(addr string, timeout time.Duration) bool {
	c.mu.Lock()
	n := c.nodeLocked(addr)
	c.mu.Unlock()
	if n == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	info, err := n.admin.ClusterInfo(ctx).Result()
	return err == nil && strings.Contains(info, "cluster_state:ok")
}

// Logs returns the last lines of every node's log, for a failure's message.
func (c *Cluster) Logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, n := range c.nodes {
		log, _ := os.ReadFile(filepath.Join(n.srv.dir, "redis.log"))
		lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		state := ""
		switch {
		case n.killed:
			state = " (killed)"
		case n.stopped:
			state = " (stopped)"
		}
		fmt.Fprintf(&b, "--- redis %s%s, last lines of its log:\n%s\n", n.srv.Addr(), state, strings.Join(lines, "\n"))
	}
	return b.String()
}

// stopAll resumes stopped nodes, kills every node and closes the admin clients.
func (c *Cluster) stopAll() {
	if c.t.Failed() {
		c.t.Logf("Redis Cluster logs:\n%s", c.Logs())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.stopped {
			_ = n.srv.Signal(syscall.SIGCONT)
			n.stopped = false
		}
	}
	for _, n := range c.nodes {
		n.admin.Close()
		if !n.killed {
			n.srv.Kill()
			n.killed = true
		}
	}
}
