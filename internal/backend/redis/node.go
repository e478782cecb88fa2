package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/breaker"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/pipeline"
)

// nodeBreaker is a node's circuit breaker; allow is Allow under the name script.go's loader
// reads.
type nodeBreaker struct{ *breaker.Breaker }

func (b nodeBreaker) allow() bool { return b.Allow() }

// node is one Redis master as rls sends to it: the single node, the master a Sentinel names, or
// one master of a Cluster. Each node has its own pipelines (a coalescer and its senders),
// circuit breaker, probe and health check, so that a node that fails or hangs fails only the
// decisions whose keys it holds, and its errors never land on another node's calls.
type node struct {
	deps  *nodeDeps
	name  string                  // its address, the label of its metrics ("sentinel:<master>" for Sentinel)
	rdb   goredis.UniversalClient // the decisions' connections
	probe goredis.UniversalClient // the probe's and the health check's own connections
	co    *pipeline.Coalescer[*call]
	br    nodeBreaker

	errOpen error // the error of its decisions while its breaker is open
	errSlow error // the error of its decisions that ran out of time while it was found slow

	lastReply atomic.Int64 // mono when it last replied
	probing   atomic.Bool
	probeSent atomic.Int64 // mono when the probe in flight was sent; 0 when none is
	// The probe's start in the runtime's scheduling latencies, and the last verdict on whether
	// this process was starved of CPU since (see slowNow).
	probeBefore atomic.Pointer[metrics.Float64Histogram]
	verdictMu   sync.Mutex
	verdictAt   int64 // mono
	verdictOf   int64 // the probeSent the verdict is about
	starvedNow  bool

	slow atomic.Uint64 // decisions that ran out of time while it was found slow

	// The epoch: a key rls keeps in the node, whose disappearance or change says the node lost
	// its data (FLUSHALL, a restart without persistence). Touched by the health check only.
	epochKey   string
	epochValue string
	epochSet   atomic.Bool // an epoch is known: what tests wait for (export_test.go)
	// Redis's INFO, read by the health check only (see memory.go): the reading before the epoch
	// was last seen as known (epochInfo), and the latest (lastInfo).
	epochInfo   infoSnap
	lastInfo    infoSnap
	infoRefused atomic.Bool
	evicted     atomic.Uint64 // keys Redis evicted while rls read its INFO
	oom         atomic.Uint64 // script calls Redis refused for want of memory

	// Its goroutines (the health check, the probes) and their context, which close ends.
	ctx     context.Context
	cancel  context.CancelFunc
	closeMu sync.Mutex // guards closed and wg's additions
	closed  bool
	wg      sync.WaitGroup

	leadOnce sync.Once
	leadOK   bool // leaders' pipelines have their reads bounded (see leadHook)
}

// nodeConfig is how a node's pipelines, breaker and health check are set.
type nodeConfig struct {
	coalesce, senders int
	failures          int
	cooldown          time.Duration
	healthInterval    time.Duration
	probeTimeout      time.Duration
}

// nodeDeps is what every node is handed: its settings, the library's state, and the functions
// through which it tells the rest of the backend what it found. A node holds nothing else of
// the backend and calls nothing else of it.
type nodeDeps struct {
	*libraryUse // calls go as FCALL while its fcall is set
	cfg         nodeConfig
	cluster     bool // a master of a Cluster
	merge       bool // merge coalesced calls into one script call (single node)
	log         *slog.Logger
	warn        *logthrottle.Throttle // warnings that repeat while Redis is down
	mono        func() int64          // the backend's monotonic clock
	nowArg      func() int64          // the instant the script decides at: 0 for Redis TIME

	// The topology: a reload of the slot map asked for (nil off a Cluster), the key of a
	// node's epoch ("" while it owns no slot), the slots it serves.
	requestReload func(reason string)
	epochKey      func(n *node) string
	slotsOf       func(n *node) int

	healthChanged func()         // the backend's health may have changed
	resets        *atomic.Uint64 // data losses found
	purge         func()         // forget what this process knows of Redis's state: denials, leases
}

