package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
)

// A Cluster's slot map is rls's own: which master owns each slot, fetched with CLUSTER SLOTS
// and followed within about a second of a change. go-redis's ClusterClient reloads its map
// every minute (a failed-over slot goes on being sent to a dead master that long when
// cluster-require-full-coverage is no), follows MOVED by resending (a script that may have run
// would charge twice) and, in a pipeline, writes one node's error onto every command. rls
// routes each call itself, to its master's own node (see node), on go-redis's plain clients.

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

// requestReload asks for a reload of the slot map, soon (at most one every reloadGap).
func (b *Backend) requestReload(reason string) {
	if !b.cluster {
		return
	}
	b.reloadReason.Store(&reason)
	select {
	case b.reloadCh <- struct{}{}:
	default:
	}
}

// topologyLoop reloads the slot map when asked, while some of it is unavailable, and every
// periodicReload, until Close.
func (b *Backend) topologyLoop() {
	defer b.bg.Done()
	tick := time.NewTicker(degradedReload)
	defer tick.Stop()
	last := time.Now()
	for {
		var reason string
		select {
		case <-b.bgCtx.Done():
			return
		case <-b.reloadCh:
			reason = *b.reloadReason.Load()
		case <-tick.C:
			switch t := b.topo.Load(); {
			case t == nil:
				reason = reasonNoMap
			case b.unavailableSlots(t) > 0:
				reason = reasonNodeDown
			case time.Since(last) >= periodicReload:
				reason = reasonPeriodic
			default:
				continue
			}
		}
		last = time.Now()
		b.reloads[slices.Index(reloadReasons[:], reason)].Add(1)
		ctx, cancel := context.WithTimeout(b.bgCtx, fetchTimeout)
		err := b.reloadTopology(ctx)
		cancel()
		if err != nil {
			b.warn.Warn("slot map not reloaded", "redis cluster: slot map not reloaded; retrying", "err", err)
		}
		select {
		case <-b.bgCtx.Done():
			return
		case <-time.After(reloadGap):
		}
	}
}

// reloadTopology fetches the slot map and publishes it.
func (b *Backend) reloadTopology(ctx context.Context) error {
	ranges, err := b.fetchSlots(ctx)
	if err != nil {
		return err
	}
	b.applySlots(ranges)
	return nil
}

// fetchSlots asks every node it knows of (the URL's seed nodes, the masters and replicas of the
// map) for the slot map, at once, and takes the view most of those answering within fetchLinger
// of the first hold: a node that is back from a pause may still tell its old view for a moment.
func (b *Backend) fetchSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	asked := b.askable()
	type answer struct {
		ranges []goredis.ClusterSlot
		err    error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan answer, len(asked))
	for _, a := range asked {
		c := b.control(a)
		go func() {
			r, err := c.ClusterSlots(ctx).Result()
			if err == nil {
				fillHosts(r, a)
				if len(r) == 0 {
					err = errors.New("CLUSTER SLOTS: no slots (is cluster mode on?)")
				}
			}
			answers <- answer{r, err}
		}()
	}
	var views [][]goredis.ClusterSlot
	var sigs []string
	var votes []int
	var errs []error
	var linger <-chan time.Time
	for range asked {
		var a answer
		select {
		case a = <-answers:
		case <-linger:
		case <-ctx.Done():
		}
		if a.ranges == nil && a.err == nil {
			break // lingered enough, or out of time
		}
		if a.err != nil {
			errs = append(errs, a.err)
			continue
		}
		if linger == nil {
			linger = time.After(fetchLinger)
		}
		i := slices.Index(sigs, rangesSig(a.ranges))
		if i < 0 {
			views, sigs, votes = append(views, a.ranges), append(sigs, rangesSig(a.ranges)), append(votes, 0)
			i = len(views) - 1
		}
		votes[i]++
	}
	if len(views) == 0 {
		if len(errs) == 0 {
			errs = append(errs, ctx.Err())
		}
		return nil, fmt.Errorf("no node answered CLUSTER SLOTS: %w", errors.Join(errs...))
	}
	best := 0
	for i := range views {
		if votes[i] > votes[best] {
			best = i
		}
	}
	return views[best], nil
}

