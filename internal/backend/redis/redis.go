package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/pipeline"
)

// Options configures a Backend. Only Target is required.
type Options struct {
	Target Target
	// PoolSize is the number of connections per Redis node (default go-redis's, 10 per CPU).
	PoolSize int
	// DialTimeout bounds connecting (default 1s). ReadTimeout bounds one socket read or write
	// (default 1s): a reply slower than that on the wire counts as Redis failing.
	DialTimeout time.Duration
	ReadTimeout time.Duration
	// Timeout caps the budget of a decision (default 50ms). The budget is the caller's deadline
	// less a margin (half of what is left, at least 2ms), capped by Timeout; without a
	// deadline, Timeout. A decision whose budget passes before Redis answers fails with
	// backend.ErrOverloaded, and so does one whose deadline leaves no budget at all, at once and
	// without reaching Redis. Running out of time never opens the breaker by itself: when Redis
	// has answered nothing for a while, a probe checks it (see BreakerFailures). A decision that
	// ran out of time after its call left may still have been charged in Redis.
	Timeout time.Duration
	// KeyPrefix is prepended to every Redis key (default "rls:").
	KeyPrefix string
	// LocalCacheSize is the number of denied keys remembered in this process (0 disables).
	LocalCacheSize int
	// Coalesce, when > 0, gathers the script calls of concurrent decisions into pipelines of up
	// to Coalesce calls, sent by CoalescePipelines goroutines (default 1: Redis runs one command
	// at a time anyway); on a single node each pipeline is one script call. When 0, every
	// decision is its own pipeline, with up to PoolSize in flight.
	Coalesce          int
	CoalescePipelines int
	// BreakerFailures consecutive failures of Redis open the circuit breaker (default 5): no
	// connection, an error reply that says Redis cannot serve (LOADING, NOAUTH, READONLY...),
	// a reply slower than ReadTimeout. A probe on its own connection that gets no PONG within
	// ProbeTimeout (default 1s), sent when decisions time out and Redis has not answered
	// anything for a while, opens it at once. Time spent waiting in this process never counts.
	// While open, Decide fails at once and Redis is probed every BreakerCooldown (default
	// 500ms); the first answer closes it.
	BreakerFailures int
	BreakerCooldown time.Duration
	ProbeTimeout    time.Duration
	// HealthInterval is how often each node is probed and its epoch checked (default 1s; < 0
	// turns the checks off): a node that went away with no decision to notice it is found, and
	// a node that lost its data (FLUSHALL, a restart without persistence) is logged and counted.
	HealthInterval time.Duration
	// LeaseLifetime, when > 0, lets hot keys lease budget (see lease.go): a lease of k hits is
	// charged in Redis and admits up to k requests here for LeaseLifetime; what it did not use
	// is then given back. 0 sends every decision to Redis.
	LeaseLifetime time.Duration
	// Now is this process's clock (default time.Now), read only for the local cache: decisions
	// take their time from Redis.
	Now func() time.Time
	// Logger receives availability changes (default slog.Default()).
	Logger *slog.Logger

	// evalOnly (tests) keeps the backend on EVALSHA, never loading the library of Redis
	// Functions.
	evalOnly bool
}

// Backend is a backend.Backend on Redis. It is safe for concurrent use. It holds its parts:
// the single node (single node and Sentinel) or the Cluster's topology, which own the nodes;
// what decides (the leases layer over the core, or the core); the health subscribers; the
// library's state; the background work and the clock they share.
type Backend struct {
	*core                   // what decides without leases (decide.go)
	*clock                  // mono, the instants of nodes and leases
	*background             // goroutines that outlive a call: the library's loads, undos, the topology's loop
	lib         *libraryUse // the library of Redis Functions: FCALL or EVALSHA (library.go)

	// rdb and probe are, on a single node and Sentinel, the node's clients (the decisions' and
	// the probe's, closed with it); on a Cluster, both the topology's admin ClusterClient, kept
	// for keys' administration (Reset), while decisions go through each master's node.
	rdb    goredis.UniversalClient
	probe  goredis.UniversalClient
	single *node        // single node and Sentinel
	topo   *clusterTopo // Cluster

	leases *leases                // the layer over the core that Decide calls when leases are on; nil when off
	shares atomic.Pointer[Shares] // the region's shares of global limits (SetShares)

	target    Target
	probeTO   time.Duration
	log       *slog.Logger
	warn      *logthrottle.Throttle // warnings that repeat while Redis is down
	resets    atomic.Uint64         // data losses found
	health    *healthSubs
	closeOnce sync.Once

	slotsExpired atomic.Uint64                  // expired slots dropped (slots.go)
	slotPipe     *pipeline.Coalescer[*slotCall] // slot calls' pipelines, from the first (slots.go)
	slotPipeOnce sync.Once
}

