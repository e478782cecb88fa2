package rlqs

import (
	"math"
	"math/bits"
	"slices"
	"strings"
)

// maxMinFair divides capacity among demands, max-min fair: a demand no larger than an equal
// share of what is left is met whole, the remaining demands split the rest equally, and what
// no demand asks for is spread evenly over all. The result is in the order of demands, sums to
// at most capacity (exactly capacity when there is at least one demand), and is deterministic:
// indivisible units go to the lowest indexes first. Demands and capacity must be ≥ 0.
func maxMinFair(capacity int64, demands []int64) []int64 {
	out := make([]int64, len(demands))
	if len(demands) == 0 || capacity <= 0 {
		return out
	}
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpInt64(demands[a], demands[b]) })
	left := capacity
	k := 0
	for ; k < len(order); k++ {
		n := int64(len(order) - k)
		if demands[order[k]] > left/n {
			break
		}
		out[order[k]] = demands[order[k]]
		left -= demands[order[k]]
	}
	// order[k:] are unsatisfied and split left equally; when every demand was met, left is
	// spread over everyone.
	rest := order[k:]
	if len(rest) == 0 {
		rest = order
	}
	rest = slices.Clone(rest)
	slices.Sort(rest) // the remainder goes to the lowest indexes
	n := int64(len(rest))
	each, extra := left/n, left%n
	for j, i := range rest {
		out[i] += each
		if int64(j) < extra {
			out[i]++
		}
	}
	return out
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Limit is what one bucket may admit in total, as its rule says: Rate requests per PeriodMs
// milliseconds, with bursts up to Burst.
type Limit struct {
	Rate     int64
	PeriodMs int64
	Burst    int64
}

// Share is one proxy's part of a Limit. A zero Rate denies everything.
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

// bucketState is every proxy of one bucket, by proxy id. It is not safe for concurrent use.
type bucketState map[string]*proxyState

// demandMargin is the headroom a proxy gets over its measured demand, so that one whose demand
// grows a little is not denied before its next report.
const demandMargin = 1.10

// prune forgets the proxies that neither count nor hold anything at now, returning their ids.
func (b bucketState) prune(now int64) []string {
	var gone []string
	for id, p := range b {
		if p.SeenUntil < now && p.HoldUntil < now {
			gone = append(gone, id)
		}
	}
	for _, id := range gone {
		delete(b, id)
	}
	return gone
}

// targets returns the max-min fair rate of every proxy whose demand counts at now.
func (b bucketState) targets(lim Limit, now int64) map[string]int64 {
	ids := make([]string, 0, len(b))
	for id, p := range b {
		if p.SeenUntil >= now {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, strings.Compare)
	demands := make([]int64, len(ids))
	for i, id := range ids {
		d := b[id].Demand * demandMargin * float64(lim.PeriodMs) / 1000
		switch {
		case d >= float64(lim.Rate) || math.IsNaN(d):
			demands[i] = lim.Rate
		case d > 0:
			demands[i] = int64(math.Ceil(d))
		}
	}
	shares := maxMinFair(lim.Rate, demands)
	out := make(map[string]int64, len(ids))
	for i, id := range ids {
		out[id] = shares[i]
	}
	return out
}

// heldByOthers is the rate that proxies other than id may be enforcing at now.
func (b bucketState) heldByOthers(id string, now int64) int64 {
	var sum int64
	for pid, p := range b {
		if pid != id && p.HoldUntil >= now {
			sum += p.Held.Rate
		}
	}
	return sum
}

// assign decides the share of proxy id at now: its max-min fair target, capped by what the
// other proxies do not hold. A change smaller than hysteresis keeps the share held, so that
// jitter in demand does not reset the proxy's token bucket; force says the proxy reported and
// gets an answer whatever it is. A share grows only to (nearly) its target, in one step. It
// returns the share and whether to send it; when it is to be
// sent, it is recorded as held until now + ttlMs.
func (b bucketState) assign(id string, lim Limit, now, ttlMs int64, force bool) (Share, bool) {
	p := b[id]
	if p == nil {
		p = &proxyState{}
		b[id] = p
	}
	targets := b.targets(lim, now)
	target := targets[id]
	room := max(lim.Rate-b.heldByOthers(id, now), 0)
	rate := min(target, room)
	holding := p.HoldUntil >= now
	hyst := max(lim.Rate/64, 1)
	switch {
	case !holding:
	case rate < p.Held.Rate && b.blocked(id, targets, hyst, now):
		// Another proxy waits for room: give back all that is above the target.
	case p.Held.Rate <= room && absInt64(rate-p.Held.Rate) < hyst && (rate == 0) == (p.Held.Rate == 0):
		rate = p.Held.Rate
	case rate > p.Held.Rate && p.Held.Rate > 0 && (rate < target-max(hyst, target/8) || rate-p.Held.Rate < p.Held.Rate/4):
		// Envoy starts a new token bucket full, so every change hands out the proxy's burst
		// again: a share grows once the others have released most of what it is to get, and
		// not by less than a quarter.
		rate = p.Held.Rate
	}
	s := Share{Rate: rate, Burst: burstFor(lim, rate)}
	if !force && holding && s == p.Held {
		return s, false
	}
	p.Held, p.HoldUntil = s, now+ttlMs
	return s, true
}

// blocked reports whether a proxy other than id holds well below its target (by the margin
// that keeps it from growing), so that shares held a little above their targets must shrink.
func (b bucketState) blocked(id string, targets map[string]int64, hyst, now int64) bool {
	for pid, t := range targets {
		if pid == id {
			continue
		}
		held := int64(0)
		if p := b[pid]; p.HoldUntil >= now {
			held = p.Held.Rate
		}
		if t-held >= max(hyst, t/8) {
			return true
		}
	}
	return false
}

// burstFor is the part of the limit's burst that goes with rate: in proportion, rounded down, so
// that the bursts held never sum to more than the limit's.
func burstFor(lim Limit, rate int64) int64 {
	if lim.Rate <= 0 || rate <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(lim.Burst), uint64(rate))
	q, _ := bits.Div64(hi, lo, uint64(lim.Rate)) // rate ≤ lim.Rate: hi < lim.Rate, no overflow
	return int64(q)
}

func absInt64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
