package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/logthrottle"
)

// A Cluster's slot map is rls's own: which master owns each slot, fetched with CLUSTER SLOTS
// and followed within about a second of a change. go-redis's ClusterClient reloads its map
// every minute (a failed-over slot goes on being sent to a dead master that long when
// cluster-require-full-coverage is no), follows MOVED by resending (a script that may have run
// would charge twice) and, in a pipeline, writes one node's error onto every command. rls
// routes each call itself, to its master's own node (see node), on go-redis's plain clients.

// clusterTopo is a Cluster's topology: its slot map, the node of every master the map names
// and the control clients its fetches ask. It starts a node for each master as the map names
// it, and closes the nodes and control clients of those that leave it (an address gone: a pod
// restarted with a new IP, a master that handed all its slots over), once the map that does
// not name them is published, so that no decision is routed to them after. A decision that
// still holds a node being closed fails as Redis unavailable.
type clusterTopo struct {
	target  Target
	prefix  string
	clients clientOptions
	admin   *goredis.ClusterClient // keys' administration (Reset): takes its slot map from this one
	deps    *nodeDeps              // what each node is handed
	log     *slog.Logger
	warn    *logthrottle.Throttle
	changed func() // the backend's health may have changed

	cur          atomic.Pointer[topology]
	reloadCh     chan struct{}
	reloadReason atomic.Pointer[string]
	reloads      [numReasons]atomic.Uint64

	mu       sync.Mutex
	nodes    map[string]*node // every master of the map, by address (and redirects' targets)
	controls map[string]*goredis.Client
	closed   bool
	closing  sync.WaitGroup // nodes and clients being closed
}

// topology is a Cluster's slot map at one instant. It is never changed once published.
type topology struct {
	owner    [slotCount]*node
	masters  []*node
	slots    map[*node]int // slots per master
	unowned  int           // slots no master serves
	replicas []string      // replicas' addresses, asked for the map too
	ranges   []goredis.ClusterSlot
	sig      string // what the map says, to tell a change
}

// Reasons for a reload of the slot map, as rls_redis_topology_reloads_total counts them.
const (
	reasonMoved       = "moved"
	reasonAsk         = "ask"
	reasonNodeDown    = "node_down"
	reasonClusterDown = "clusterdown"
	reasonPeriodic    = "periodic"
	reasonNoMap       = "no_map"
)

var reloadReasons = [numReasons]string{reasonMoved, reasonAsk, reasonNodeDown, reasonClusterDown, reasonPeriodic, reasonNoMap}

const numReasons = 6

const (
	// reloadGap is the least time between two reloads of the slot map.
	reloadGap = 100 * time.Millisecond
	// degradedReload is how often the slot map is reloaded while some of it is unavailable (a
	// master down, slots unowned), to find the replica promoted in its place.
	degradedReload = 250 * time.Millisecond
	// periodicReload is how often it is reloaded otherwise.
	periodicReload = 10 * time.Second
	// fetchTimeout bounds one fetch of the map; fetchLinger is how long, after the first
	// answer, the other nodes' answers are waited for, to take the view most of them hold.
	fetchTimeout = 500 * time.Millisecond
	fetchLinger  = 30 * time.Millisecond
	// maxAsked is how many nodes a fetch asks at most.
	maxAsked = 64
)

var (
	errNoSlotMap = fmt.Errorf("%w: redis cluster: no slot map yet", backend.ErrUnavailable)
	errUnowned   = fmt.Errorf("%w: redis cluster: the key's slot has no master", backend.ErrUnavailable)
)

func newClusterTopo(target Target, prefix string, clients clientOptions, deps *nodeDeps, log *slog.Logger,
	warn *logthrottle.Throttle, changed func()) *clusterTopo {
	t := &clusterTopo{target: target, prefix: prefix, clients: clients, deps: deps, log: log, warn: warn, changed: changed,
		reloadCh: make(chan struct{}, 1), nodes: map[string]*node{}, controls: map[string]*goredis.Client{}}
	t.admin = newClusterClient(target, clients, t.clusterSlots)
	return t
}