// decider decides a batch: the core, or the leases layer over it.
type decider interface {
	Decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error)
}

var (
	_ backend.Backend     = (*Backend)(nil)
	_ backend.Health      = (*Backend)(nil)
	_ backend.CachePurger = (*Backend)(nil)
	_ backend.CacheStats  = (*Backend)(nil)
	_ backend.Resetter    = (*Backend)(nil)
	_ backend.Degradation = (*Backend)(nil)

	_ decider = (*core)(nil)
	_ decider = (*leases)(nil)
)

// Decide implements backend.Backend: the leases layer decides when leases are on, the core
// otherwise. Each is called as what it is, not through decider: through an interface, the
// compiler cannot tell that the batch's slices do not outlive the call, and a caller's reqs
// and out would be moved to the heap, two allocations a decision.
func (b *Backend) Decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	if len(out) < len(reqs) {
		return false, fmt.Errorf("redis backend: %d decisions for %d requests", len(out), len(reqs))
	}
	if s := b.shares.Load(); s != nil {
		shared, until, err := applyShares(ctx, *s, reqs)
		if err != nil {
			return false, err
		}
		if !until.IsZero() {
			return b.decideShared(ctx, *s, shared, out[:len(reqs)], until)
		}
	}
	return b.decide(ctx, reqs, out[:len(reqs)])
}

func (b *Backend) decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	if backend.HoldsSlots(reqs) {
		return b.decideSlots(ctx, reqs, out)
	}
	if b.leases != nil {
		return b.leases.Decide(ctx, reqs, out)
	}
	return b.core.Decide(ctx, reqs, out)
}

// decideShared decides reqs, which hold the region's shares of global limits good until until
// (see applyShares). An answer that comes after until may have been decided by Redis after the
// shares moved to other regions (this process paused or starved between reading them and
// Redis), so it does not admit: its global requests are denied, and what the batch charged
// stays charged (a loss to this region only, never an excess of the global limit).
func (b *Backend) decideShared(ctx context.Context, s Shares, reqs []backend.Request, out []backend.Decision, until time.Time) (bool, error) {
	admitted, err := b.decide(ctx, reqs, out)
	if err != nil || !time.Now().After(until) {
		return admitted, err
	}
	late := 0
	for i := range reqs {
		if reqs[i].Limit.Shared && !reqs[i].Limit.Overdraft && out[i].Allowed {
			out[i] = backend.Decision{RetryAfter: max(out[i].ResetAfter, time.Millisecond), ResetAfter: out[i].ResetAfter}
			late++
		}
	}
	if late > 0 {
		s.Late(late)
	}
	return backend.Admitted(reqs, out), nil
}

// Shares gives the region's shares of global limits (package regions).
type Shares interface {
	// Limit returns the limit to decide key by under l, a Shared limit: this region's share
	// of it, and the instant until which that share is the region's. cost is the request's,
	// counted as demand.
	Limit(ctx context.Context, key string, l limit.Limit, cost int64) (limit.Limit, time.Time, error)
	// Late counts decisions answered after their shares' instant, and so denied.
	Late(decisions int)
}

// SetShares makes every request of a Shared limit decided under s's share of it. Requests that
// also have Overdraft are the regions' own charges and carry their share already.
func (b *Backend) SetShares(s Shares) { b.shares.Store(&s) }

// applyShares returns reqs with each Shared limit replaced by s's share of it (a copy when any
// is, reqs itself otherwise) and the earliest instant until which those shares hold (zero when
// none is shared).
func applyShares(ctx context.Context, s Shares, reqs []backend.Request) ([]backend.Request, time.Time, error) {
	var out []backend.Request
	var until time.Time
	for i := range reqs {
		r := &reqs[i]
		if !r.Limit.Shared || r.Limit.Overdraft {
			continue
		}
		if out == nil {
			out = slices.Clone(reqs)
		}
		cost := r.Cost
		if r.Refund {
			cost = 0
		}
		l, good, err := s.Limit(ctx, r.Key, r.Limit, cost)
		if err != nil {
			return nil, time.Time{}, err
		}
		out[i].Limit = l
		if until.IsZero() || good.Before(until) {
			until = good
		}
	}
	if out == nil {
		return reqs, time.Time{}, nil
	}
	return out, until, nil
}