// newNode returns a node on rdb and probe, which are its own from then on (close closes them),
// its health check not started (see start).
func newNode(name string, rdb, probe goredis.UniversalClient, d *nodeDeps) *node {
	n := &node{deps: d, name: name, rdb: rdb, probe: probe}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	if d.cluster {
		n.errOpen = fmt.Errorf("%w: redis: the master of the key's slot is down (circuit breaker open)", backend.ErrUnavailable)
	} else {
		n.errOpen = errOpen
	}
	n.errSlow = fmt.Errorf("%w: redis slow: no answer within the budget, nor to a probe: %w", backend.ErrUnavailable, context.DeadlineExceeded)
	cfg := d.cfg
	// A pipeline unanswered for slowAfter sends a probe, so that the decisions that then run out
	// of time can tell a slow node from an overloaded process (see ranOut).
	// A lone caller leads on every topology. On a Cluster leading was once off, after a
	// master's failure under TestClusterMasterFault's load left one replica answering no key,
	// of any master, for about a second. No leader was in flight then: that replica was short
	// of CPU, every decision of it was queued on a healthy node, and the node's sender yielded
	// (runtime.Gosched) before each pipeline, each time waiting behind the goroutines preempted
	// in the scheduler's global run queue. Senders no longer yield (internal/pipeline;
	// TestSendersNotQueuedBehindBusyGoroutines).
	n.co = pipeline.New(n.sendPipeline, pipeline.Options{Max: cfg.coalesce, Senders: cfg.senders,
		Slow: n.kickProbe, SlowAfter: slowAfter})
	n.br = nodeBreaker{breaker.New(cfg.failures, cfg.cooldown, n.recover, n.healthChanged)}
	n.lastReply.Store(d.mono())
	return n
}

// start starts the node's health check.
func (n *node) start() {
	if i := n.deps.cfg.healthInterval; i > 0 {
		n.goBackground(func() { n.healthLoop(i) })
	}
}

// goBackground runs f in a goroutine of the node's, unless the node is closed.
func (n *node) goBackground(f func()) bool {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed {
		return false
	}
	n.wg.Go(f)
	return true
}

// close stops the node's goroutines (its health check, probes, breaker probe and senders) and
// closes its clients. Calls queued or in flight are answered first; a decision that submits to
// the node after is refused (see errGone), and one that sends on its clients after gets their
// error (closed): both fail as Redis unavailable.
func (n *node) close() error {
	n.closeMu.Lock()
	n.closed = true
	n.closeMu.Unlock()
	n.cancel()
	n.wg.Wait()
	n.br.Close()
	n.co.Close()
	return errors.Join(n.rdb.Close(), n.probe.Close())
}

// errGone is the error of a decision that reached a node being closed: a master that left the
// Cluster's slot map, or the backend closing.
var errGone = fmt.Errorf("%w: redis: the node left the slot map or is closing", backend.ErrUnavailable)

// recover is the breaker's probe while it is open: the script (and the library) loaded into
// the node on the probe's connection, then a ping on the decisions' connections. It succeeds
// only once the decisions' client reaches the node too: after failed dials that client's pool
// may still be answering with its last dial error (see probePoolSize), and a breaker closed
// then would open again on the first decisions.
func (n *node) recover(ctx context.Context) error {
	loaded, refused, err := load(ctx, n.probe, n.deps.libraryWanted())
	if err == nil {
		err = n.rdb.Ping(ctx).Err()
	}
	if err == nil {
		n.deps.useLibrary(loaded, refused)
		n.lastReply.Store(n.deps.mono())
	}
	return err
}

func (n *node) healthChanged(healthy bool, cause error) {
	d := n.deps
	switch {
	case !d.cluster && healthy:
		d.log.Info("redis available")
	case !d.cluster:
		d.log.Warn("redis unavailable: circuit breaker open, failing fast and probing", "cause", cause)
	case healthy:
		d.log.Info("redis node available", "node", n.name)
	default:
		d.log.Warn("redis node unavailable: circuit breaker open, failing fast on its slots and probing",
			"node", n.name, "slots", d.slotsOf(n), "cause", cause)
		d.requestReload(reasonNodeDown)
	}
	d.healthChanged()
}

