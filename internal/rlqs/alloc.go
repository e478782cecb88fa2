package rlqs

import (
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/rls-project/rls/internal/fair"
)

// Budget is what one bucket may admit in total, as its rule says: Rate requests per PeriodMs
// milliseconds, with bursts up to Burst.
type Budget struct {
	Rate     int64
	PeriodMs int64
	Burst    int64
	// MaxProxies bounds the proxies a bucket counts (0: no bound): a proxy that would be one
	// more is refused (Decision.Refused).
	MaxProxies int
}

// Share is one proxy's part of a Budget. A zero Rate denies everything.
type Share struct {
	Rate  int64
	Burst int64
}

// proxyState is what a bucket knows of one proxy. Times are Unix milliseconds.
type proxyState struct {
	// Demand is the proxy's last reported demand, in requests per second (allowed + denied).
	Demand float64
	// SeenUntil is when the proxy's demand stops counting: its last report plus the TTL.
	SeenUntil int64
	// Held is the share last sent to the proxy, which it may enforce until HoldUntil.
	Held      Share
	HoldUntil int64
}

// budget is what a bucket may still hand out as new token buckets, in thousandths of a request,
// as of At (Unix ms; zero: never advanced, the whole burst).
type budget struct {
	Milli int64
	At    int64
}

// bucketState is every proxy of one bucket, by proxy id, and the bucket's burst budget. It is
// not safe for concurrent use.
//
// The budget is what keeps the admitted total within the limit plus one burst over any window,
// although Envoy starts every token bucket it is sent full (max_tokens is also the initial
// count) whenever the token bucket differs from the one in force: each token bucket sent that
// starts anew spends its max_tokens from the budget, which refills at the rate that no proxy
// holds and never holds more than the burst less the max_tokens the proxies hold. Then the
// budget plus the tokens in the proxies' buckets never exceeds the burst and only grows by the
// rate not held, so what the proxies admit over any window of length T is at most
// rate·T + burst. The shares held sum to at most the rate less a reserve, so that the budget
// always refills.
type bucketState struct {
	proxies map[string]*proxyState
	budget  budget
	lim     Budget // of the last decision, for forgetting the bucket
	target  int64  // of the proxy assign last decided for
}

func newBucketState() *bucketState { return &bucketState{proxies: map[string]*proxyState{}} }

// demandMargin is the headroom a proxy gets over its measured demand, so that one whose demand
// grows a little is not denied before its next report. It only matters when the bucket is
// contended (otherwise the capacity nobody asks for is spread over all), and there it is taken
// from the proxies that want more: with 10% and demands rounded up, nine proxies wanting 5/s of
// a 100/s bucket beside one wanting 200/s were given 6/s each, and 12% of the limit went unused.
const demandMargin = 1.05

// reserve is the part of a limit's rate that is never held, so that the burst budget refills
// even when every proxy wants more: 1/32 of the rate, at least 1 when the rate is at least 2.
func reserve(rate int64) int64 {
	if rate < 2 {
		return 0
	}
	return max(rate/32, 1)
}

// capacity is the rate that the shares held may sum to.
func capacity(lim Budget) int64 { return max(lim.Rate-reserve(lim.Rate), 0) }

// prune forgets the proxies that neither count nor hold anything at now, returning their ids.
// Call advance first: the budget must see the holds that end.
func (b *bucketState) prune(now int64) []string {
	var gone []string
	for id, p := range b.proxies {
		if p.SeenUntil < now && p.HoldUntil < now {
			gone = append(gone, id)
		}
	}
	for _, id := range gone {
		delete(b.proxies, id)
	}
	return gone
}

// empty reports whether b can be forgotten at now: no proxy, and a budget that has refilled
// to the whole burst (which a bucket seen for the first time starts with). A budget still
// refilling is kept, or forgetting it would hand out its spent part again.
func (b *bucketState) empty(now int64) bool {
	if len(b.proxies) > 0 {
		return false
	}
	if b.budget.At == 0 {
		return true
	}
	b.advance(b.lim, now)
	return b.budget.Milli >= b.lim.Burst*1000
}