// clock is the backend's monotonic clock.
type clock struct{ epoch time.Time }

func (c *clock) mono() int64 { return int64(time.Since(c.epoch)) }

// background runs the backend's goroutines that outlive a call, until close.
type background struct {
	bgMu     sync.Mutex
	bgClosed bool
	bgCtx    context.Context // ends at close
	bgCancel context.CancelFunc
	bg       sync.WaitGroup
}

func newBackground() *background {
	w := &background{}
	w.bgCtx, w.bgCancel = context.WithCancel(context.Background())
	return w
}

// spawn runs f in a goroutine with the background's context, unless closed; it reports whether
// it did.
func (w *background) spawn(f func(ctx context.Context)) bool {
	w.bgMu.Lock()
	defer w.bgMu.Unlock()
	if w.bgClosed {
		return false
	}
	w.bg.Go(func() { f(w.bgCtx) })
	return true
}

// close ends the background's context and waits for its goroutines.
func (w *background) close() {
	w.bgMu.Lock()
	w.bgClosed = true
	w.bgMu.Unlock()
	w.bgCancel()
	w.bg.Wait()
}

// healthSubs tells its subscribers when healthy changes.
type healthSubs struct {
	healthy func() bool
	mu      sync.Mutex
	subs    map[int]func(bool)
	next    int
	last    bool // what the subscribers last heard
}

// changed tells the subscribers when healthy changed.
func (h *healthSubs) changed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	healthy := h.healthy()
	if healthy == h.last {
		return
	}
	h.last = healthy
	for _, f := range h.subs {
		f(healthy)
	}
}

func (h *healthSubs) subscribe(f func(healthy bool)) (cancel func()) {
	h.mu.Lock()
	id := h.next
	h.next++
	h.subs[id] = f
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.subs, id)
		h.mu.Unlock()
	}
}

// Errors, each wrapping backend.ErrUnavailable.
var (
	// errOpen is returned while the circuit breaker is open.
	errOpen = fmt.Errorf("%w: redis: circuit breaker open", backend.ErrUnavailable)
	// errShed is returned for a decision that ran out of its budget before Redis answered it.
	errShed = fmt.Errorf("%w: redis: no answer within the budget", backend.ErrOverloaded)
)

