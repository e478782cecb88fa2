package regions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// Config is how a replica takes part in one limit across regions.
type Config struct {
	// Region names the replica's region; every replica of a region shares its Redis.
	Region string
	// Global is the coordination store, which every region reaches (off the decision path).
	Global goredis.UniversalClient
	// Local is the region's Redis, the one its decisions are stored in.
	Local goredis.UniversalClient
	// Charge charges cost requests to key under l, whatever remains (l has Overdraft): how a
	// share's growing burst is paid for before it applies (Change.Charge).
	Charge func(ctx context.Context, key string, l limit.Limit, cost int64) error
	Policy Policy
	// Regions, when above 0, is the number of regions (see CoordinatorConfig.Regions).
	Regions int
	// MaxKeys bounds the global keys the region reports and holds (see AgentConfig.MaxKeys).
	MaxKeys int
	// Interval is Δ: how often the region reports its demand and the coordinator steps.
	Interval time.Duration
	// Lease is how long a region applies its shares without hearing from the coordinator.
	Lease time.Duration
	// TableLease is how long a replica applies a table it fetched.
	TableLease time.Duration
	// Margin covers clocks that run at different rates (see CoordinatorConfig.Margin).
	Margin time.Duration
	// DecisionBudget is the longest a decision takes from its share's lookup to its end in the
	// store (the backend's time budget): a share is applied only while its table is good for
	// that much longer, as the decision runs then.
	DecisionBudget time.Duration
	// Prefix is prepended to every key, in both stores.
	Prefix string
	Logger *slog.Logger
}

// roleTTL is the least lifetime of the coordinator's role: a replica that stops (or is cut off)
// keeps it that long, and one whose steps are slow (round trips to a distant store) keeps it.
const roleTTL = 3 * time.Second

// Defaults of Config's durations.
const (
	DefaultInterval   = 500 * time.Millisecond
	DefaultLease      = 10 * time.Second
	DefaultTableLease = time.Second
	DefaultMargin     = 200 * time.Millisecond
)

// ErrNoTable is returned, wrapping backend.ErrUnavailable, when a replica has no table it may
// apply: the region's store did not answer a fetch.
var ErrNoTable = fmt.Errorf("%w: no table of global shares", backend.ErrUnavailable)

// Node is one replica's part: it applies its region's table to decisions, counts their demand,
// and, when it holds the role, acts as its region's agent or as the coordinator.
type Node struct {
	cfg   Config
	keys  keys
	start time.Time
	token string
	log   *slog.Logger

	view     atomic.Pointer[View]
	viewMu   sync.Mutex // one fetch at a time
	viewSeq  uint64     // the publication the view holds
	viewData map[string]Share
	viewVers map[string]uint64
	offLow   atomic.Int64 // the store's clock less this one's, at least (ns)

	demandMu sync.Mutex
	demand   map[string]*demandCount

	agentMu  sync.Mutex
	agent    *Agent
	observed map[string]bool                 // keys observed at the last tick
	history  map[string]*[demandWindow]int64 // key → hits of the last intervals, newest last
	limits   map[string][3]int64             // key → rate, burst, period (µs)

	coord *Coordinator // only the coordinator loop's goroutine uses it

	stats nodeStats

	stop chan struct{}
	done sync.WaitGroup
}

type demandCount struct {
	hits        int64
	rate, burst int64
	period      int64 // µs
}

