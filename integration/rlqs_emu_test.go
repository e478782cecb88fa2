package integration

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The RLQS harness: proxies that behave as Envoy's rate_limit_quota filter does towards the
// real rls over real gRPC (a stream per proxy, a usage report per reporting interval, the
// assignments enforced locally), with the requests themselves counted arithmetically per tick:
// a proxy offered 955 requests a second admits, each 20 ms tick, what its token bucket holds of
// the 19.1 requests that arrived.

// emuLimiter is a proxy's local limiter for one bucket, as Envoy's filter applies an assignment
// (source/extensions/filters/http/rate_limit_quota/global_client_impl.cc): a token bucket is
// replaced by a new one, full (max_tokens is also the initial count), unless the one in force has
// the same max_tokens, tokens_per_fill and fill_interval nanos and has not expired; its fill rate
// is tokens_per_fill over the fill interval's whole seconds, refilled continuously and taken one
// token per request; the assignment expires after the whole seconds of its time to live, counted
// from its arrival; ALLOW_ALL and DENY_ALL keep no bucket. An expired assignment and no
// assignment deny, as deploy/envoy/envoy-rlqs.yaml configures.
type emuLimiter struct {
	strat   *typev3.RateLimitStrategy // nil: no assignment
	expires time.Time                 // zero: never (static limits)
	tokens  float64
	max     float64
	fill    float64 // tokens per second
	updated time.Time
	resets  int // token buckets started
}

func (l *emuLimiter) apply(s *typev3.RateLimitStrategy, ttl *durationpb.Duration, now time.Time) {
	active := l.strat != nil && (l.expires.IsZero() || now.Before(l.expires))
	old, tb := l.strat.GetTokenBucket(), s.GetTokenBucket()
	l.strat, l.expires = s, now.Add(time.Duration(ttl.GetSeconds())*time.Second)
	switch {
	case tb == nil:
		l.max, l.fill, l.tokens = 0, 0, 0
	case active && old != nil && old.GetMaxTokens() == tb.GetMaxTokens() &&
		old.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
		old.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos():
		// The same token bucket: Envoy carries it over, tokens and all.
	default:
		l.resets++
		l.max = float64(tb.GetMaxTokens())
		l.fill = float64(tb.GetTokensPerFill().GetValue()) / float64(int64(tb.GetFillInterval().AsDuration()/time.Second))
		l.tokens, l.updated = l.max, now
	}
}

