package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
)

// node is one Redis master as rls sends to it: the single node, the master a Sentinel names, or
// one master of a Cluster. Each node has its own pipelines (a coalescer and its senders),
// circuit breaker, probe and health check, so that a node that fails or hangs fails only the
// decisions whose keys it holds, and its errors never land on another node's calls.
type node struct {
	b     *Backend
	name  string                  // its address, the label of its metrics ("sentinel:<master>" for Sentinel)
	rdb   goredis.UniversalClient // the decisions' connections
	probe goredis.UniversalClient // the probe's and the health check's own connections
	own   bool                    // rdb and probe belong to this node (Cluster): close closes them
	co    *coalescer
	br    *breaker

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
	epochSet   atomic.Bool // an epoch is known (for tests)
	// Redis's INFO, read by the health check only (see memory.go): the reading before the epoch
	// was last seen as known (epochInfo), and the latest (lastInfo).
	epochInfo   infoSnap
	lastInfo    infoSnap
	infoRefused atomic.Bool
	evicted     atomic.Uint64 // keys Redis evicted while rls read its INFO
	oom         atomic.Uint64 // script calls Redis refused for want of memory

	stop chan struct{}
	wg   sync.WaitGroup

	leadOnce sync.Once
	leadOK   bool // leaders' pipelines have their reads bounded (see leadHook)
}

// nodeConfig is how a Backend builds its nodes' pipelines and breakers.
type nodeConfig struct {
	coalesce, senders int
	failures          int
	cooldown          time.Duration
	healthInterval    time.Duration
}

// newNode starts a node on rdb and probe; recover is its breaker's probe while open.
func (b *Backend) newNode(name string, rdb, probe goredis.UniversalClient, own bool) *node {
	n := &node{b: b, name: name, rdb: rdb, probe: probe, own: own, stop: make(chan struct{})}
	if b.cluster {
		n.errOpen = fmt.Errorf("%w: redis: the master of the key's slot is down (circuit breaker open)", backend.ErrUnavailable)
	} else {
		n.errOpen = errOpen
	}
	n.errSlow = fmt.Errorf("%w: redis slow: no answer within the budget, nor to a probe: %w", backend.ErrUnavailable, context.DeadlineExceeded)
	cfg := b.nodeCfg
	// A pipeline unanswered for slowAfter sends a probe, so that the decisions that then run out
	// of time can tell a slow node from an overloaded process (see ranOut).
	n.co = newCoalescer(n.sendPipeline, n.kickProbe, cfg.coalesce, cfg.senders)
	// On a Cluster every call goes to the senders. With callers leading there, a master's
	// failure (SIGKILL or SIGSTOP, three rls replicas under open-loop load: TestClusterMasterFault)
	// now and then left one replica answering no key, of any master, within 1 s for about a
	// second; with leaders on single nodes only it passed every run. Why is not known yet.
	n.co.noLead = b.cluster
	n.br = newBreaker(cfg.failures, cfg.cooldown, n.recover, n.healthChanged)
	n.lastReply.Store(b.mono())
	return n
}

// start starts the node's health check.
func (n *node) start() {
	if i := n.b.nodeCfg.healthInterval; i > 0 {
		n.wg.Add(1)
		go n.healthLoop(i)
	}
}

// close stops the node's goroutines and, when they are its own, closes its connections.
func (n *node) close() error {
	close(n.stop)
	n.wg.Wait()
	n.br.close()
	n.co.close()
	if n.own {
		return errors.Join(n.rdb.Close(), n.probe.Close())
	}
	return nil
}

// recover is the breaker's probe while it is open: the script (and the library) loaded into
// the node on the probe's connection, then a ping on the decisions' connections. It succeeds
// only once the decisions' client reaches the node too: after failed dials that client's pool
// may still be answering with its last dial error (see probePoolSize), and a breaker closed
// then would open again on the first decisions.
func (n *node) recover(ctx context.Context) error {
	loaded, refused, err := load(ctx, n.probe, n.b.libraryWanted())
	if err == nil {
		err = n.rdb.Ping(ctx).Err()
	}
	if err == nil {
		n.b.useLibrary(loaded, refused)
		n.lastReply.Store(n.b.mono())
	}
	return err
}

