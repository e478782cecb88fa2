package rlqs

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestMaxMinFair(t *testing.T) {
	tests := []struct {
		name     string
		capacity int64
		demands  []int64
		want     []int64
	}{
		{"none", 100, nil, []int64{}},
		{"one under", 100, []int64{30}, []int64{100}},
		{"equal over", 90, []int64{100, 100, 100}, []int64{30, 30, 30}},
		{"small met, rest split", 100, []int64{10, 100, 100}, []int64{10, 45, 45}},
		{"all met, spare spread", 100, []int64{10, 20, 30}, []int64{24, 33, 43}},
		{"remainder to lowest index", 10, []int64{50, 50, 50}, []int64{4, 3, 3}},
		{"zero capacity", 0, []int64{5, 5}, []int64{0, 0}},
		{"skew 3 of 10", 1000, []int64{1000, 1000, 1000, 0, 0, 0, 0, 0, 0, 0}, []int64{334, 333, 333, 0, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := maxMinFair(tt.capacity, tt.demands); !slices.Equal(got, tt.want) {
				t.Errorf("maxMinFair(%d, %v) = %v, want %v", tt.capacity, tt.demands, got, tt.want)
			}
		})
	}
}

// TestMaxMinFairProperties checks on random inputs: the sum is the capacity, no demand met
// beyond an unsatisfied one's share, and nobody below min(demand, fair share).
func TestMaxMinFairProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		n := 1 + r.IntN(12)
		capacity := r.Int64N(5000)
		d := make([]int64, n)
		for j := range d {
			d[j] = r.Int64N(2000)
		}
		got := maxMinFair(capacity, d)
		var sum int64
		for _, g := range got {
			sum += g
		}
		if sum != capacity {
			t.Fatalf("case %d: maxMinFair(%d, %v) = %v sums to %d", i, capacity, d, got, sum)
		}
		for j := range d {
			if got[j] < min(d[j], capacity/int64(n)) {
				t.Fatalf("case %d: proxy %d got %d < min(demand %d, equal share %d)", i, j, got[j], d[j], capacity/int64(n))
			}
		}
	}
}

// TestAssignNeverOversubscribes drives one bucket with random demands, proxies that come and
// go and random orders of decisions at fixed instants, checking at every step that the shares
// held sum to no more than the limit.
func TestAssignNeverOversubscribes(t *testing.T) {
	lim := Limit{Rate: 1000, PeriodMs: 1000, Burst: 1000}
	const ttl = 1000
	r := rand.New(rand.NewPCG(3, 4))
	b := bucketState{}
	ids := []string{"a", "b", "c", "d", "e", "f"}
	for step := range 5000 {
		now := int64(step * 50)
		id := ids[r.IntN(len(ids))]
		b.prune(now)
		force := r.IntN(3) == 0
		if force {
			p := b[id]
			if p == nil {
				p = &proxyState{}
				b[id] = p
			}
			p.Demand, p.SeenUntil = float64(r.IntN(800)), now+ttl
		}
		b.assign(id, lim, now, ttl, force)
		var rate, burst int64
		for _, p := range b {
			if p.HoldUntil >= now {
				rate += p.Held.Rate
				burst += p.Held.Burst
			}
		}
		if rate > lim.Rate || burst > lim.Burst {
			t.Fatalf("step %d: held rate %d, burst %d > limit %+v", step, rate, burst, lim)
		}
	}
}

// TestAssignSteps follows a new proxy joining two that hold everything, at fixed instants.
func TestAssignSteps(t *testing.T) {
	lim := Limit{Rate: 900, PeriodMs: 1000, Burst: 90}
	const ttl = 1000
	b := bucketState{}
	report := func(id string, demand float64, now int64) Share {
		p := b[id]
		if p == nil {
			p = &proxyState{}
			b[id] = p
		}
		p.Demand, p.SeenUntil = demand, now+ttl
		s, _ := b.assign(id, lim, now, ttl, true)
		return s
	}
	steps := []struct {
		name   string
		id     string
		demand float64
		now    int64
		want   Share
	}{
		{"a alone gets everything", "a", 2000, 0, Share{900, 90}},
		{"b joins: a holds it all", "b", 2000, 10, Share{0, 0}},
		{"a reports: drops to half", "a", 2000, 100, Share{450, 45}},
		{"b reports: gets the half a released", "b", 2000, 110, Share{450, 45}},
		{"c joins", "c", 2000, 200, Share{0, 0}},
		{"a drops to a third", "a", 2000, 300, Share{300, 30}},
		{"b drops to a third", "b", 2000, 310, Share{300, 30}},
		{"c gets its third", "c", 2000, 320, Share{300, 30}},
		{"a idles: keeps its demand plus margin", "a", 10, 400, Share{11, 1}},
		{"b grows into what a left", "b", 2000, 410, Share{445, 44}},
	}
	for _, st := range steps {
		if got := report(st.id, st.demand, st.now); got != st.want {
			t.Fatalf("%s: got %+v, want %+v", st.name, got, st.want)
		}
	}
}