// take reports whether a request arriving at now is admitted.
func (l *emuLimiter) take(now time.Time) bool {
	if l.strat == nil || (!l.expires.IsZero() && !now.Before(l.expires)) {
		return false // no assignment, or expired: DENY_ALL
	}
	if l.strat.GetTokenBucket() == nil {
		return l.strat.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
	}
	if now.After(l.updated) {
		l.tokens = math.Min(l.max, l.tokens+l.fill*now.Sub(l.updated).Seconds())
		l.updated = now
	}
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// rate is the limiter's fill rate per second (0 unless a token bucket is in force).
func (l *emuLimiter) rate(now time.Time) float64 {
	if l.strat.GetTokenBucket() == nil || (!l.expires.IsZero() && !now.Before(l.expires)) {
		return 0
	}
	return l.fill
}

// emuProxy is one emulated proxy with one bucket. Its requests arrive evenly spaced at the rate
// its phase offers, each judged by the limiter at its own instant: every event (an assignment,
// a report, a tick) first brings the traffic up to its time.
type emuProxy struct {
	mu      sync.Mutex
	index   int
	phases  []phase
	start   time.Time
	begin   time.Duration // no requests before start + begin
	last    time.Time     // traffic offered up to here
	carry   float64
	lim     emuLimiter
	allowed uint64 // since the last report
	denied  uint64
	slots   []float64 // admitted per emuSlot since start, by arrival
	lastRep time.Time
	wants   chan struct{} // the first request of the bucket asks for an immediate report
	started bool
	applied []assignment // every assignment as it arrived
}

// assignment is an assignment as a proxy applied it: at, since the start, its fill rate per second
// until expires (since the start).
type assignment struct {
	proxy       int
	at, expires time.Duration
	rate        float64
}

// advanceLocked offers the requests arriving in (p.last, now]. p.mu must be held.
func (p *emuProxy) advanceLocked(now time.Time) {
	const step = time.Millisecond
	for t := p.last; t.Before(now); {
		next := min(now.Sub(t), step)
		t = t.Add(next)
		if t.Sub(p.start) > p.begin {
			p.carry += demandAt(p.phases, t.Sub(p.start))[p.index] * next.Seconds()
		}
		for ; p.carry >= 1; p.carry-- {
			if !p.started && p.wants != nil {
				p.started = true
				select {
				case p.wants <- struct{}{}:
				default:
				}
			}
			if p.lim.take(t) {
				p.allowed++
				slot := int(t.Sub(p.start) / emuSlot)
				for len(p.slots) <= slot {
					p.slots = append(p.slots, 0)
				}
				p.slots[slot]++
			} else {
				p.denied++
			}
		}
	}
	if now.After(p.last) {
		p.last = now
	}
}

// phase is one part of a scenario: from At on, proxy i is offered Demand[i] requests a second.
type phase struct {
	At     time.Duration
	Demand []float64
}

// emuResult is what a run measured: admitted requests per slot of emuSlot, every proxy's
// assigned rate at every tick, and every assignment as it arrived, in order.
type emuResult struct {
	slots   []float64
	shares  []shareSample
	applied []assignment
}

// firstHolding returns the first instant at or after from when the proxies of idx hold rates
// summing to at least want, from the assignments as they arrived; -1 if never.
func (r emuResult) firstHolding(from time.Duration, idx []int, want float64) time.Duration {
	cur := map[int]assignment{}
	for _, a := range r.applied {
		cur[a.proxy] = a
		if a.at < from {
			continue
		}
		sum := 0.0
		for _, i := range idx {
			if c, ok := cur[i]; ok && c.expires > a.at {
				sum += c.rate
			}
		}
		if sum >= want {
			return a.at
		}
	}
	return -1
}

type shareSample struct {
	at    time.Duration
	rates []float64
}

const (
	emuTick = 20 * time.Millisecond
	emuSlot = 100 * time.Millisecond
)

// merge adds up the proxies' admitted requests per slot, over total.
func merge(ps []*emuProxy, total time.Duration) []float64 {
	out := make([]float64, int(total/emuSlot))
	for _, p := range ps {
		for i, v := range p.slots {
			if i < len(out) {
				out[i] += v
			}
		}
	}
	return out
}

// maxWindow is the most admitted in any window of w.
func (r emuResult) maxWindow(w time.Duration) float64 {
	n := int(w / emuSlot)
	best := 0.0
	for i := 0; i+n <= len(r.slots); i++ {
		s := 0.0
		for _, v := range r.slots[i : i+n] {
			s += v
		}
		best = math.Max(best, s)
	}
	return best
}

// admitted is the total admitted over [from, to).
func (r emuResult) admitted(from, to time.Duration) float64 {
	s := 0.0
	for _, v := range r.slots[int(from/emuSlot):min(int(to/emuSlot), len(r.slots))] {
		s += v
	}
	return s
}

// demandAt returns the demands in force at t.
func demandAt(phases []phase, t time.Duration) []float64 {
	var d []float64
	for _, ph := range phases {
		if t >= ph.At {
			d = ph.Demand
		}
	}
	return d
}

// runStatic runs the scenario in virtual time with fixed local token buckets (rate and burst
// per proxy, per second) and no rls.
func runStatic(proxies int, rate, burst float64, phases []phase, total time.Duration) emuResult {
	ps := make([]*emuProxy, proxies)
	t0 := time.Unix(0, 0)
	strat := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: uint32(burst), FillInterval: durationpb.New(time.Second)}}}
	for i := range ps {
		ps[i] = &emuProxy{index: i, phases: phases, start: t0, last: t0}
		ps[i].lim = emuLimiter{strat: strat, tokens: burst, max: burst, fill: rate, updated: t0}
	}
	for _, p := range ps {
		p.advanceLocked(t0.Add(total))
	}
	return emuResult{slots: merge(ps, total)}
}