func (n *node) healthChanged(healthy bool, cause error) {
	b := n.b
	switch {
	case !b.cluster && healthy:
		b.log.Info("redis available")
	case !b.cluster:
		b.log.Warn("redis unavailable: circuit breaker open, failing fast and probing", "cause", cause)
	case healthy:
		b.log.Info("redis node available", "node", n.name)
	default:
		b.log.Warn("redis node unavailable: circuit breaker open, failing fast on its slots and probing",
			"node", n.name, "slots", b.slotsOf(n), "cause", cause)
		b.requestReload(reasonNodeDown)
	}
	b.healthChanged()
}

// ranOut returns the error of a decision whose budget passed before the node answered it.
// Whether the time went waiting in this process (CPU, the queue) or on Redis cannot be told
// from the decision: a probe on the node's own connection tells. A probe goes out when a
// pipeline has had no answer for slowAfter, or when a decision runs out of time and the node
// has not replied for slowAfter. While a probe has had no answer for slowAfter, nor has anything
// else from the node, and this process was not starved of CPU meanwhile, the node is slow: the
// decision fails as Redis slow (counted per node, as a backend timeout). Otherwise it counts as
// overload. A probe with no answer within the probe timeout opens the breaker.
func (n *node) ranOut() error {
	if n.slowNow() {
		n.slow.Add(1)
		return n.errSlow
	}
	if time.Duration(n.b.mono()-n.lastReply.Load()) >= slowAfter {
		n.kickProbe()
	}
	return errShed
}

// slowAfter is how long a probe, and the node, may go without answering before a decision
// that runs out of time counts as the node being slow rather than as overload.
const slowAfter = 20 * time.Millisecond

// slowNow reports whether the node is found slow now (see ranOut).
func (n *node) slowNow() bool {
	now := n.b.mono()
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
		n.starvedNow = starved(n.probeBefore.Load(), schedLatencies(), 2*slowAfter)
	}
	return !n.starvedNow
}

// kickProbe pings the node on the probe's own connection, unless a probe is in flight, and
// opens the breaker when the node answers nothing within the probe timeout. A probe says nothing
// when this process was too starved of CPU to tell: when it returned far later than its
// timeout, when some other call got a reply meanwhile (Redis answers, this process is slow to
// read), or when this process's goroutines waited long for a CPU while it ran (the runtime's
// scheduling latencies).
func (n *node) kickProbe() {
	if !n.probing.CompareAndSwap(false, true) {
		return
	}
	n.probeBefore.Store(schedLatencies())
	start := n.b.mono()
	n.probeSent.Store(start)
	go func() {
		defer n.probing.Store(false)
		defer n.probeSent.Store(0)
		before := n.probeBefore.Load()
		probeTO := n.b.probeTO
		ctx, cancel := context.WithTimeout(context.Background(), probeTO)
		defer cancel()
		err := n.probe.Ping(ctx).Err()
		took := time.Duration(n.b.mono() - start)
		switch {
		case err == nil:
			n.lastReply.Store(n.b.mono())
		case isReply(err) && !unavailableReply(err):
			n.lastReply.Store(n.b.mono())
		case n.lastReply.Load() > start || took > 2*probeTO || starved(before, schedLatencies(), probeTO):
			n.b.log.Debug("redis probe inconclusive: this process is starved of CPU", "node", n.name, "took", took, "err", err)
		default:
			n.br.trip(fmt.Errorf("no answer to a probe within %v: %w", probeTO, err))
		}
	}()
}