// ranOut returns the error of a decision whose budget passed before the node answered it.
// Whether the time went waiting in this process (CPU, the queue) or on Redis cannot be told
// from the decision: a probe on the node's own connection tells. A probe goes out when a
// pipeline has had no answer for slowAfter, or when a decision runs out of time and the node
// has not replied for slowAfter. While a probe has had no answer for slowAfter, nor has anything
// else from the node, and this process was not starved of CPU meanwhile (its waits for a CPU,
// and the depth of its run queues: see starved and backlogged), the node is slow: the
// decision fails as Redis slow (counted per node, as a backend timeout). Otherwise it counts as
// overload. A probe with no answer within the probe timeout opens the breaker.
func (n *node) ranOut() error {
	if n.slowNow() {
		n.slow.Add(1)
		return n.errSlow
	}
	if time.Duration(n.deps.mono()-n.lastReply.Load()) >= slowAfter {
		n.kickProbe()
	}
	return errShed
}

// slowAfter is how long a probe, and the node, may go without answering before a decision
// that runs out of time counts as the node being slow rather than as overload.
const slowAfter = 20 * time.Millisecond

// slowNow reports whether the node is found slow now (see ranOut).
func (n *node) slowNow() bool {
	now := n.deps.mono()
	sent := n.probeSent.Load()
	if sent == 0 || time.Duration(now-sent) < slowAfter || time.Duration(now-n.lastReply.Load()) < slowAfter {
		return false
	}
	n.verdictMu.Lock()
	defer n.verdictMu.Unlock()
	if n.verdictOf != sent || time.Duration(now-n.verdictAt) >= slowAfter/4 {
		// Read the runtime's histogram at most every few milliseconds: decisions that run out
		// of time come by the thousand when Redis hangs.
		n.verdictOf, n.verdictAt = sent, now
		n.starvedNow = starved(n.probeBefore.Load(), schedLatencies(), 2*slowAfter) || backlogged()
	}
	return !n.starvedNow
}

// kickProbe pings the node on the probe's own connection, unless a probe is in flight, and
// opens the breaker when the node answers nothing within the probe timeout. A probe says nothing
// when this process was too starved of CPU to tell: when it returned far later than its
// timeout, when some other call got a reply meanwhile (Redis answers, this process is slow to
// read), or when this process's goroutines waited long for a CPU while it ran (the runtime's
// scheduling latencies) or wait in a deep run queue as it ends.
func (n *node) kickProbe() {
	if !n.probing.CompareAndSwap(false, true) {
		return
	}
	n.probeBefore.Store(schedLatencies())
	d := n.deps
	start := d.mono()
	n.probeSent.Store(start)
	started := n.goBackground(func() {
		defer n.probing.Store(false)
		defer n.probeSent.Store(0)
		before := n.probeBefore.Load()
		probeTO := d.cfg.probeTimeout
		ctx, cancel := context.WithTimeout(n.ctx, probeTO)
		defer cancel()
		err := n.probe.Ping(ctx).Err()
		took := time.Duration(d.mono() - start)
		switch {
		case n.ctx.Err() != nil:
			// Closed meanwhile.
		case err == nil:
			n.lastReply.Store(d.mono())
		case isReply(err) && !unavailableReply(err):
			n.lastReply.Store(d.mono())
		case n.lastReply.Load() > start || took > 2*probeTO || starved(before, schedLatencies(), probeTO) || backlogged():
			d.log.Debug("redis probe inconclusive: this process is starved of CPU", "node", n.name, "took", took, "err", err)
		default:
			n.br.Trip(fmt.Errorf("no answer to a probe within %v: %w", probeTO, err))
		}
	})
	if !started {
		n.probeSent.Store(0)
		n.probing.Store(false)
	}
}