// rlqsRun runs the scenario in real time against rls: proxy i speaks to addrs[i*len(addrs)/n].
type rlqsRun struct {
	domain   string
	bucket   map[string]string
	interval time.Duration
	phases   []phase
	total    time.Duration
}

func (r rlqsRun) run(t *testing.T, addrs []string, proxies int) emuResult {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := make([]*emuProxy, proxies)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	errc := make(chan error, proxies)
	start := time.Now()
	for i := range ps {
		// Every proxy's traffic begins at its own instant within the first interval, which is
		// when its filter starts the stream and the reporting timer, as independent Envoys do.
		ps[i] = &emuProxy{index: i, phases: r.phases, start: start, last: start,
			begin: time.Duration(rand.Int64N(int64(r.interval))), wants: make(chan struct{}, 1)}
		conn, err := grpc.NewClient(addrs[i*len(addrs)/proxies], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.proxy(ctx, rlqspb.NewRateLimitQuotaServiceClient(conn), ps[i]); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("proxy %d: %w", i, err)
			}
		}()
	}
	var res emuResult
	tick := time.NewTicker(emuTick)
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			t.Fatal(err)
		case now := <-tick.C:
			el := now.Sub(start)
			end := el > r.total
			if end {
				now = start.Add(r.total)
			}
			rates := make([]float64, len(ps))
			for i, p := range ps {
				p.mu.Lock()
				p.advanceLocked(now)
				rates[i] = p.lim.rate(now)
				p.mu.Unlock()
			}
			if end {
				for _, p := range ps {
					p.mu.Lock()
					defer p.mu.Unlock()
					res.applied = append(res.applied, p.applied...)
				}
				slices.SortStableFunc(res.applied, func(a, b assignment) int { return cmp.Compare(a.at, b.at) })
				res.slots = merge(ps, r.total)
				return res
			}
			res.shares = append(res.shares, shareSample{at: el, rates: rates})
		}
	}
}

// proxy is one proxy's RLQS stream as Envoy's filter keeps it: opened, with a report, when its
// bucket sees its first request, then a report every interval, each assignment applied as it
// arrives. time_elapsed is in whole seconds, as Envoy sends it.
func (r rlqsRun) proxy(ctx context.Context, c rlqspb.RateLimitQuotaServiceClient, p *emuProxy) error {
	select {
	case <-ctx.Done():
		return nil
	case <-p.wants:
	}
	stream, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		return err
	}
	id := &rlqspb.BucketId{Bucket: r.bucket}
	recvErr := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			now := time.Now()
			p.mu.Lock()
			p.advanceLocked(now)
			for _, a := range resp.GetBucketAction() {
				if qa := a.GetQuotaAssignmentAction(); qa != nil && proto.Equal(a.GetBucketId(), id) {
					p.lim.apply(qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive(), now)
					p.applied = append(p.applied, assignment{proxy: p.index, at: now.Sub(p.start),
						expires: p.lim.expires.Sub(p.start), rate: p.lim.rate(now)})
				}
			}
			p.mu.Unlock()
		}
	}()
	report := func() error {
		now := time.Now()
		p.mu.Lock()
		p.advanceLocked(now)
		if p.lastRep.IsZero() {
			p.lastRep = now
		}
		u := &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: id,
			TimeElapsed:        &durationpb.Duration{Seconds: int64(now.Sub(p.lastRep) / time.Second)},
			NumRequestsAllowed: p.allowed, NumRequestsDenied: p.denied}
		p.allowed, p.denied, p.lastRep = 0, 0, now
		p.mu.Unlock()
		return stream.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: r.domain,
			BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{u}})
	}
	if err := report(); err != nil {
		return err
	}
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			stream.CloseSend()
			return nil
		case err := <-recvErr:
			return err
		case <-tick.C:
			if err := report(); err != nil {
				return err
			}
		}
	}
}
