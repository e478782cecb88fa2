package rlqs

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAssignNeverOversubscribes drives one bucket with random demands, proxies that come and
// go and random orders of decisions at fixed instants, checking at every step that the shares
// held sum to no more than the limit less its reserve, and their max_tokens and the budget to
// no more than the burst.
func TestAssignNeverOversubscribes(t *testing.T) {
	lim := Budget{Rate: 1000, PeriodMs: 1000, Burst: 1000}
	const ttl = 1000
	r := rand.New(rand.NewPCG(3, 4))
	b := newBucketState()
	ids := []string{"a", "b", "c", "d", "e", "f"}
	for step := range 5000 {
		now := int64(step * 50)
		id := ids[r.IntN(len(ids))]
		b.advance(lim, now)
		b.prune(now)
		force := r.IntN(3) == 0
		if force {
			p := b.proxy(id)
			p.Demand, p.SeenUntil = float64(r.IntN(800)), now+ttl
		}
		b.assign(id, lim, now, ttl, force)
		rate, tokens := b.held(now)
		if rate > capacity(lim) || tokens*1000+b.budget.Milli > lim.Burst*1000 || b.budget.Milli < 0 {
			t.Fatalf("step %d: held rate %d, max_tokens %d, budget %d milli > limit %+v", step, rate, tokens, b.budget.Milli, lim)
		}
	}
}

// emuBucket is a proxy's token bucket as Envoy's rate_limit_quota filter keeps it: a new one,
// full, whenever the token bucket sent differs from the one in force or that one expired; the
// same one when it is sent again in time. Tokens are in thousandths.
type emuBucket struct {
	share   Share
	until   int64
	milli   int64
	updated int64
}

// TestAssignWindowBound is the guarantee that the budget exists for: proxies that take every
// token the moment it is there, or idle and then spend everything at once, under random demands,
// arrivals, departures and decision orders, never admit more than rate·T + burst over any window
// of T, whatever T.
func TestAssignWindowBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		lim  Budget
		seed uint64
	}{
		{"the scenario's limit", Budget{Rate: 1000, PeriodMs: 1000, Burst: 200}, 1},
		{"burst larger than rate", Budget{Rate: 100, PeriodMs: 1000, Burst: 500}, 2},
		{"per minute", Budget{Rate: 600, PeriodMs: 60000, Burst: 600}, 3},
		{"tiny burst", Budget{Rate: 1000, PeriodMs: 1000, Burst: 7}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := tc.lim
			const ttl, step = 1000, 10
			r := rand.New(rand.NewPCG(tc.seed, 9))
			b := newBucketState()
			ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
			buckets := map[string]*emuBucket{}
			idle := map[string]bool{}
			var admitted []int64 // per step
			for i := range 6000 {
				now := int64(i * step)
				if i%100 == 0 { // demands shift now and then
					for _, id := range ids {
						idle[id] = r.IntN(3) == 0
					}
				}
				for range 1 + r.IntN(3) {
					id := ids[r.IntN(len(ids))]
					b.advance(lim, now)
					b.prune(now)
					force := r.IntN(4) == 0
					if force {
						p := b.proxy(id)
						p.Demand, p.SeenUntil = float64(r.IntN(int(lim.Rate)*2)), now+ttl
					}
					s, send := b.assign(id, lim, now, ttl, force)
					if !send {
						continue
					}
					eb := buckets[id]
					if eb == nil || eb.until < now || eb.share != s {
						eb = &emuBucket{share: s, milli: s.Burst * 1000, updated: now}
						buckets[id] = eb
					}
					eb.until = now + ttl
				}
				var n int64
				for id, eb := range buckets {
					if eb.until < now || eb.share.Rate == 0 {
						continue
					}
					eb.milli = min(eb.share.Burst*1000, eb.milli+eb.share.Rate*(now-eb.updated)*1000/lim.PeriodMs)
					eb.updated = now
					if !idle[id] {
						n += eb.milli / 1000
						eb.milli %= 1000
					}
				}
				admitted = append(admitted, n)
			}
			for _, w := range []int{1, 10, 50, 100, 300, 1000, 3000} { // steps
				var sum int64
				for i, a := range admitted {
					sum += a
					if i >= w {
						sum -= admitted[i-w]
					}
					// A window of w steps spans (w-1)·step ms of refill between its first and last instant.
					bound := lim.Rate*int64(w-1)*step/lim.PeriodMs + lim.Burst
					if sum > bound {
						t.Fatalf("window of %d ms ending at step %d: admitted %d > rate·T + burst = %d", w*step, i, sum, bound)
					}
				}
			}
		})
	}
}