// forgetAfterMs is how long after its last decision a bucket with no proxy left may be forgotten
// (its state expires in Redis): the TTL of the holds, then the time the budget takes to refill
// the whole burst at the full rate.
func forgetAfterMs(lim Budget, ttlMs int64) int64 {
	return 2*ttlMs + mulDivSat(lim.Burst, lim.PeriodMs, max(lim.Rate, 1)) + 1
}

// held sums the rates and max_tokens of the shares held at instant t.
func (b *bucketState) held(t int64) (rate, tokens int64) {
	for _, p := range b.proxies {
		if p.HoldUntil >= t && p.Held.Rate > 0 {
			rate += p.Held.Rate
			tokens += p.Held.Burst
		}
	}
	return rate, tokens
}

// advance refills the budget up to now: between consecutive ends of holds, by the rate not held
// then, up to the burst less the max_tokens held then.
func (b *bucketState) advance(lim Budget, now int64) {
	if b.budget.At == 0 {
		_, tokens := b.held(now)
		b.budget = budget{Milli: max(lim.Burst-tokens, 0) * 1000, At: now}
		return
	}
	for t := b.budget.At; t < now; {
		// The next end of a hold after t: the holds alive just after t stay alive until then.
		next := now
		for _, p := range b.proxies {
			if p.HoldUntil >= t && p.HoldUntil < next {
				next = p.HoldUntil
			}
		}
		if next == t {
			next = t + 1
		}
		rate, tokens := b.held(t + 1)
		ceiling := max(lim.Burst-tokens, 0) * 1000
		if free := lim.Rate - rate; free > 0 && lim.PeriodMs > 0 && b.budget.Milli < ceiling {
			b.budget.Milli = min(ceiling, b.budget.Milli+mulDivSat(free, (next-t)*1000, lim.PeriodMs))
		}
		t = next
	}
	b.budget.At = max(b.budget.At, now)
	// The ceiling at now: holds that ended returned nothing, holds that began took their part.
	_, tokens := b.held(now)
	b.budget.Milli = min(b.budget.Milli, max(lim.Burst-tokens, 0)*1000)
}

// proxy returns id's state, adding it.
func (b *bucketState) proxy(id string) *proxyState {
	p := b.proxies[id]
	if p == nil {
		p = &proxyState{}
		b.proxies[id] = p
	}
	return p
}

// note records what seen says of proxy at now (see Seen), and reports whether it did.
func (b *bucketState) note(proxy string, seen Seen, now int64) bool {
	if !seen.Report {
		if _, known := b.proxies[proxy]; known || seen.Until <= now {
			return false
		}
	}
	p := b.proxy(proxy)
	p.Demand, p.SeenUntil = seen.Demand, seen.Until
	return true
}

