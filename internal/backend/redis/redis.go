package redis

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
)

//go:embed gcra.lua
var scriptSource string

var script = goredis.NewScript(scriptSource)

// Options configures a Backend. Only Target is required.
type Options struct {
	Target Target
	// PoolSize is the number of connections per Redis node (default go-redis's, 10 per CPU).
	PoolSize int
	// DialTimeout bounds connecting (default 1s); ReadTimeout bounds one socket read or write
	// (default 1s). A decision is bounded by Timeout whatever these are.
	DialTimeout time.Duration
	ReadTimeout time.Duration
	// Timeout bounds a whole Decide, round trips and waiting for a connection included
	// (default 10ms, well under Envoy's 20ms rate limit timeout). Past it Decide returns an
	// error wrapping backend.ErrUnavailable.
	Timeout time.Duration
	// KeyPrefix is prepended to every Redis key (default "rls:").
	KeyPrefix string
	// LocalCacheSize is the number of denied keys remembered in this process (0 disables).
	LocalCacheSize int
	// Coalesce, when > 0, gathers the script calls of concurrent Decide calls into pipelines of
	// up to Coalesce calls. At most CoalescePipelines pipelines are in flight (default 1: Redis
	// runs one command at a time anyway); a call that finds them all in flight waits for one to
	// return and joins the next.
	Coalesce          int
	CoalescePipelines int
	// BreakerFailures consecutive failures open the circuit breaker (default 5); while open,
	// Decide fails at once and Redis is probed every BreakerCooldown (default 500ms).
	BreakerFailures int
	BreakerCooldown time.Duration
	// Now is this process's clock (default time.Now), read only for the local cache: decisions
	// take their time from Redis.
	Now func() time.Time
	// Logger receives availability changes (default slog.Default()).
	Logger *slog.Logger
	// OnHealthChange, when set, is called when Redis becomes unavailable (the breaker opens)
	// and available again. It must not block.
	OnHealthChange func(healthy bool)
}

// Backend is a backend.Backend on Redis. It is safe for concurrent use.
type Backend struct {
	rdb     goredis.UniversalClient
	cluster bool
	prefix  string
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger
	cache   *denials // nil when disabled
	br      *breaker
	co      *coalescer // nil when disabled
	onState func(bool)

	closeOnce sync.Once
	cacheHits atomic.Uint64

	// scriptNow, when set (tests), is the instant the script decides at instead of Redis TIME.
	scriptNow func() int64
}

var _ backend.Backend = (*Backend)(nil)

// New connects to Redis as opts says and loads the script. Redis being unreachable is not an
// error: the backend then starts unavailable and becomes available as soon as Redis answers.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if len(opts.Target.Addrs) == 0 {
		return nil, errors.New("redis backend: no address")
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = time.Second
	}
	if opts.ReadTimeout == 0 {
		opts.ReadTimeout = time.Second
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Millisecond
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = "rls:"
	}
	if opts.CoalescePipelines == 0 {
		opts.CoalescePipelines = 1
	}
	if opts.BreakerFailures == 0 {
		opts.BreakerFailures = 5
	}
	if opts.BreakerCooldown == 0 {
		opts.BreakerCooldown = 500 * time.Millisecond
	}
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
	if opts.DialTimeout < 0 || opts.ReadTimeout < 0 || opts.Timeout < 0 || opts.BreakerCooldown < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if opts.LocalCacheSize < 0 || opts.Coalesce < 0 || opts.CoalescePipelines < 0 || opts.BreakerFailures < 0 {
		errs = append(errs, errors.New("sizes must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	b := &Backend{
		rdb: newClient(opts.Target, clientOptions{
			poolSize: opts.PoolSize, dialTimeout: opts.DialTimeout, readTimeout: opts.ReadTimeout,
		}),
		cluster: opts.Target.Topology == Cluster,
		prefix:  opts.KeyPrefix,
		timeout: opts.Timeout,
		now:     opts.Now,
		log:     opts.Logger,
		onState: opts.OnHealthChange,
	}
	if opts.LocalCacheSize > 0 {
		c, err := newDenials(opts.LocalCacheSize)
		if err != nil {
			b.rdb.Close()
			return nil, fmt.Errorf("redis backend: %w", err)
		}
		b.cache = c
	}
	b.br = newBreaker(opts.BreakerFailures, opts.BreakerCooldown, b.load, b.healthChanged)
	if opts.Coalesce > 0 {
		b.co = newCoalescer(b, opts.Coalesce, opts.CoalescePipelines)
	}
	lctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	if err := b.load(lctx); err != nil {
		b.log.Warn("redis unavailable at start; deciding nothing until it answers", "redis", opts.Target.String(), "err", err)
		b.br.trip()
	}
	return b, nil
}

func (b *Backend) healthChanged(healthy bool) {
	if healthy {
		b.log.Info("redis available")
	} else {
		b.log.Warn("redis unavailable: circuit breaker open, failing fast and probing")
	}
	if b.onState != nil {
		b.onState(healthy)
	}
}

// load puts the script into every master's script cache; it doubles as the breaker's probe.
func (b *Backend) load(ctx context.Context) error {
	if c, ok := b.rdb.(*goredis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
			return script.Load(ctx, n).Err()
		})
	}
	return script.Load(ctx, b.rdb).Err()
}