// Start starts a replica's part. Close stops it.
func Start(cfg Config) (*Node, error) {
	if cfg.Region == "" || strings.ContainsAny(cfg.Region, " {}:") {
		return nil, fmt.Errorf("region %q: want a name without spaces, braces or colons", cfg.Region)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.TableLease <= 0 {
		cfg.TableLease = DefaultTableLease
	}
	if cfg.Margin <= 0 {
		cfg.Margin = DefaultMargin
	}
	if cfg.TableLease <= 2*cfg.DecisionBudget {
		return nil, fmt.Errorf("table lease %v: want more than twice the decision budget (%v)", cfg.TableLease, cfg.DecisionBudget)
	}
	if cfg.Lease < 2*cfg.TableLease+cfg.Margin {
		return nil, fmt.Errorf("lease %v: want at least twice the table lease (%v) plus the margin (%v)", cfg.Lease, cfg.TableLease, cfg.Margin)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	n := &Node{
		cfg: cfg, keys: newKeys(cfg.Prefix), start: time.Now(), token: hex.EncodeToString(tok[:]),
		log: cfg.Logger.With("region", cfg.Region), demand: map[string]*demandCount{},
		history: map[string]*[demandWindow]int64{}, observed: map[string]bool{}, limits: map[string][3]int64{},
		viewData: map[string]Share{}, viewVers: map[string]uint64{}, stop: make(chan struct{}),
	}
	for _, loop := range []func(){n.fetchLoop, n.demandLoop, n.agentLoop, n.replyLoop, n.coordLoop} {
		n.done.Add(1)
		go func() {
			defer n.done.Done()
			loop()
		}()
	}
	return n, nil
}

// Close stops the node's loops and closes both stores' clients.
func (n *Node) Close() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	n.done.Wait()
	n.cfg.Global.Close()
	n.cfg.Local.Close()
}

func (n *Node) mono() int64 { return int64(time.Since(n.start)) }

// every runs f every d until Close.
func (n *Node) every(d time.Duration, f func(ctx context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		// A round trip to the coordination store can take a good part of a second: a step
		// (three of them) is not cut short before the role it holds would end.
		ctx, cancel := context.WithTimeout(context.Background(), max(4*d, roleTTL))
		f(ctx)
		cancel()
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// Limit returns the limit to decide key by under l (a Shared limit): l with the region's share
// of its rate and burst, zero before any grant, and the instant until which that share is this
// region's: a decision answered later may have been taken after it moved to other regions
// (this process paused or starved between here and Redis), and must not admit (see Late). cost
// is counted as the key's demand.
func (n *Node) Limit(ctx context.Context, key string, l limit.Limit, cost int64) (limit.Limit, time.Time, error) {
	n.count(key, l, cost)
	// The decision runs in the store up to its budget from now: the table must be good until
	// then.
	v, at := n.view.Load(), n.mono()+int64(n.cfg.DecisionBudget)
	if v.Stale(at) {
		if err := n.fetch(ctx); err != nil {
			return l, time.Time{}, fmt.Errorf("%w: %v", ErrNoTable, err)
		}
		if v, at = n.view.Load(), n.mono()+int64(n.cfg.DecisionBudget); v.Stale(at) {
			return l, time.Time{}, ErrNoTable
		}
	}
	s := v.Share(key, Share{l.Rate, l.Burst}, at)
	l.Rate, l.Burst = s.Rate, s.Burst
	return l, n.start.Add(time.Duration(v.GoodUntil(at))), nil
}

// Late counts decisions on global keys answered after their shares' instant (see Limit), which
// the backend therefore denied.
func (n *Node) Late(decisions int) { n.stats.late.Add(uint64(decisions)) }

func (n *Node) count(key string, l limit.Limit, cost int64) {
	if cost <= 0 {
		return
	}
	n.demandMu.Lock()
	d := n.demand[key]
	if d == nil {
		d = &demandCount{}
		n.demand[key] = d
	}
	d.hits += cost
	d.rate, d.burst, d.period = l.Rate, l.Burst, l.PeriodMicros()
	n.demandMu.Unlock()
}

func (n *Node) fetchLoop() {
	n.every(n.cfg.TableLease/3, func(ctx context.Context) {
		if err := n.fetch(ctx); err != nil {
			n.log.Debug("global shares: fetching the region's table", "err", err)
		}
	})
}

// fetch reads what the region's table gained since the view's publication into a new view.
func (n *Node) fetch(ctx context.Context) error {
	n.viewMu.Lock()
	defer n.viewMu.Unlock()
	fetched := n.mono()
	if v := n.view.Load(); v != nil && fetched-v.fetched < int64(n.cfg.TableLease/10) {
		return nil // fetched just now, by another caller
	}
	res, err := fetchScript.Run(ctx, n.cfg.Local, []string{n.keys.table, n.keys.changes, n.keys.meta}, n.viewSeq).Slice()
	if err != nil {
		return err
	}
	after := n.mono()
	if len(res) < 5 || len(res)%2 != 1 {
		return fmt.Errorf("fetch: %d values", len(res))
	}
	sec, usec := toInt(res[0]), toInt(res[1])
	storeNow := (sec*1_000_000 + usec) * 1000
	n.offLow.Store(storeNow - after)
	seq, until, whole := toInt(res[2]), toInt(res[3])*1000, toInt(res[4]) == 1
	if whole || len(res) > 5 {
		// A copy, changed: the views handed out are never written to.
		data := make(map[string]Share, len(n.viewData)+(len(res)-5)/2)
		vers := make(map[string]uint64, len(data))
		if !whole {
			for k, s := range n.viewData {
				data[k], vers[k] = s, n.viewVers[k]
			}
		}
		for i := 5; i+1 < len(res); i += 2 {
			key, _ := res[i].(string)
			v, s, ok := parseEntry(res[i+1])
			switch {
			case !ok:
			case s == (Share{}):
				delete(data, key) // a share of nothing: removed from the table
				delete(vers, key)
			default:
				data[key], vers[key] = s, v
			}
		}
		n.viewData, n.viewVers = data, vers
	}
	n.viewSeq = uint64(seq)
	n.stats.fetched.Store(max(after, 1))
	n.stats.tableKeys.Store(int64(len(n.viewData)))
	n.view.Store(NewView(Published{Shares: n.viewData, Versions: n.viewVers, ValidUntil: until}, storeNow, fetched,
		n.cfg.TableLease, n.cfg.Policy))
	return nil
}

// parseEntry parses a table entry, "version rate burst [period µs]".
func parseEntry(v any) (uint64, Share, bool) {
	s, _ := v.(string)
	f := strings.Fields(s)
	if len(f) != 3 && len(f) != 4 {
		return 0, Share{}, false
	}
	ver, err1 := strconv.ParseUint(f[0], 10, 64)
	r, err2 := strconv.ParseInt(f[1], 10, 64)
	b, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, Share{}, false
	}
	return ver, Share{r, b}, true
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		i, _ := strconv.ParseInt(x, 10, 64)
		return i
	}
	return 0
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

// bucket is the demand bucket of instant t: Interval-long, on the wall clock (the replicas'
// wall clocks agree well enough for a measure of demand).
func (n *Node) bucket(t time.Time) int64 { return t.UnixMilli() / n.cfg.Interval.Milliseconds() }

// demandLoop adds this replica's demand of the last interval to the region's bucket.
func (n *Node) demandLoop() {
	n.every(n.cfg.Interval, func(ctx context.Context) {
		n.demandMu.Lock()
		counts := n.demand
		n.demand = make(map[string]*demandCount, len(counts))
		n.demandMu.Unlock()
		if len(counts) == 0 {
			return
		}
		// Each field is the key and its limit: the bucket expires whole, so nothing of a key
		// outlives its demand in the region's store.
		key := n.keys.demand(n.bucket(time.Now()))
		pipe := n.cfg.Local.Pipeline()
		for k, d := range counts {
			pipe.HIncrBy(ctx, key, fmt.Sprintf("%s\x00%d %d %d", k, d.rate, d.burst, d.period), d.hits)
		}
		pipe.PExpire(ctx, key, 4*n.cfg.Interval)
		if _, err := pipe.Exec(ctx); err != nil {
			n.log.Debug("global shares: writing demand", "err", err)
		}
	})
}

// agentLoop takes or keeps the region's agent role and, holding it, reports every interval.
func (n *Node) agentLoop() {
	n.every(n.cfg.Interval, func(ctx context.Context) {
		held, err := leaseScript.Run(ctx, n.cfg.Local, []string{n.keys.agent}, n.token, max(3*n.cfg.Interval, roleTTL).Milliseconds()).Int()
		n.agentMu.Lock()
		defer n.agentMu.Unlock()
		defer func() { n.stats.agent.Store(n.agent != nil) }()
		if err != nil || held == 0 {
			if n.agent != nil {
				n.log.Info("global shares: no longer this region's agent", "err", err)
				n.agent = nil
			}
			return
		}
		if n.agent == nil {
			if err := n.becomeAgent(ctx); err != nil {
				n.log.Warn("global shares: taking the agent role", "err", err)
				return
			}
		}
		n.report(ctx)
	})
}

// becomeAgent starts an agent from the region's published table.
func (n *Node) becomeAgent(ctx context.Context) error {
	base, err := n.cfg.Local.IncrBy(ctx, n.keys.seqBase, 1<<32).Result()
	if err != nil {
		return err
	}
	// The table as published, and its end on this clock: the store's end less the store's
	// time, read after the fetch began, plus this clock at the answer (an upper bound).
	res, err := fetchScript.Run(ctx, n.cfg.Local, []string{n.keys.table, n.keys.changes, n.keys.meta}, 0).Slice()
	if err != nil {
		return err
	}
	after := n.mono()
	if len(res) < 5 {
		return fmt.Errorf("fetch: %d values", len(res))
	}
	storeNow := (toInt(res[0])*1_000_000 + toInt(res[1])) * 1000
	last := &Published{Shares: map[string]Share{}, Versions: map[string]uint64{},
		ValidUntil: toInt(res[3])*1000 - storeNow + after}
	for i := 5; i+1 < len(res); i += 2 {
		key, _ := res[i].(string)
		if v, s, ok := parseEntry(res[i+1]); ok {
			last.Shares[key], last.Versions[key] = s, v
			if f := strings.Fields(res[i+1].(string)); len(f) == 4 {
				if p, _ := strconv.ParseInt(f[3], 10, 64); p > 0 {
					n.limits[key] = [3]int64{0, 0, p} // the period, for the charges of growth
				}
			}
		}
	}
	n.agent = NewAgent(AgentConfig{Region: n.cfg.Region, Policy: n.cfg.Policy, TableLease: n.cfg.TableLease,
		Margin: n.cfg.Margin, MaxKeys: n.cfg.MaxKeys}, last, uint64(base))
	n.log.Info("global shares: this replica is the region's agent", "keys", len(last.Shares))
	return nil
}

// report observes the region's demand of the last complete interval and sends a report.
func (n *Node) report(ctx context.Context) {
	counts, err := n.cfg.Local.HGetAll(ctx, n.keys.demand(n.bucket(time.Now())-1)).Result()
	if err != nil {
		n.log.Debug("global shares: reading demand", "err", err)
		return
	}
	hitsOf := map[string]int64{}
	for field, c := range counts {
		k, lim, ok := strings.Cut(field, "\x00")
		var l [3]int64
		if _, err := fmt.Sscanf(lim, "%d %d %d", &l[0], &l[1], &l[2]); !ok || err != nil || l[2] <= 0 {
			continue
		}
		n.limits[k] = l // replicas mid-rollout may differ: the last read wins
		hits, _ := strconv.ParseInt(c, 10, 64)
		hitsOf[k] += hits
	}
	seen := map[string]bool{}
	for k, hits := range hitsOf {
		n.observe(k, hits)
		seen[k] = true
	}
	for k := range n.observed {
		if !seen[k] && n.observe(k, 0) {
			seen[k] = true // still counted: its window is not empty yet
		}
	}
	n.observed = seen
	for k := range n.limits {
		if !seen[k] && !n.agent.Has(k) {
			delete(n.limits, k) // neither asked for nor held
		}
	}
	var held, demand float64
	n.agent.Each(func(key string, applied Share, d int64) {
		if l, ok := n.limits[key]; ok && l[2] > 0 {
			perSecond := 1e6 / float64(l[2])
			held += float64(applied.Rate) * perSecond
			demand += float64(d) * perSecond
		}
	})
	n.stats.refused.Store(n.agent.Refused)
	n.stats.held.Store(math.Float64bits(held))
	n.stats.demand.Store(math.Float64bits(demand))
	rep := n.agent.Report(n.mono())
	b, err := json.Marshal(rep)
	if err != nil {
		return
	}
	pipe := n.cfg.Global.Pipeline()
	pipe.RPush(ctx, n.keys.inbox, b)
	pipe.LTrim(ctx, n.keys.inbox, -10000, -1)
	if _, err := pipe.Exec(ctx); err != nil {
		n.log.Debug("global shares: sending the report", "err", err)
	}
}

// demandWindow is the number of intervals a key's demand is averaged over.
const demandWindow = 4

// observe records key's hits of the last interval and hands the agent its demand per period:
// the average over the last demandWindow intervals (a rate of a few requests per interval is
// noisy), or the last interval's when it is more than twice that (a demand that starts or
// jumps is followed at once), rounded. It reports whether any interval of the window had hits.
func (n *Node) observe(key string, hits int64) bool {
	l := n.limits[key]
	h := n.history[key]
	if h == nil {
		h = new([demandWindow]int64)
		n.history[key] = h
	}
	copy(h[:], h[1:])
	h[demandWindow-1] = hits
	var sum int64
	for _, v := range h {
		sum += v
	}
	perInterval := float64(sum) / demandWindow
	if last := float64(hits); last > 2*perInterval {
		perInterval = last
	}
	// Per period: hits per interval scaled to the limit's period (l[2], µs), rounded up.
	perPeriod := int64(min(math.Round(perInterval*float64(l[2])*1000/float64(n.cfg.Interval.Nanoseconds())), 1<<40))
	if perPeriod == 0 && sum > 0 {
		perPeriod = 1
	}
	n.agent.Observe(key, Share{l[0], l[1]}, perPeriod)
	if sum == 0 {
		delete(n.history, key)
		return false
	}
	return true
}

// replyLoop, while this replica is its region's agent, waits for the coordinator's replies and
// publishes what they grant.
func (n *Node) replyLoop() {
	for {
		select {
		case <-n.stop:
			return
		default:
		}
		n.agentMu.Lock()
		agent := n.agent != nil
		n.agentMu.Unlock()
		if !agent {
			select {
			case <-n.stop:
				return
			case <-time.After(n.cfg.Interval):
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*n.cfg.Interval+time.Second)
		res, err := n.cfg.Global.BLPop(ctx, n.cfg.Interval, n.keys.reply(n.cfg.Region)).Result()
		cancel()
		if err != nil {
			if !errors.Is(err, goredis.Nil) {
				select {
				case <-n.stop:
					return
				case <-time.After(n.cfg.Interval / 4):
				}
			}
			continue
		}
		var rep Reply
		if len(res) != 2 || json.Unmarshal([]byte(res[1]), &rep) != nil {
			continue
		}
		ctx, cancel = context.WithTimeout(context.Background(), n.cfg.Interval+time.Second)
		n.take(ctx, rep)
		cancel()
	}
}

// take applies a reply: the growing bursts charged first, then the table published.
func (n *Node) take(ctx context.Context, rep Reply) {
	n.agentMu.Lock()
	defer n.agentMu.Unlock()
	if n.agent == nil {
		return
	}
	changes := n.agent.Receive(n.mono(), rep)
	n.stats.replied.Store(n.mono())
	n.stats.leaseEnd.Store(n.agent.LeaseEnd())
	for i, c := range changes {
		if c.Charge <= 0 {
			continue
		}
		l := n.limits[c.Key]
		if l[2] <= 0 {
			// The key's period is not known here (no demand seen, no table entry): publish
			// the share without its burst's growth, which needs no charge (applying less
			// than granted is safe).
			changes[i].To.Burst -= c.Charge
			continue
		}
		lim := limit.Limit{Rate: c.To.Rate, Period: time.Duration(l[2]) * time.Microsecond, Burst: c.To.Burst,
			Shared: true, Overdraft: true}
		if err := n.cfg.Charge(ctx, c.Key, lim, c.Charge); err != nil {
			// The share cannot apply before its charge: start again from the published table.
			n.log.Warn("global shares: charging a share's growth; dropping the agent role", "key", c.Key, "err", err)
			n.agent = nil
			n.cfg.Local.Del(ctx, n.keys.agent)
			return
		}
	}
	pub := n.agent.Table()
	args := []any{n.token, (pub.ValidUntil + n.offLow.Load()) / 1000}
	for _, c := range changes {
		args = append(args, c.Key, fmt.Sprintf("%d %d %d %d", c.Version, c.To.Rate, c.To.Burst, n.limits[c.Key][2]))
	}
	seq, err := publishScript.Run(ctx, n.cfg.Local, []string{n.keys.agent, n.keys.table, n.keys.changes, n.keys.meta}, args...).Int64()
	switch {
	case err != nil:
		n.log.Warn("global shares: publishing the region's table; dropping the agent role", "err", err)
		n.agent = nil
	case seq < 0:
		n.log.Info("global shares: another replica is the region's agent")
		n.agent = nil
	default:
		n.agent.Published(n.mono(), pub)
	}
}

// coordLoop takes or keeps the coordinator's role in the coordination store and, holding it,
// steps every half interval.
func (n *Node) coordLoop() {
	n.every(n.cfg.Interval/2, func(ctx context.Context) {
		held, err := leaseScript.Run(ctx, n.cfg.Global, []string{n.keys.coord}, n.token, max(3*n.cfg.Interval, roleTTL).Milliseconds()).Int()
		if err != nil || held == 0 {
			if n.coord != nil {
				n.log.Info("global shares: no longer the coordinator", "err", err)
				n.coord = nil
			}
			n.stats.coordinator.Store(false)
			return
		}
		if n.coord == nil || held == 2 {
			if err := n.becomeCoordinator(ctx); err != nil {
				n.log.Warn("global shares: taking the coordinator role", "err", err)
				return
			}
		}
		before := n.coord.Granted
		if err := n.step(ctx); err != nil {
			n.log.Warn("global shares: coordinator step", "err", err)
			n.coord = nil // read the state again before the next step
			n.stats.failures.Add(1)
		} else {
			n.stats.steps.Add(1)
			n.stats.grants.Add(n.coord.Granted - before)
		}
		n.stats.coordinator.Store(n.coord != nil)
	})
}

type storedRegions struct {
	Regions map[string]*RegionState `json:"regions"`
	Version uint64                  `json:"version"`
	Gen     uint64                  `json:"gen"`
}

// becomeCoordinator loads the coordinator's state from the store.
func (n *Node) becomeCoordinator(ctx context.Context) error {
	st := &State{Keys: map[string]*KeyState{}}
	raw, err := n.cfg.Global.Get(ctx, n.keys.regions).Bytes()
	switch {
	case errors.Is(err, goredis.Nil):
	case err != nil:
		return err
	default:
		var sr storedRegions
		if err := json.Unmarshal(raw, &sr); err != nil {
			return fmt.Errorf("the regions' state: %w", err)
		}
		st.Regions, st.Version, st.Gen = sr.Regions, sr.Version, sr.Gen
	}
	ks, err := n.cfg.Global.HGetAll(ctx, n.keys.keyStates).Result()
	if err != nil {
		return err
	}
	for k, v := range ks {
		var s KeyState
		if json.Unmarshal([]byte(v), &s) == nil && s.Regions != nil {
			st.Keys[k] = &s
		}
	}
	n.coord = NewCoordinator(CoordinatorConfig{Lease: n.cfg.Lease, Margin: n.cfg.Margin, Regions: n.cfg.Regions}, st)
	n.log.Info("global shares: this replica is the coordinator", "keys", len(st.Keys))
	return nil
}

// step takes the inbox's reports, steps, and commits the state and the replies in one script,
// fenced by the role. The store's time is read after the reports, so every report was sent
// before the instant its lease is counted from.
func (n *Node) step(ctx context.Context) error {
	pipe := n.cfg.Global.Pipeline()
	lr := pipe.LRange(ctx, n.keys.inbox, 0, 999)
	tm := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	now := tm.Val().UnixNano()
	raw := lr.Val()
	for _, r := range raw {
		var rep Report
		if json.Unmarshal([]byte(r), &rep) == nil && rep.Region != "" {
			n.coord.Receive(now, rep)
		}
	}
	replies := n.coord.Step(now)
	dirty := n.coord.TakeDirty()
	st := n.coord.State()
	regions, err := json.Marshal(storedRegions{Regions: st.Regions, Version: st.Version, Gen: st.Gen})
	if err != nil {
		return err
	}
	keys := []string{n.keys.coord, n.keys.regions, n.keys.keyStates, n.keys.inbox}
	args := []any{n.token, len(raw), regions, (10 * n.cfg.Lease).Milliseconds(), len(dirty)}
	for k, ks := range dirty {
		v := ""
		if ks != nil {
			b, err := json.Marshal(ks)
			if err != nil {
				return err
			}
			v = string(b)
		}
		args = append(args, k, v)
	}
	for _, rep := range replies {
		b, err := json.Marshal(rep)
		if err != nil {
			return err
		}
		keys = append(keys, n.keys.reply(rep.Region))
		args = append(args, b)
	}
	ok, err := commitScript.Run(ctx, n.cfg.Global, keys, args...).Int()
	if err != nil {
		return err
	}
	if ok == 0 {
		return errors.New("the role was lost before the commit")
	}
	return nil
}

// ExplainShare says what this replica applies of key, a global limit l: the region's share, of
// which version, and whether the table has ended (the safe share applies) or is stale.
func (n *Node) ExplainShare(key string, l limit.Limit) any {
	type share struct {
		Rate  int64 `json:"rate"`
		Burst int64 `json:"burst"`
	}
	out := struct {
		Region     string `json:"region"`
		Limit      share  `json:"limit"`
		Share      share  `json:"share"`
		Version    uint64 `json:"version,omitempty"`
		TableEnded bool   `json:"table_ended,omitempty"` // the region's lease ended: its safe share applies
		Stale      bool   `json:"stale,omitempty"`       // no table fetched within --global-table-lease
		Policy     string `json:"safe_share"`
	}{Region: n.cfg.Region, Limit: share{l.Rate, l.Burst}, Policy: n.cfg.Policy.Safe.String()}
	v, now := n.view.Load(), n.mono()
	if v.Stale(now) {
		out.Stale = true
		return out
	}
	s := v.Share(key, Share{l.Rate, l.Burst}, now)
	out.Share, out.Version, out.TableEnded = share(s), v.Version(key), now >= v.until
	return out
}