// Load returns the slot map now: nil before the first one.
func (t *clusterTopo) Load() *topology { return t.cur.Load() }

// requestReload asks for a reload of the slot map, soon (at most one every reloadGap).
func (t *clusterTopo) requestReload(reason string) {
	t.reloadReason.Store(&reason)
	select {
	case t.reloadCh <- struct{}{}:
	default:
	}
}

// topologyLoop reloads the slot map when asked, while some of it is unavailable, and every
// periodicReload, until Close.
func (t *clusterTopo) loop(ctx context.Context) {
	tick := time.NewTicker(degradedReload)
	defer tick.Stop()
	last := time.Now()
	for {
		var reason string
		select {
		case <-ctx.Done():
			return
		case <-t.reloadCh:
			reason = *t.reloadReason.Load()
		case <-tick.C:
			switch m := t.Load(); {
			case m == nil:
				reason = reasonNoMap
			case m.unavailable() > 0:
				reason = reasonNodeDown
			case time.Since(last) >= periodicReload:
				reason = reasonPeriodic
			default:
				continue
			}
		}
		last = time.Now()
		t.reloads[slices.Index(reloadReasons[:], reason)].Add(1)
		fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
		err := t.reload(fctx)
		cancel()
		if err != nil {
			t.warn.Warn("slot map not reloaded", "redis cluster: slot map not reloaded; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(reloadGap):
		}
	}
}

// reload fetches the slot map and publishes it.
func (t *clusterTopo) reload(ctx context.Context) error {
	ranges, err := t.fetchSlots(ctx)
	if err != nil {
		return err
	}
	t.apply(ranges)
	return nil
}

// apply publishes the slot map ranges describes, with a node for each master it names, logs a
// change, and then closes the nodes and control clients the map no longer names.
func (t *clusterTopo) apply(ranges []goredis.ClusterSlot) {
	m := &topology{slots: map[*node]int{}, ranges: ranges, sig: rangesSig(ranges)}
	seenReplica := map[string]bool{}
	for _, r := range ranges {
		if len(r.Nodes) == 0 || r.Start < 0 || r.End >= slotCount || r.Start > r.End {
			continue
		}
		n := t.nodeFor(r.Nodes[0].Addr)
		if _, ok := m.slots[n]; !ok {
			m.masters = append(m.masters, n)
		}
		for s := r.Start; s <= r.End; s++ {
			if m.owner[s] == nil {
				m.slots[n]++
			}
			m.owner[s] = n
		}
		for _, rep := range r.Nodes[1:] {
			if !seenReplica[rep.Addr] {
				seenReplica[rep.Addr] = true
				m.replicas = append(m.replicas, rep.Addr)
			}
		}
	}
	for s := range m.owner {
		if m.owner[s] == nil {
			m.unowned++
		}
	}
	old := t.cur.Swap(m)
	if old == nil || old.sig != m.sig {
		masters := make([]string, 0, len(m.masters))
		for _, n := range m.masters {
			masters = append(masters, n.name+"="+strconv.Itoa(m.slots[n]))
		}
		if old != nil {
			t.log.Info("redis cluster topology changed", "masters", strings.Join(masters, " "), "unowned_slots", m.unowned)
		} else {
			t.log.Debug("redis cluster slot map", "masters", strings.Join(masters, " "), "unowned_slots", m.unowned)
		}
		// The ClusterClient kept for keys' administration (Reset) takes its map from this one.
		t.admin.ReloadState(context.Background())
	}
	t.prune(m)
	t.changed()
}

// prune closes, in the background, the nodes that m, just published, does not name as masters,
// and the control clients of the addresses a fetch no longer asks. Nothing routes to those
// nodes any more; a decision that still holds one fails as Redis unavailable (see node.close).
func (t *clusterTopo) prune(m *topology) {
	asked := t.askable()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	var gone []*node
	for addr, n := range t.nodes {
		if _, ok := m.slots[n]; !ok {
			delete(t.nodes, addr)
			gone = append(gone, n)
		}
	}
	var controls []*goredis.Client
	for addr, c := range t.controls {
		if !slices.Contains(asked, addr) {
			delete(t.controls, addr)
			controls = append(controls, c)
		}
	}
	if len(gone) == 0 && len(controls) == 0 {
		return
	}
	for _, n := range gone {
		t.log.Info("redis cluster: closing a node that left the slot map", "node", n.name)
	}
	t.closing.Go(func() {
		for _, n := range gone {
			_ = n.close()
		}
		for _, c := range controls {
			_ = c.Close()
		}
	})
}

// nodeFor returns the node of the master at addr, starting it the first time. After close, a
// node is still returned, closed: its decisions fail as Redis unavailable.
func (t *clusterTopo) nodeFor(addr string) *node {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n, ok := t.nodes[addr]; ok {
		return n
	}
	rdb := newNodeClient(t.target, addr, t.clients)
	probe := newNodeClient(t.target, addr, probeOptions(t.clients))
	n := newNode(addr, rdb, probe, t.deps)
	if t.closed {
		_ = n.close()
		return n
	}
	t.nodes[addr] = n
	n.start()
	return n
}

// control returns the client a fetch asks addr with: one connection, its reads bounded by the
// fetch's deadline.
func (t *clusterTopo) control(addr string) *goredis.Client {
	t.mu.Lock()
	defer t.mu.Unlock()
	if c, ok := t.controls[addr]; ok {
		return c
	}
	c := newControlClient(t.target, addr, t.clients)
	if !t.closed {
		t.controls[addr] = c
	}
	return c
}

// clusterSlots is the admin ClusterClient's source of its slot map: this one.
func (t *clusterTopo) clusterSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	if m := t.Load(); m != nil {
		return m.ranges, nil
	}
	return t.fetchSlots(ctx)
}