// targets returns the max-min fair rate of every proxy whose demand counts at now. Proxies of
// one identity (ids "identity/stream", see group) are one proxy first: the identities divide
// the capacity by their summed demands, then each identity's part is divided among its streams
// by theirs, so that an identity holds one share however many streams it opens.
func (b *bucketState) targets(lim Budget, now int64) map[string]int64 {
	ids := make([]string, 0, len(b.proxies))
	for id, p := range b.proxies {
		if p.SeenUntil >= now {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, strings.Compare)
	c := capacity(lim)
	demands := make([]int64, len(ids))
	for i, id := range ids {
		d := b.proxies[id].Demand * demandMargin * float64(lim.PeriodMs) / 1000
		switch {
		case d >= float64(c) || math.IsNaN(d):
			demands[i] = c
		case d > 0:
			demands[i] = max(int64(math.Round(d)), 1)
		}
	}
	out := make(map[string]int64, len(ids))
	// The identities, in the order of their first stream's id, and their streams' indexes.
	var groups [][]int
	var byGroup map[string]int
	for i, id := range ids {
		g, ok := group(id)
		if !ok {
			groups = append(groups, []int{i})
			continue
		}
		if byGroup == nil {
			byGroup = map[string]int{}
		}
		if j, seen := byGroup[g]; seen {
			groups[j] = append(groups[j], i)
			continue
		}
		byGroup[g] = len(groups)
		groups = append(groups, []int{i})
	}
	if len(groups) == len(ids) {
		shares := fair.MaxMin(c, demands)
		for i, id := range ids {
			out[id] = shares[i]
		}
		return out
	}
	gd := make([]int64, len(groups))
	for j, members := range groups {
		for _, i := range members {
			gd[j] = min(gd[j]+demands[i], c)
		}
	}
	gs := fair.MaxMin(c, gd)
	for j, members := range groups {
		md := make([]int64, len(members))
		for k, i := range members {
			md[k] = demands[i]
		}
		for k, sh := range fair.MaxMin(gs[j], md) {
			out[ids[members[k]]] = sh
		}
	}
	return out
}

// group is the identity of a proxy id "identity/stream"; ok is false for an id without one
// (a stream without a client certificate is a proxy of its own).
func group(id string) (string, bool) {
	i := strings.IndexByte(id, '/')
	if i < 0 {
		return "", false
	}
	return id[:i], true
}

// full reports whether proxy is not one of b's and b already counts the most proxies lim
// allows.
func (b *bucketState) full(proxy string, lim Budget) bool {
	if lim.MaxProxies <= 0 || len(b.proxies) < lim.MaxProxies {
		return false
	}
	_, known := b.proxies[proxy]
	return !known
}

// heldByOthers is the rate that proxies other than id may be enforcing at now.
func (b *bucketState) heldByOthers(id string, now int64) int64 {
	var sum int64
	for pid, p := range b.proxies {
		if pid != id && p.HoldUntil >= now {
			sum += p.Held.Rate
		}
	}
	return sum
}

// assign decides the share of proxy id at now: its max-min fair target, capped by what the
// other proxies do not hold. force says the proxy reported and gets an answer whatever it is.
// It returns the share and whether to send it; a share sent is held until now + ttlMs.
//
// Envoy keeps its token bucket when it is sent the same one again before the assignment expires,
// and starts a new one, full, otherwise: a share that is not the one held is sent only when the
// budget can pay for its max_tokens (until then the proxy keeps what it holds), a change smaller
// than the hysteresis is not made unless another proxy waits for the room, and a share grows
// only to (nearly) its target, in one step.
func (b *bucketState) assign(id string, lim Budget, now, ttlMs int64, force bool) (Share, bool) {
	b.advance(lim, now)
	b.lim = lim
	p := b.proxy(id)
	targets := b.targets(lim, now)
	target := targets[id]
	b.target = target
	room := max(capacity(lim)-b.heldByOthers(id, now), 0)
	rate := min(target, room)
	holding := p.HoldUntil >= now
	hyst := max(lim.Rate/64, 1)
	if holding {
		switch {
		case rate < p.Held.Rate && b.blocked(id, targets, hyst, now):
			// Another proxy waits for room: give back all that is above the target.
		case p.Held.Rate <= room && absInt64(rate-p.Held.Rate) < hyst && (rate == 0) == (p.Held.Rate == 0):
			rate = p.Held.Rate
		case rate > p.Held.Rate && p.Held.Rate > 0 && rate < target-hyst:
			rate = p.Held.Rate
		}
	}
	s := shareFor(lim, rate)
	if holding && s == p.Held {
		if !force {
			return s, false
		}
		p.HoldUntil = now + ttlMs // the same token bucket again: the proxy keeps its own
		return s, true
	}
	if cost := s.Burst * 1000; cost > b.budget.Milli {
		// Not affordable yet: the proxy keeps what it holds, or, holding nothing, gets nothing.
		if holding {
			if force {
				p.HoldUntil = now + ttlMs
			}
			return p.Held, force
		}
		s = Share{}
	}
	b.budget.Milli -= s.Burst * 1000
	p.Held, p.HoldUntil = s, now+ttlMs
	return s, true
}

// Decision is what a Store decided for one proxy of a bucket.
type Decision struct {
	// Refused: the bucket counts Budget.MaxProxies proxies already; nothing was recorded.
	Refused bool
	Share   Share
	// Send: the share is to be sent to the proxy.
	Send bool
	// Waiting is set when the decision released room (the proxy holds less than before): the
	// other proxies of the bucket that hold less than their targets, by the hysteresis or more,
	// and may now grow.
	Waiting []string
	// Target is the proxy's max-min fair rate; Settled says the proxy is alone in the bucket and
	// the share it holds is within the hysteresis of it, so that nothing changes for it until a
	// report or another proxy's decision says otherwise (see Over).
	Target  int64
	Settled bool
	// Over is set when the proxy is left waiting (below its target by the hysteresis or more):
	// the other proxies holding more than their targets, which are to give it back now.
	Over []string
}

// decide is assign for Store implementations: it also names, when the proxy's share shrank,
// the proxies waiting for the room it released.
func (b *bucketState) decide(id string, lim Budget, now, ttlMs int64, force bool) Decision {
	var before int64
	if p := b.proxies[id]; p != nil && p.HoldUntil >= now {
		before = p.Held.Rate
	}
	s, send := b.assign(id, lim, now, ttlMs, force)
	hyst := max(lim.Rate/64, 1)
	// Only a proxy alone in its bucket settles: where several divide a limit, their shares
	// follow one another's demands at every tick, as they always have.
	d := Decision{Share: s, Send: send, Target: b.target, Settled: absInt64(s.Rate-b.target) < hyst && b.counting(now) <= 1}
	if send && s.Rate < before {
		d.Waiting = b.waiting(id, lim, now)
	}
	if b.target-s.Rate >= hyst {
		d.Over = b.over(id, lim, now)
	}
	return d
}

// counting is the number of proxies whose demand counts at now.
func (b *bucketState) counting(now int64) int {
	n := 0
	for _, p := range b.proxies {
		if p.SeenUntil >= now {
			n++
		}
	}
	return n
}

// over returns the proxies other than id that hold more than their targets at now, sorted.
func (b *bucketState) over(id string, lim Budget, now int64) []string {
	var out []string
	for pid, t := range b.targets(lim, now) {
		if p := b.proxies[pid]; pid != id && p.HoldUntil >= now && p.Held.Rate > t {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// waiting returns the proxies other than id that hold less than their targets at now, by the
// hysteresis or more, sorted.
func (b *bucketState) waiting(id string, lim Budget, now int64) []string {
	out := b.below(id, b.targets(lim, now), max(lim.Rate/64, 1), now, false)
	slices.Sort(out)
	return out
}

// blocked reports whether a proxy other than id holds well below its target (by the margin
// that keeps it from growing), so that shares held a little above their targets must shrink.
func (b *bucketState) blocked(id string, targets map[string]int64, hyst, now int64) bool {
	return len(b.below(id, targets, hyst, now, true)) > 0
}

// below returns the proxies other than id whose targets exceed what they hold at now by hyst or
// more, in no order; with first, only the first one found.
func (b *bucketState) below(id string, targets map[string]int64, hyst, now int64, first bool) []string {
	var out []string
	for pid, t := range targets {
		if pid == id {
			continue
		}
		held := int64(0)
		if p := b.proxies[pid]; p.HoldUntil >= now {
			held = p.Held.Rate
		}
		if t-held >= hyst {
			out = append(out, pid)
			if first {
				break
			}
		}
	}
	return out
}

// proxyBurstDivisor: the max_tokens handed out with the shares sum to at most 1/proxyBurstDivisor
// of the burst; the rest is the budget that pays for the token buckets that changes start. Every
// change of share costs its max_tokens, and a demand shift takes several changes (the old proxies
// shrink, the new ones grow, as their reports arrive): with a quarter of the burst the budget ran
// dry during a shift and the last proxies waited for it to refill at the rate no proxy holds (up to
// 0.85 s to follow the shift in TestRLQSShares); with an eighth the shift is paid at once.
const proxyBurstDivisor = 8

// shareFor is the share of rate: with max_tokens its part of an eighth of the limit's burst, rounded
// down but at least 1 (Envoy's token bucket with max_tokens 0 admits nothing).
func shareFor(lim Budget, rate int64) Share {
	if lim.Rate <= 0 || rate <= 0 {
		return Share{}
	}
	hi, lo := bits.Mul64(uint64(lim.Burst/proxyBurstDivisor), uint64(rate))
	if hi >= uint64(lim.Rate) {
		return Share{Rate: rate, Burst: max(lim.Burst/proxyBurstDivisor, 1)}
	}
	q, _ := bits.Div64(hi, lo, uint64(lim.Rate))
	return Share{Rate: rate, Burst: max(int64(q), 1)}
}

// mulDivSat is a·b/c rounded down, or MaxInt64 when that overflows. a, b ≥ 0, c > 0.
func mulDivSat(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(min(q, math.MaxInt64))
}

func absInt64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