// New connects to Redis as opts says and loads the script. Redis being unreachable is not an
// error: the backend then starts unavailable and becomes available as soon as Redis answers.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if len(opts.Target.Addrs) == 0 {
		return nil, errors.New("redis backend: no address")
	}
	setDefault(&opts.DialTimeout, DefaultDialTimeout)
	setDefault(&opts.ReadTimeout, DefaultReadTimeout)
	setDefault(&opts.Timeout, DefaultTimeout)
	setDefault(&opts.KeyPrefix, DefaultKeyPrefix)
	setDefault(&opts.CoalescePipelines, DefaultCoalescePipelines)
	setDefault(&opts.BreakerFailures, DefaultBreakerFailures)
	setDefault(&opts.BreakerCooldown, DefaultBreakerCooldown)
	setDefault(&opts.ProbeTimeout, DefaultProbeTimeout)
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	var errs []error
	if opts.PoolSize < 0 {
		errs = append(errs, fmt.Errorf("pool size %d < 0", opts.PoolSize))
	}
	if opts.DialTimeout < 0 || opts.ReadTimeout < 0 || opts.Timeout < 0 || opts.BreakerCooldown < 0 || opts.ProbeTimeout < 0 || opts.LeaseLifetime < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if opts.LocalCacheSize < 0 || opts.Coalesce < 0 || opts.CoalescePipelines < 0 || opts.BreakerFailures < 0 {
		errs = append(errs, errors.New("sizes must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	co := clientOptions{poolSize: opts.PoolSize, dialTimeout: opts.DialTimeout, readTimeout: opts.ReadTimeout}
	setDefault(&opts.HealthInterval, DefaultHealthInterval)
	work := newBackground()
	c := &core{prefix: opts.KeyPrefix, cluster: opts.Target.Topology == Cluster, timeout: opts.Timeout, now: opts.Now,
		log: opts.Logger, work: work}
	c.jobs.New = func() any { return newJob() }
	b := &Backend{
		core:       c,
		clock:      &clock{epoch: time.Now()},
		background: work,
		target:     opts.Target,
		probeTO:    opts.ProbeTimeout,
		log:        opts.Logger,
		warn:       logthrottle.New(opts.Logger, 10*time.Second),
	}
	b.lib = &libraryUse{evalOnly: opts.evalOnly, mono: b.mono, log: b.log, work: work, timeout: opts.ProbeTimeout}
	b.health = &healthSubs{healthy: b.Healthy, subs: map[int]func(bool){}}
	cfg := nodeConfig{coalesce: opts.Coalesce, senders: opts.CoalescePipelines, failures: opts.BreakerFailures,
		cooldown: opts.BreakerCooldown, healthInterval: max(opts.HealthInterval, 0), probeTimeout: opts.ProbeTimeout}
	if opts.Coalesce == 0 {
		cfg.coalesce, cfg.senders = 1, opts.PoolSize
		if cfg.senders == 0 {
			cfg.senders = 10 * runtime.GOMAXPROCS(0) // go-redis's default pool size
		}
	}
	if opts.LocalCacheSize > 0 {
		c, err := newDenials(opts.LocalCacheSize)
		if err != nil {
			return nil, fmt.Errorf("redis backend: %w", err)
		}
		b.cache = c
	}
	if opts.LeaseLifetime > 0 {
		b.leases = newLeases(c, b.mono, opts.LeaseLifetime)
	}
	deps := &nodeDeps{libraryUse: b.lib, cfg: cfg, cluster: b.cluster, merge: opts.Coalesce > 0, log: b.log, warn: b.warn,
		mono: b.mono, nowArg: b.nowArg, healthChanged: b.health.changed,
		resets: &b.resets, purge: func() { purge(c, b.leases) }}
	lctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	if b.cluster {
		b.topo = newClusterTopo(opts.Target, b.prefix, co, deps, b.log, b.warn, b.health.changed)
		b.lib.loadAll = b.topo.loadMasters
		c.topo = b.topo
		deps.requestReload, deps.epochKey, deps.slotsOf = b.topo.requestReload, b.topo.epochKeyOf, b.topo.slotsOf
		b.rdb = b.topo.admin
		b.probe = b.rdb
		err := b.topo.reload(lctx)
		if err == nil {
			var loaded bool
			var refused error
			if loaded, refused, err = b.topo.loadMasters(lctx, b.lib.libraryWanted()); err == nil {
				b.lib.useLibrary(loaded, refused)
			}
		}
		if err != nil {
			b.log.Warn("redis unavailable at start; deciding nothing until it answers", "redis", opts.Target.String(), "err", err)
		}
		b.spawn(b.topo.loop)
		b.health.changed()
		return b, nil
	}
	epochKey := b.prefix + "epoch{}"
	deps.requestReload = func(string) {}
	deps.epochKey = func(*node) string { return epochKey }
	deps.slotsOf = func(*node) int { return 0 }
	b.rdb = newClient(opts.Target, co)
	b.probe = newClient(opts.Target, probeOptions(co))
	probe := b.probe
	b.lib.loadAll = func(ctx context.Context, wanted bool) (bool, error, error) { return load(ctx, probe, wanted) }
	name := opts.Target.Addrs[0]
	if opts.Target.Topology == Sentinel {
		name = "sentinel:" + opts.Target.Master
	}
	b.single = newNode(name, b.rdb, b.probe, deps)
	c.single = b.single
	b.health.last = true
	// Loaded through the main client: its first connection is then open before any decision.
	if loaded, refused, err := load(lctx, b.rdb, b.lib.libraryWanted()); err != nil {
		b.log.Warn("redis unavailable at start; deciding nothing until it answers", "redis", opts.Target.String(), "err", err)
		b.single.br.Trip(err)
	} else {
		b.lib.useLibrary(loaded, refused)
		b.single.lastReply.Store(b.mono())
	}
	b.single.start()
	return b, nil
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Healthy implements backend.Health: false while no node answers (on a single node or
// Sentinel, while its circuit breaker is open; on a Cluster, while no master in the slot map
// answers, or there is no map).
func (b *Backend) Healthy() bool {
	if !b.cluster {
		return b.single.br.Allow()
	}
	return b.topo.healthy()
}

// Degraded implements backend.Degradation: on a Cluster, how many slots are unavailable while
// others are served (their master is down, or no master serves them).
func (b *Backend) Degraded() string {
	if n := b.slotsDown(); n > 0 && n < slotCount {
		return fmt.Sprintf("%d of %d Redis Cluster slots unavailable (their master is down)", n, slotCount)
	}
	return ""
}

// slotsDown counts the Cluster slots unavailable: all of them with no slot map yet; 0 off a
// Cluster.
func (b *Backend) slotsDown() int {
	if !b.cluster {
		return 0
	}
	return b.topo.slotsDown()
}

// SubscribeHealth implements backend.Health.
func (b *Backend) SubscribeHealth(f func(healthy bool)) (cancel func()) { return b.health.subscribe(f) }

// PurgeCache implements backend.CachePurger: it forgets every cached denial, and ends every
// lease, giving back what it did not use. Cached entries are kept per limit, so a changed rule
// never reuses a denial made under the old one; this is for when Redis state was reset, and
// for a rule reload, whose limits leases were not charged under.
func (b *Backend) PurgeCache() { purge(b.core, b.leases) }

// purge forgets c's cached denials and ends the leases of l (nil when off).
func purge(c *core, l *leases) {
	if c.cache != nil {
		c.cache.c.Purge()
	}
	if l != nil {
		l.release()
	}
}

// Reset implements backend.Resetter: it deletes the keys' states in Redis (one DEL per key, in
// one pipeline, so that Cluster slots do not matter) and drops them from this process's local
// cache. Other replicas' local caches may still deny such a key until the instant they cached.
func (b *Backend) Reset(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	if !b.Healthy() {
		return errOpen
	}
	ctx, cancel := context.WithTimeout(ctx, max(b.timeout, time.Second))
	defer cancel()
	pipe := b.rdb.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, storedKey(b.prefix, k))
	}
	_, err := pipe.Exec(ctx)
	if b.cache != nil {
		for _, k := range keys {
			b.cache.c.Remove(k)
		}
	}
	if b.leases != nil {
		b.leases.forget(keys)
	}
	if err != nil {
		return fmt.Errorf("redis backend: reset: %w", classify(err))
	}
	return nil
}

// CacheHits implements backend.CacheStats: how many decisions the local over-limit cache
// answered without a round trip.
func (b *Backend) CacheHits() uint64 { return b.cacheHits.Load() }

// Close stops the backend's goroutines and closes its connections.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		if b.leases != nil {
			b.leases.close() // gives back every lease, while the nodes still answer
		}
		b.slotPipeOnce.Do(func() {}) // no coalescer of slot calls starts once closing
		if b.slotPipe != nil {
			b.slotPipe.Close()
		}
		b.background.close()
		var errs []error
		if b.single != nil {
			errs = append(errs, b.single.close())
		}
		if b.topo != nil {
			errs = append(errs, b.topo.close())
		}
		b.warn.Close()
		err = errors.Join(errs...)
	})
	return err
}