// askable returns the nodes a fetch asks: the URL's seed nodes, then the map's masters and
// replicas.
func (b *Backend) askable() []string {
	seen := map[string]bool{}
	var out []string
	add := func(a string) {
		if a != "" && !seen[a] && len(out) < maxAsked {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, a := range b.target.Addrs {
		add(a)
	}
	if t := b.topo.Load(); t != nil {
		for _, n := range t.masters {
			add(n.name)
		}
		for _, a := range t.replicas {
			add(a)
		}
	}
	return out
}

// fillHosts gives the addresses with no host (a node that does not know its own address) the
// host of the node that answered, as Redis means.
func fillHosts(ranges []goredis.ClusterSlot, from string) {
	host, _, _ := net.SplitHostPort(from)
	for i := range ranges {
		for j := range ranges[i].Nodes {
			a := &ranges[i].Nodes[j].Addr
			h, p, err := net.SplitHostPort(*a)
			if err == nil && (h == "" || h == "?") {
				*a = net.JoinHostPort(host, p)
			}
		}
	}
}

// rangesSig is what a slot map says: each range's master, in order.
func rangesSig(ranges []goredis.ClusterSlot) string {
	parts := make([]string, 0, len(ranges))
	for _, r := range ranges {
		m := ""
		if len(r.Nodes) > 0 {
			m = r.Nodes[0].Addr
		}
		parts = append(parts, strconv.Itoa(r.Start)+"-"+strconv.Itoa(r.End)+"="+m)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// applySlots publishes the slot map ranges describes, with a node for each master it names,
// and logs a change.
func (b *Backend) applySlots(ranges []goredis.ClusterSlot) {
	t := &topology{slots: map[*node]int{}, ranges: ranges, sig: rangesSig(ranges)}
	seenReplica := map[string]bool{}
	for _, r := range ranges {
		if len(r.Nodes) == 0 || r.Start < 0 || r.End >= slotCount || r.Start > r.End {
			continue
		}
		n := b.nodeFor(r.Nodes[0].Addr)
		if _, ok := t.slots[n]; !ok {
			t.masters = append(t.masters, n)
		}
		for s := r.Start; s <= r.End; s++ {
			if t.owner[s] == nil {
				t.slots[n]++
			}
			t.owner[s] = n
		}
		for _, rep := range r.Nodes[1:] {
			if !seenReplica[rep.Addr] {
				seenReplica[rep.Addr] = true
				t.replicas = append(t.replicas, rep.Addr)
			}
		}
	}
	for s := range t.owner {
		if t.owner[s] == nil {
			t.unowned++
		}
	}
	old := b.topo.Swap(t)
	if old == nil || old.sig != t.sig {
		masters := make([]string, 0, len(t.masters))
		for _, n := range t.masters {
			masters = append(masters, n.name+"="+strconv.Itoa(t.slots[n]))
		}
		if old != nil {
			b.log.Info("redis cluster topology changed", "masters", strings.Join(masters, " "), "unowned_slots", t.unowned)
		} else {
			b.log.Debug("redis cluster slot map", "masters", strings.Join(masters, " "), "unowned_slots", t.unowned)
		}
		// The ClusterClient kept for keys' administration (Reset) takes its map from this one.
		b.rdb.(*goredis.ClusterClient).ReloadState(context.Background())
	}
	b.healthChanged()
}

// nodeFor returns the node of the master at addr, starting it the first time.
func (b *Backend) nodeFor(addr string) *node {
	b.nodesMu.Lock()
	defer b.nodesMu.Unlock()
	if n, ok := b.nodes[addr]; ok {
		return n
	}
	rdb := newNodeClient(b.target, addr, b.clientOpts)
	probe := newNodeClient(b.target, addr, clientOptions{poolSize: probePoolSize, dialTimeout: b.clientOpts.dialTimeout,
		readTimeout: b.clientOpts.readTimeout, contextTimeout: true})
	n := b.newNode(addr, rdb, probe, true)
	b.nodes[addr] = n
	n.start()
	return n
}

// control returns the client a fetch asks addr with: one connection, its reads bounded by the
// fetch's deadline.
func (b *Backend) control(addr string) *goredis.Client {
	b.nodesMu.Lock()
	defer b.nodesMu.Unlock()
	if c, ok := b.controls[addr]; ok {
		return c
	}
	c := newNodeClient(b.target, addr, clientOptions{poolSize: 2, dialTimeout: min(b.clientOpts.dialTimeout, fetchTimeout),
		readTimeout: b.clientOpts.readTimeout, contextTimeout: true}).(*goredis.Client)
	b.controls[addr] = c
	return c
}

// clusterSlots is the ClusterClient's source of its slot map: this one.
func (b *Backend) clusterSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	if t := b.topo.Load(); t != nil {
		return t.ranges, nil
	}
	return b.fetchSlots(ctx)
}

// unavailableSlots counts the slots of t whose master is down or that no master serves.
func (b *Backend) unavailableSlots(t *topology) int {
	n := t.unowned
	for _, m := range t.masters {
		if !m.br.Allow() {
			n += t.slots[m]
		}
	}
	return n
}

// slotsOf returns how many slots n serves in the map.
func (b *Backend) slotsOf(n *node) int {
	if t := b.topo.Load(); t != nil {
		return t.slots[n]
	}
	return 0
}

// epochKeyOf returns the key of n's epoch: on a Cluster, one whose slot n owns (found the same
// way for every replica of rls, and for the replica that takes n's slots over); "" when n
// owns none. No decision's key is named so: storedKey puts "{}" first in any key holding '{'.
func (b *Backend) epochKeyOf(n *node) string {
	if !b.cluster {
		return b.prefix + "epoch{}"
	}
	t := b.topo.Load()
	if t == nil || t.slots[n] == 0 {
		return ""
	}
	if n.epochKey != "" && t.owner[slot(n.epochKey)] == n {
		return n.epochKey
	}
	for i := 0; i < 1<<20; i++ {
		k := b.prefix + "epoch{" + strconv.Itoa(i) + "}"
		if t.owner[slot(k)] == n {
			return k
		}
	}
	return ""
}
