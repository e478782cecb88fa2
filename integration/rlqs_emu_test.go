package integration

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
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

// emuLimiter is a proxy's local limiter for one bucket, as the filter applies an assignment: a
// token bucket that starts full when the strategy changes (a new assignment replaces the
// bucket), ALLOW_ALL, or DENY_ALL, which is also what an expired assignment and no assignment
// fall back to in deploy/envoy/envoy-rlqs.yaml.
type emuLimiter struct {
	strat   *typev3.RateLimitStrategy // nil: no assignment
	expires time.Time                 // zero: never (static limits)
	tokens  float64
	max     float64
	fill    float64 // tokens per second
	resets  int     // strategies applied that replaced the bucket
}

func (l *emuLimiter) apply(s *typev3.RateLimitStrategy, ttl time.Duration, now time.Time) {
	exp := now.Add(ttl)
	if l.strat != nil && proto.Equal(l.strat, s) && now.Before(l.expires) {
		l.expires = exp // the same strategy extends the active assignment
		return
	}
	l.strat, l.expires = s, exp
	l.resets++
	if tb := s.GetTokenBucket(); tb != nil {
		l.max = float64(tb.GetMaxTokens())
		l.fill = float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
		l.tokens = l.max
	} else {
		l.max, l.fill, l.tokens = 0, 0, 0
	}
}

// admit returns how many of n requests arriving over dt are admitted at now.
func (l *emuLimiter) admit(n int64, dt time.Duration, now time.Time) int64 {
	if l.strat == nil || (!l.expires.IsZero() && !now.Before(l.expires)) {
		return 0 // no assignment, or expired: DENY_ALL
	}
	switch l.strat.GetBlanketRule() {
	case typev3.RateLimitStrategy_ALLOW_ALL:
		if l.strat.GetTokenBucket() == nil {
			return n
		}
	case typev3.RateLimitStrategy_DENY_ALL:
		if l.strat.GetTokenBucket() != nil {
			break
		}
		return 0
	}
	l.tokens = math.Min(l.max, l.tokens+l.fill*dt.Seconds())
	a := min(n, int64(l.tokens))
	l.tokens -= float64(a)
	return a
}

// rate is the limiter's fill rate per second (0 unless a token bucket is in force).
func (l *emuLimiter) rate(now time.Time) float64 {
	if l.strat.GetTokenBucket() == nil || (!l.expires.IsZero() && !now.Before(l.expires)) {
		return 0
	}
	return l.fill
}

// emuProxy is one emulated proxy with one bucket.
type emuProxy struct {
	mu      sync.Mutex
	demand  float64 // requests per second offered now
	carry   float64
	lim     emuLimiter
	allowed uint64 // since the last report
	denied  uint64
	lastRep time.Time
	wants   chan struct{} // the first request of the bucket asks for an immediate report
	started bool
}

// step offers the requests of dt ending at now and returns how many were admitted.
func (p *emuProxy) step(dt time.Duration, now time.Time) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	x := p.demand*dt.Seconds() + p.carry
	n := int64(x)
	p.carry = x - float64(n)
	if n > 0 && !p.started && p.wants != nil {
		p.started = true
		select {
		case p.wants <- struct{}{}:
		default:
		}
	}
	a := p.lim.admit(n, dt, now)
	p.allowed += uint64(a)
	p.denied += uint64(n - a)
	return a
}

// phase is one part of a scenario: from At on, proxy i is offered Demand[i] requests a second.
type phase struct {
	At     time.Duration
	Demand []float64
}

// emuResult is what a run measured, admitted requests per slot of emuSlot.
type emuResult struct {
	slots  []float64
	shares [][]float64 // per slot, every proxy's assigned rate at the slot's end
}

const (
	emuTick = 20 * time.Millisecond
	emuSlot = 100 * time.Millisecond
)

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
		ps[i] = &emuProxy{}
		ps[i].lim = emuLimiter{strat: strat, tokens: burst, max: burst, fill: rate}
	}
	var res emuResult
	slot := 0.0
	for t := emuTick; t <= total; t += emuTick {
		for i, d := range demandAt(phases, t-emuTick) {
			ps[i].demand = d
		}
		for _, p := range ps {
			slot += float64(p.step(emuTick, t0.Add(t)))
		}
		if t%emuSlot == 0 {
			res.slots = append(res.slots, slot)
			slot = 0
		}
	}
	return res
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
	for i := range ps {
		ps[i] = &emuProxy{wants: make(chan struct{}, 1)}
		conn, err := grpc.NewClient(addrs[i*len(addrs)/proxies], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// Every proxy reports on its own phase of the interval, as independent Envoys do.
		offset := time.Duration(rand.Int64N(int64(r.interval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.proxy(ctx, rlqspb.NewRateLimitQuotaServiceClient(conn), ps[i], offset); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("proxy %d: %w", i, err)
			}
		}()
	}
	var res emuResult
	start := time.Now()
	tick := time.NewTicker(emuTick)
	defer tick.Stop()
	slot, last := 0.0, start
	nextSlot := emuSlot
	for {
		select {
		case err := <-errc:
			t.Fatal(err)
		case now := <-tick.C:
			el := now.Sub(start)
			if el > r.total {
				return res
			}
			dt := now.Sub(last)
			last = now
			d := demandAt(r.phases, el)
			for i, p := range ps {
				p.mu.Lock()
				p.demand = d[i]
				p.mu.Unlock()
				slot += float64(p.step(dt, now))
			}
			for el >= nextSlot {
				res.slots = append(res.slots, slot)
				slot = 0
				shares := make([]float64, len(ps))
				for i, p := range ps {
					p.mu.Lock()
					shares[i] = p.lim.rate(now)
					p.mu.Unlock()
				}
				res.shares = append(res.shares, shares)
				nextSlot += emuSlot
			}
		}
	}
}

// proxy is one proxy's RLQS stream: a report when its bucket sees its first request and every
// interval after, each assignment applied as it arrives.
func (r rlqsRun) proxy(ctx context.Context, c rlqspb.RateLimitQuotaServiceClient, p *emuProxy, offset time.Duration) error {
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
			for _, a := range resp.GetBucketAction() {
				if qa := a.GetQuotaAssignmentAction(); qa != nil && proto.Equal(a.GetBucketId(), id) {
					p.lim.apply(qa.GetRateLimitStrategy(), qa.GetAssignmentTimeToLive().AsDuration(), now)
				}
			}
			p.mu.Unlock()
		}
	}()
	first := true
	report := func() error {
		now := time.Now()
		p.mu.Lock()
		u := &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: id,
			TimeElapsed: durationpb.New(now.Sub(p.lastRep)), NumRequestsAllowed: p.allowed, NumRequestsDenied: p.denied}
		if p.lastRep.IsZero() {
			u.TimeElapsed = durationpb.New(emuTick)
		}
		p.allowed, p.denied, p.lastRep = 0, 0, now
		p.mu.Unlock()
		m := &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{u}}
		if first {
			m.Domain, first = r.domain, false
		}
		return stream.Send(m)
	}
	timer := time.NewTimer(offset)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			stream.CloseSend()
			return nil
		case err := <-recvErr:
			return err
		case <-p.wants:
			if err := report(); err != nil {
				return err
			}
		case <-timer.C:
			if err := report(); err != nil {
				return err
			}
			timer.Reset(r.interval)
		}
	}
}