// schedLatencies returns the runtime's histogram of how long goroutines have waited, runnable,
// for a CPU, since the process started.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// backlogPerP is how many goroutines waiting for a CPU, per P, say this process is starved
// whatever its histogram of waits says (see backlogged): behind that many, a goroutine that
// becomes runnable waits milliseconds even if each runs for a few tens of microseconds.
const backlogPerP = 128

// backlogged reports whether the run queues hold backlogPerP or more goroutines per P now. The
// histogram of waits (see starved) counts a wait only once it ends, so a process whose
// goroutines are all still waiting, the most starved, shows there as few short waits: the
// depth of its run queues shows it.
func backlogged() bool {
	s := []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Kind() == metrics.KindUint64 &&
		s[0].Value.Uint64() >= backlogPerP*uint64(runtime.GOMAXPROCS(0))
}

// starved reports whether, between two samples of schedLatencies taken around a probe of the
// given timeout, this process was too short of CPU for the probe to tell anything: a tenth or
// more of the waits for a CPU lasted a tenth of the timeout or longer, or some wait lasted half
// of it. The latter is the probe's own case: a reply that arrived in time but whose reader
// waited in the run queue past the deadline reads as a timeout (the deadline is checked before
// the socket), and that one long wait can hide among thousands of short ones.
func starved(before, after *metrics.Float64Histogram, timeout time.Duration) bool {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return false
	}
	var all, long, longest uint64
	for i, n := range after.Counts {
		d := n - before.Counts[i]
		all += d
		if after.Buckets[i] >= (timeout / 10).Seconds() { // the bucket's lower bound
			long += d
		}
		if after.Buckets[i] >= (timeout / 2).Seconds() {
			longest += d
		}
	}
	return all > 0 && (long*10 >= all || longest > 0)
}