// TestAssignSteps follows a new proxy joining two that hold everything, at fixed instants, and
// which proxies each shrink names as waiting for the room it releases.
func TestAssignSteps(t *testing.T) {
	lim := Budget{Rate: 960, PeriodMs: 1000, Burst: 192} // reserve 30, capacity 930
	const ttl = 1000
	b := newBucketState()
	report := func(id string, demand float64, now int64) Decision {
		b.advance(lim, now)
		b.prune(now)
		p := b.proxy(id)
		p.Demand, p.SeenUntil = demand, now+ttl
		return b.decide(id, lim, now, ttl, true)
	}
	steps := []struct {
		name    string
		id      string
		demand  float64
		now     int64
		want    Share
		budget  int64 // milli, after the step
		waiting []string
	}{
		{"a alone gets everything less the reserve, with its part of an eighth of the burst", "a", 2000, 0, Share{930, 23}, 192000 - 23000, nil},
		{"b joins: a holds it all", "b", 2000, 10, Share{0, 0}, 169000, nil},
		{"a reports: drops to half, a new bucket paid from the budget", "a", 2000, 100, Share{465, 11}, 169000 - 11000, []string{"b"}},
		{"b reports: gets the half a released", "b", 2000, 110, Share{465, 11}, 158000 + 4950 - 11000, nil},
		{"c joins", "c", 2000, 200, Share{0, 0}, 151950 + 2700, nil},
		{"a drops to a third: c waits, b (above its third) does not", "a", 2000, 300, Share{310, 7}, 154650 + 3000 - 7000, []string{"c"}},
		{"b drops to a third", "b", 2000, 310, Share{310, 7}, 150650 + 1850 - 7000, []string{"c"}},
		{"c gets its third", "c", 2000, 320, Share{310, 7}, 145500 + 3400 - 7000, nil},
	}
	for _, st := range steps {
		d := report(st.id, st.demand, st.now)
		if d.Share != st.want || b.budget.Milli != st.budget || !slices.Equal(d.Waiting, st.waiting) {
			t.Fatalf("%s: got %+v and a budget of %d, want %+v, %d and waiting %q", st.name, d, b.budget.Milli, st.want, st.budget, st.waiting)
		}
	}
}

// TestAnnouncement: what Announce publishes reads back whole, whatever the bucket key holds.
func TestAnnouncement(t *testing.T) {
	for _, waiting := range [][]string{nil, {"r1-2"}, {"r1-2", "r2-7"}} {
		for _, bucket := range []string{"4:rlqs|7:api_key=6:shared", "1:d|1:k=3:a\n\nb", ""} {
			r := &Redis{}
			msg := r.announcement("r0-1", bucket, waiting)
			from, gotBucket, gotWaiting, ok := parseAnnouncement(msg)
			if !ok || from != "r0-1" || gotBucket != bucket || !slices.Equal(gotWaiting, waiting) {
				t.Errorf("%q: read back %q %q %q %v", msg, from, gotBucket, gotWaiting, ok)
			}
		}
	}
	for _, bad := range []string{"", "r0-1", "\n\nbucket"} {
		if _, _, _, ok := parseAnnouncement(bad); ok {
			t.Errorf("%q read as an announcement", bad)
		}
	}
}