// Healthy reports whether Redis is answering: false while the circuit breaker is open.
func (b *Backend) Healthy() bool { return b.br.allow() }

// PurgeLocalCache forgets every cached denial. Entries are kept per limit, so a changed rule
// never reuses a denial made under the old one; this is for when Redis state was reset.
func (b *Backend) PurgeLocalCache() {
	if b.cache != nil {
		b.cache.c.Purge()
	}
}

// Close stops the backend's goroutines and closes its connections.
func (b *Backend) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.br.close()
		err = b.rdb.Close()
	})
	return err
}

// errOpen is returned while the circuit breaker is open.
var errOpen = fmt.Errorf("%w: redis: circuit breaker open", backend.ErrUnavailable)

// Decide implements backend.Backend.
func (b *Backend) Decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	if len(out) < len(reqs) {
		return false, fmt.Errorf("redis backend: %d decisions for %d requests", len(out), len(reqs))
	}
	out = out[:len(reqs)]
	sent := b.now()
	if b.cache != nil && b.fromCache(reqs, out, sent) {
		b.cacheHits.Add(1)
		return settle(reqs, out), nil
	}
	j, err := b.plan(reqs, out)
	if err != nil {
		return false, err
	}
	if len(j.groups) == 0 {
		return settle(reqs, out), nil
	}
	if !b.br.allow() {
		return false, errOpen
	}
	tctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	admitted, err := b.decide(tctx, j, reqs, out)
	if err != nil {
		// A caller that went away says nothing about Redis.
		if ctx.Err() == nil && countsAsFailure(err) {
			b.br.failure()
		}
		return false, fmt.Errorf("%w: redis: %w", backend.ErrUnavailable, err)
	}
	b.br.success()
	settle(reqs, out)
	if b.cache != nil {
		for i := range reqs {
			if reqs[i].Limit.Rate > 0 && !repeated(reqs, i) {
				b.cache.learn(&reqs[i], out[i], sent)
			}
		}
	}
	return admitted, nil
}

// LocalCacheHits returns how many decisions the local over-limit cache answered without a
// round trip.
func (b *Backend) LocalCacheHits() uint64 { return b.cacheHits.Load() }

// fromCache answers the batch when the cache knows every request of it is denied.
func (b *Backend) fromCache(reqs []backend.Request, out []backend.Decision, now time.Time) bool {
	for i := range reqs {
		r := &reqs[i]
		if r.Limit.Rate == 0 {
			out[i] = decideRateZero(r)
			continue
		}
		d, ok := b.cache.lookup(r, now)
		if !ok {
			return false
		}
		out[i] = d
	}
	return true
}

// settle returns whether the batch is admitted and, when it is not, reports the allowed
// requests under a rate of 0 as what a check of them says, as every other allowed request of a
// refused batch is.
func settle(reqs []backend.Request, out []backend.Decision) bool {
	admitted := backend.Admitted(reqs, out)
	if !admitted {
		for i := range reqs {
			if reqs[i].Limit.Rate == 0 && out[i].Allowed {
				_, out[i] = backend.Decide(backend.State{}, reqs[i].Limit, 0, 0)
			}
		}
	}
	return admitted
}

// decideRateZero decides a request under a rate of 0, which needs no state.
func decideRateZero(r *backend.Request) backend.Decision {
	if r.Refund {
		_, d := backend.Refund(backend.State{}, r.Limit, 0, r.Cost)
		return d
	}
	_, d := backend.Decide(backend.State{}, r.Limit, 0, r.Cost)
	return d
}

func repeated(reqs []backend.Request, i int) bool {
	for j := range reqs {
		if j != i && reqs[j].Key == reqs[i].Key {
			return true
		}
	}
	return false
}

// countsAsFailure reports whether err says Redis is unavailable, rather than refusing one call.
func countsAsFailure(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return true // network, timeout, closed pool
	}
	msg := re.Error()
	for _, p := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "TRYAGAIN", "BUSY"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// group is one script call: the requests of a batch whose keys share a slot.
type group struct {
	slot int
	idx  []int // request indices, in batch order
	keys []string
	cmd  *goredis.Cmd
	// From the reply:
	charged bool
	check   []int64 // per request: the check-only remaining and reset (µs), multi only
	delta   []int64 // per request: the change written, (µs, frac), multi only
}