// healthLoop checks the node every interval until close: a probe (which finds a node that went
// away with no decision to notice it) and its epoch.
func (n *node) healthLoop(interval time.Duration) {
	defer n.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if n.br.allow() {
			n.kickProbe()
			n.checkEpoch()
		}
		select {
		case <-n.stop:
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
	b := n.b
	key := b.epochKeyOf(n)
	if key == "" {
		return
	}
	if key != n.epochKey {
		// A new node, or its slots changed: what was known is of another key.
		n.epochKey, n.epochValue = key, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.probeTO)
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

// epochKnown reports whether the node's epoch is known.
func (n *node) epochKnown() bool { return n.epochSet.Load() }

func (n *node) lostData(why string) {
	b := n.b
	b.resets.Add(1)
	b.log.Warn("redis lost its data: every key it held starts over with a fresh burst (a flush, or a restart without persistence)",
		"node", n.name, "why", why)
	b.PurgeCache()
}

// newEpoch returns a random epoch value.
func newEpoch() string {
	var p [12]byte
	_, _ = rand.Read(p[:])
	return strconv.FormatInt(time.Now().Unix(), 10) + "-" + hex.EncodeToString(p[:])
}

// sendPipeline runs calls in one pipeline and gives each its reply or error; it is the
// coalescer's send. On a single node, consecutive calls go out as one merged script call; on a
// Cluster each call is its own script call. It reports what Redis did to the node's breaker: it
// is the only place that learns whether the node answers. A leader's pipeline (lead) has its
// socket reads bounded by deadline too (see leadHook): one cut short there ran out of its
// caller's budget, which says nothing about Redis, as for a call abandoned in flight; it
// reports that (ranOut), with no call's reply to read, and tells the breaker nothing.
func (n *node) sendPipeline(calls []*call, deadline time.Time, lead bool) (ranOut bool) {
	if len(calls) == 0 {
		return false
	}
	b := n.b
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if lead {
		n.leadOnce.Do(n.startLead)
		if n.leadOK {
			ctx = context.WithValue(ctx, leadKey{}, true)
		}
	}
	var cmds []*goredis.Cmd
	var asking []bool
	now := b.nowArg()
	merged := b.merge && !b.cluster && len(calls) > 1
	if merged {
		cmds = append(cmds, newScriptCmd(mergedArgs(script.Hash(), now, calls)))
	} else {
		for _, c := range calls {
			cmds = append(cmds, newScriptCmd(decideArgs(script.Hash(), now, c)))
			if c.asking {
				if asking == nil {
					asking = make([]bool, len(calls))
				}
				asking[len(cmds)-1] = true
			}
		}
	}
	err := n.exec(ctx, cmds, asking)
	if lead && err != nil && !time.Now().Before(deadline) {
		return true
	}
	n.observe(err, cmds)
	for k, cmd := range cmds {
		g := calls[k : k+1]
		if merged {
			g = calls
		}
		if err := cmd.Err(); err != nil {
			for _, c := range g {
				c.err = classify(err)
			}
			continue
		}
		reply, ok := cmd.Val().(string)
		var derr error
		switch {
		case !ok:
			derr = fmt.Errorf("script reply: %T, want a string", cmd.Val())
		case merged:
			derr = decodeMerged(reply, g)
		default:
			derr = decodeDecide(reply, g[0])
		}
		for _, c := range g {
			c.err = derr
		}
	}
	return false
}

// leadKey marks a leader's pipeline in its context (see leadHook).
type leadKey struct{}

// startLead adds a leadHook to the node's client, at its first leader's pipeline. Every node's
// client is a *goredis.Client (newClient, newNodeClient); were it not, leaders' reads would be
// bounded by the socket timeout only.
func (n *node) startLead() {
	c, ok := n.rdb.(*goredis.Client)
	if !ok {
		return
	}
	lc := c.WithTimeout(c.Options().ReadTimeout)
	lc.Options().ContextTimeoutEnabled = true // its own copy of the options
	c.AddHook(leadHook{lc})
	n.leadOK = true
}

// leadHook runs the commands of a leader's pipeline (marked by leadKey) on c: the node's client
// on its own connections, with its context's deadline bounding socket reads and writes too, as
// the probe's client does. The connection of a read cut short is closed, so only a pipeline that
// carries nothing but its caller's calls may go that way. go-redis hooks do not follow a client
// to its WithTimeout copy, so the commands go through the node's client and its hooks, and only
// at the last of them, this one, to c: added at the first leader, it sees the hooks added
// before it (tests' counters) and not those added later.
type leadHook struct{ c *goredis.Client }

func (h leadHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h leadHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if ctx.Value(leadKey{}) == nil {
			return next(ctx, cmd)
		}
		return h.c.Process(ctx, cmd)
	}
}

func (h leadHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if ctx.Value(leadKey{}) == nil {
			return next(ctx, cmds)
		}
		pipe := h.c.Pipeline()
		for _, c := range cmds {
			_ = pipe.Process(ctx, c)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
}

// exec sends cmds in one pipeline, as FCALL while the library is loaded (see librarySource) and
// as EVALSHA otherwise, and sends again, as EVAL, those that found the script or the library
// missing: a restart, a failover, SCRIPT FLUSH or FUNCTION FLUSH empties them, and EVAL both runs
// the script and caches it again. A call that found its script missing, or FCALL refused, ran
// nothing, so this is safe; nothing else is ever sent twice. A missing library is loaded again in
// the background; until then calls go as EVALSHA. asking, when set, marks the commands to send
// after ASKING (a slot being migrated to this node). exec returns the error of the round trip
// itself (no connection, a timeout), if any; each command carries its own error as well.
func (n *node) exec(ctx context.Context, cmds []*goredis.Cmd, asking []bool) error {
	b := n.b
	fcall := b.fcall.Load()
	if fcall {
		for _, c := range cmds {
			a := c.Args()
			a[0], a[1] = "fcall", functionName
		}
	}
	if err := n.pipeline(ctx, cmds, asking); err != nil {
		return err
	}
	var again []*goredis.Cmd
	var againAsking []bool
	var lost bool
	var refused error
	for i, c := range cmds {
		err := c.Err()
		if err == nil {
			continue
		}
		gone := fcall && goredis.HasErrorPrefix(err, "Function not found")
		refuse := fcall && fcallRefused(err)
		if refuse {
			refused = err
		}
		if gone || refuse || goredis.HasErrorPrefix(err, "NOSCRIPT") {
			lost = lost || gone
			args := append([]any(nil), c.Args()...)
			args[0], args[1] = "eval", scriptSource
			cmds[i] = newScriptCmd(args)
			again = append(again, cmds[i])
			againAsking = append(againAsking, asking != nil && asking[i])
		}
	}
	switch {
	case refused != nil:
		// A node that took the library knows no FCALL (a proxy, a failover to an older Redis)
		// or may not run it (an ACL).
		b.refuseLibrary(refused)
	case lost:
		b.reloadLibrary()
	case !fcall && b.libraryWanted() && b.mono() >= b.libraryNext.Load():
		b.reloadLibrary()
	}
	if len(again) > 0 {
		if asking == nil {
			againAsking = nil
		}
		return n.pipeline(ctx, again, againAsking)
	}
	return nil
}

// pipeline sends cmds in one round trip; each command carries its own error. It returns the
// error of the round trip itself, when it failed. A command marked in asking goes after an
// ASKING.
func (n *node) pipeline(ctx context.Context, cmds []*goredis.Cmd, asking []bool) error {
	if len(cmds) == 1 && asking == nil {
		if err := n.rdb.Process(ctx, cmds[0]); err != nil {
			if cmds[0].Err() == nil {
				cmds[0].SetErr(err)
			}
			if !isReply(err) {
				return err
			}
		}
		return nil
	}
	pipe := n.rdb.Pipeline()
	for i, c := range cmds {
		if asking != nil && asking[i] {
			_ = pipe.Process(ctx, goredis.NewStatusCmd(ctx, "asking"))
		}
		_ = pipe.Process(ctx, c)
	}
	_, err := pipe.Exec(ctx)
	if err != nil && !isReply(err) {
		// Not a reply: the round trip itself failed.
		for _, c := range cmds {
			if c.Err() == nil {
				c.SetErr(err)
			}
		}
		return err
	}
	return nil
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
		n.br.failure(err)
		if n.b.cluster {
			n.b.requestReload(reasonNodeDown)
		}
		return
	}
	for _, c := range cmds {
		cerr := c.Err()
		if cerr == nil {
			continue
		}
		if n.b.cluster {
			switch {
			case goredis.HasErrorPrefix(cerr, "MOVED"):
				n.b.requestReload(reasonMoved)
			case goredis.HasErrorPrefix(cerr, "ASK"):
				n.b.requestReload(reasonAsk)
			case goredis.HasErrorPrefix(cerr, "CLUSTERDOWN"):
				n.b.requestReload(reasonClusterDown)
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
			n.br.failure(cerr)
			return
		}
	}
	n.lastReply.Store(n.b.mono())
	n.br.success()
}