// healthLoop checks the node every interval until close: a probe (which finds a node that went
// away with no decision to notice it) and its epoch.
func (n *node) healthLoop(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n.br.Allow() {
			n.kickProbe()
			n.checkEpoch()
		}
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkEpoch reads the node's epoch, and keeps one there when it has none: a random value,
// without expiry, set only if absent. An epoch that was known and is now missing or different
// (another replica of rls found it missing first) says the node lost its data: every key it
// held starts over, with a fresh burst. That is logged and counted once per loss, unless
// Redis's INFO says the key was evicted (see memory.go). INFO is read before the epoch, and
// again after it when the epoch is found gone, so that whatever removed it falls between the
// two readings compared.
func (n *node) checkEpoch() {
	d := n.deps
	key := d.epochKey(n)
	if key == "" {
		return
	}
	if key != n.epochKey {
		// A new node, or its slots changed: what was known is of another key.
		n.epochKey, n.epochValue = key, ""
	}
	ctx, cancel := context.WithTimeout(n.ctx, d.cfg.probeTimeout)
	defer cancel()
	before := n.watchInfo(ctx)
	gone := func() {
		if n.epochValue == "" {
			return
		}
		why, evicted := epochVerdict(n.epochInfo, n.watchInfo(ctx))
		if evicted {
			n.epochEvicted(n.lastInfo.policy)
			return
		}
		n.lostData(why)
	}
	v, err := n.probe.Get(ctx, key).Result()
	switch {
	case errors.Is(err, goredis.Nil):
		fresh := newEpoch()
		set, err := n.probe.SetNX(ctx, key, fresh, 0).Result()
		if err != nil {
			return
		}
		if !set {
			if v, err = n.probe.Get(ctx, key).Result(); err != nil {
				return
			}
			fresh = v
		}
		gone()
		n.epochValue = fresh
		n.epochInfo = n.lastInfo
		n.epochSet.Store(true)
	case err != nil:
		// Unavailable, or not the owner of the key's slot any more (MOVED): another round.
	case n.epochValue == "":
		n.epochValue = v
		n.epochInfo = before
		n.epochSet.Store(true)
	case v != n.epochValue:
		gone()
		n.epochValue = v
		n.epochInfo = n.lastInfo
	case before.ok:
		n.epochInfo = before
	}
}

func (n *node) lostData(why string) {
	d := n.deps
	d.resets.Add(1)
	d.log.Warn("redis lost its data: every key it held starts over with a fresh burst (a flush, or a restart without persistence)",
		"node", n.name, "why", why)
	d.purge()
}

// newEpoch returns a random epoch value.
func newEpoch() string {
	var p [12]byte
	_, _ = rand.Read(p[:])
	return strconv.FormatInt(time.Now().Unix(), 10) + "-" + hex.EncodeToString(p[:])
}

// observe tells the node's breaker what a round trip showed: err is the round trip's own error
// (nil when the node replied), cmds what it carried.
//
// A round trip that ran out of its callers' budget before it was written (waiting for a
// connection, dialing: context.DeadlineExceeded, or the pool's own timeout) says nothing about
// Redis: on a saturated machine the time may have gone to this process. If the node is really
// gone, decisions keep timing out and the probe finds out.
func (n *node) observe(err error, cmds []*goredis.Cmd) {
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, goredis.ErrPoolTimeout):
		return
	default:
		n.br.Failure(err)
		if n.deps.cluster {
			n.deps.requestReload(reasonNodeDown)
		}
		return
	}
	for _, c := range cmds {
		cerr := c.Err()
		if cerr == nil {
			continue
		}
		if n.deps.cluster {
			switch {
			case goredis.HasErrorPrefix(cerr, "MOVED"):
				n.deps.requestReload(reasonMoved)
			case goredis.HasErrorPrefix(cerr, "ASK"):
				n.deps.requestReload(reasonAsk)
			case goredis.HasErrorPrefix(cerr, "CLUSTERDOWN"):
				n.deps.requestReload(reasonClusterDown)
			}
		}
		if oomReply(cerr) {
			// Redis is full and refuses writes: the node answered, it is not down. Its
			// decisions get the failure mode; opening the breaker would only fail them
			// without asking, after memory is freed too, and report Redis down when it is not.
			n.outOfMemory()
			continue
		}
		// CLUSTERDOWN is the Cluster's state, not this node failing: the node answered.
		if unavailableReply(cerr) && !goredis.HasErrorPrefix(cerr, "CLUSTERDOWN") {
			n.br.Failure(cerr)
			return
		}
	}
	n.lastReply.Store(n.deps.mono())
	n.br.Success()
}