type job struct {
	groups []*group
	multi  bool
}

// plan decides the rate-0 requests and splits the others into script calls.
func (b *Backend) plan(reqs []backend.Request, out []backend.Decision) (*job, error) {
	j := &job{}
	var bySlot map[int]*group
	refused := false
	quota, quotaKnown, quotaKnownAllowed := 0, 0, 0
	for i := range reqs {
		r := &reqs[i]
		if err := r.Limit.Validate(); err != nil {
			return nil, fmt.Errorf("redis backend: request %d: %w", i, err)
		}
		if r.Mode == backend.Quota {
			quota++
		}
		if r.Limit.Rate == 0 {
			out[i] = decideRateZero(r)
			switch {
			case r.Mode == backend.Enforce && !out[i].Allowed:
				refused = true
			case r.Mode == backend.Quota:
				quotaKnown++
				if out[i].Allowed {
					quotaKnownAllowed++
				}
			}
			continue
		}
		key := storedKey(b.prefix, r.Key)
		var g *group
		switch {
		case !b.cluster:
			if len(j.groups) == 0 {
				j.groups = append(j.groups, &group{})
			}
			g = j.groups[0]
		default:
			s := slot(key)
			if bySlot == nil {
				bySlot = map[int]*group{}
			}
			if g = bySlot[s]; g == nil {
				g = &group{slot: s}
				bySlot[s] = g
				j.groups = append(j.groups, g)
			}
		}
		g.idx = append(g.idx, i)
		g.keys = append(g.keys, key)
	}
	if quota > 0 && quota == quotaKnown && quotaKnownAllowed == 0 {
		refused = true // every quota request is under a rate of 0
	}
	j.multi = len(j.groups) > 1
	nowArg := b.nowArg()
	for _, g := range j.groups {
		// A group may refuse the batch for its quota requests only when it holds every one
		// whose outcome is not known yet, and no known one is allowed.
		threshold := 0
		if refused {
			threshold = -1
		} else if quota > 0 && quotaKnownAllowed == 0 {
			local := 0
			for _, i := range g.idx {
				if reqs[i].Mode == backend.Quota {
					local++
				}
			}
			if local == quota-quotaKnown {
				threshold = local
			}
		}
		multi := 0
		if j.multi {
			multi = 1
		}
		vals := make([]byte, 0, 40*len(g.idx))
		for _, i := range g.idx {
			r := &reqs[i]
			flags := int64(r.Mode) * 2
			if r.Refund {
				flags++
			}
			// Any cost beyond the burst is denied (or refunds the whole burst) and any below 0
			// charges nothing, so the clamp changes no result and keeps the double exact.
			cost := min(max(r.Cost, 0), r.Limit.Burst+1)
			vals = appendValues(vals, r.Limit.Rate, int64(r.Limit.Period/time.Microsecond), r.Limit.Burst, cost, flags)
		}
		args := make([]any, 0, 3+len(g.keys)+5)
		args = append(args, "evalsha", script.Hash(), len(g.keys))
		for _, k := range g.keys {
			args = append(args, k)
		}
		args = append(args, "d", nowArg, threshold, multi, vals)
		g.cmd = goredis.NewCmd(context.Background(), args...)
		g.cmd.SetFirstKeyPos(3)
	}
	return j, nil
}

// decide runs the job's script calls, fills out and undoes the charges of a batch that a slot
// refused after others were charged.
func (b *Backend) decide(ctx context.Context, j *job, reqs []backend.Request, out []backend.Decision) (bool, error) {
	cmds := make([]*goredis.Cmd, len(j.groups))
	for i, g := range j.groups {
		cmds[i] = g.cmd
	}
	if b.co != nil {
		if err := b.co.do(ctx, cmds); err != nil {
			// The worker may still be writing the replies: leave them alone.
			return false, err
		}
	} else {
		b.exec(ctx, cmds)
	}
	var errs []error
	for i, g := range j.groups {
		g.cmd = cmds[i]
		if err := g.parse(j.multi, out); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		if j.multi {
			if uerr := b.undo(ctx, j, reqs); uerr != nil {
				errs = append(errs, uerr)
			}
		}
		return false, errors.Join(errs...)
	}
	admitted := backend.Admitted(reqs, out)
	if !j.multi {
		if admitted != j.groups[0].charged {
			return false, fmt.Errorf("script charged=%v for a batch that is admitted=%v", j.groups[0].charged, admitted)
		}
		return admitted, nil
	}
	if admitted {
		for _, g := range j.groups {
			if !g.charged {
				return false, errors.New("script refused a slot of an admitted batch")
			}
		}
		return true, nil
	}
	// Refused by some slot: report every allowed decision as the check of the unchanged state,
	// as it will be once the charges are undone.
	for _, g := range j.groups {
		if !g.charged {
			continue
		}
		for k, i := range g.idx {
			if out[i].Allowed {
				out[i].Remaining = g.check[2*k]
				out[i].ResetAfter = time.Duration(g.check[2*k+1]) * time.Microsecond
			}
		}
	}
	return false, b.undo(ctx, j, reqs)
}