// live returns the nodes the topology holds now.
func (t *clusterTopo) live() []*node {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Collect(maps.Values(t.nodes))
}

// close closes every node and client of the topology, and waits for those being closed.
func (t *clusterTopo) close() error {
	t.mu.Lock()
	t.closed = true
	nodes := slices.Collect(maps.Values(t.nodes))
	controls := slices.Collect(maps.Values(t.controls))
	t.nodes, t.controls = map[string]*node{}, map[string]*goredis.Client{}
	t.mu.Unlock()
	var errs []error
	for _, n := range nodes {
		errs = append(errs, n.close())
	}
	for _, c := range controls {
		errs = append(errs, c.Close())
	}
	t.closing.Wait()
	errs = append(errs, t.admin.Close())
	return errors.Join(errs...)
}

// healthy reports whether some slot of the map is available.
func (t *clusterTopo) healthy() bool {
	m := t.Load()
	return m != nil && m.unavailable() < slotCount
}

// slotsDown counts the slots unavailable: all of them with no slot map yet.
func (t *clusterTopo) slotsDown() int {
	m := t.Load()
	if m == nil {
		return slotCount
	}
	return m.unavailable()
}

// unavailable counts the slots of m whose master is down or that no master serves.
func (m *topology) unavailable() int {
	n := m.unowned
	for _, o := range m.masters {
		if !o.br.Allow() {
			n += m.slots[o]
		}
	}
	return n
}

// slotsOf returns how many slots n serves in the map.
func (t *clusterTopo) slotsOf(n *node) int {
	if m := t.Load(); m != nil {
		return m.slots[n]
	}
	return 0
}

// epochKeyOf returns the key of n's epoch: one whose slot n owns (found the same way for every
// replica of rls, and for the replica that takes n's slots over); "" when n owns none. No
// decision's key is named so: storedKey puts "{}" first in any key holding '{'.
func (t *clusterTopo) epochKeyOf(n *node) string {
	m := t.Load()
	if m == nil || m.slots[n] == 0 {
		return ""
	}
	if n.epochKey != "" && m.owner[slot(n.epochKey)] == n {
		return n.epochKey
	}
	for i := 0; i < 1<<20; i++ {
		k := t.prefix + "epoch{" + strconv.Itoa(i) + "}"
		if m.owner[slot(k)] == n {
			return k
		}
	}
	return ""
}