// appendValues appends vals as little-endian doubles, the form in which gcra.lua unpacks its
// per-key values in one call. Every value is an integer below 2^53, so exact.
func appendValues(buf []byte, vals ...int64) []byte {
	for _, v := range vals {
		buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(float64(v)))
	}
	return buf
}

// nowArg is the instant the script decides at: 0 for Redis TIME.
func (b *Backend) nowArg() int64 {
	if b.scriptNow != nil {
		return b.scriptNow()
	}
	return 0
}

// parse reads the group's reply into out.
func (g *group) parse(multi bool, out []backend.Decision) error {
	if err := g.cmd.Err(); err != nil {
		return err
	}
	vals, err := g.cmd.Int64Slice()
	if err != nil {
		return fmt.Errorf("script reply: %w", err)
	}
	n := len(g.idx)
	want := 1 + 4*n
	if multi {
		want += 4 * n
	}
	if len(vals) != want {
		return fmt.Errorf("script reply: %d values, want %d", len(vals), want)
	}
	g.charged = vals[0] == 1
	for k, i := range g.idx {
		v := vals[1+4*k:]
		out[i] = backend.Decision{
			Allowed:    v[0] == 1,
			Remaining:  v[1],
			RetryAfter: time.Duration(v[2]) * time.Microsecond,
			ResetAfter: time.Duration(v[3]) * time.Microsecond,
		}
	}
	if multi {
		g.check = vals[1+4*n : 1+6*n]
		g.delta = vals[1+6*n:]
	}
	return nil
}

// undo gives back what charged groups of a refused batch wrote.
func (b *Backend) undo(ctx context.Context, j *job, reqs []backend.Request) error {
	var cmds []*goredis.Cmd
	for _, g := range j.groups {
		if !g.charged {
			continue
		}
		g.charged = false
		var keys []string
		var vals []byte
		for k, i := range g.idx {
			dus, dfrac := g.delta[2*k], g.delta[2*k+1]
			if dus == 0 && dfrac == 0 {
				continue
			}
			r := &reqs[i]
			keys = append(keys, g.keys[k])
			vals = appendValues(vals, r.Limit.Rate, int64(r.Limit.Period/time.Microsecond), r.Limit.Burst, dus, dfrac)
		}
		if len(keys) == 0 {
			continue
		}
		args := make([]any, 0, 6+len(keys))
		args = append(args, "evalsha", script.Hash(), len(keys))
		for _, k := range keys {
			args = append(args, k)
		}
		args = append(args, "u", b.nowArg(), vals)
		c := goredis.NewCmd(context.Background(), args...)
		c.SetFirstKeyPos(3)
		cmds = append(cmds, c)
	}
	if len(cmds) == 0 {
		return nil
	}
	b.exec(ctx, cmds)
	var err error
	for _, c := range cmds {
		if cerr := c.Err(); cerr != nil && err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("undoing the charges of a refused batch: %w", err)
	}
	return nil
}

// exec sends cmds in one pipeline (one round trip per node) and sends again, as EVAL, those that
// found the script missing: a restart, a failover or SCRIPT FLUSH empties the script cache, and
// EVAL both runs the script and caches it again. A NOSCRIPT call ran nothing, so this is safe.
func (b *Backend) exec(ctx context.Context, cmds []*goredis.Cmd) {
	b.send(ctx, cmds)
	var again []*goredis.Cmd
	for i, c := range cmds {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			args := append([]any(nil), c.Args()...)
			args[0], args[1] = "eval", scriptSource
			cmds[i] = goredis.NewCmd(context.Background(), args...)
			cmds[i].SetFirstKeyPos(3)
			again = append(again, cmds[i])
		}
	}
	if len(again) > 0 {
		b.send(ctx, again)
	}
}

// send sends cmds in one round trip per node; each command carries its own error.
func (b *Backend) send(ctx context.Context, cmds []*goredis.Cmd) {
	if len(cmds) == 1 {
		if err := b.rdb.Process(ctx, cmds[0]); err != nil && cmds[0].Err() == nil {
			cmds[0].SetErr(err)
		}
		return
	}
	pipe := b.rdb.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, err := pipe.Exec(ctx)
	var re goredis.Error
	if err != nil && !errors.As(err, &re) {
		// Not a reply: the round trip itself failed.
		for _, c := range cmds {
			if c.Err() == nil {
				c.SetErr(err)
			}
		}
	}
}
