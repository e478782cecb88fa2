package regions

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestTargets: the shares sum within what is available; a region alone gets all of it; demands
// below an equal split are met; every share with a rate has a burst while the burst lasts.
func TestTargets(t *testing.T) {
	if got := targets(Share{100, 20}, []int64{500}); got[0] != (Share{100, 20}) {
		t.Errorf("alone: %v, want the whole 100/20", got)
	}
	got := targets(Share{20, 10}, []int64{2, 6, 40})
	if got[0].Rate != 2 || got[1].Rate != 6 || got[2].Rate != 12 {
		t.Errorf("10%%, 30%%, 200%%: %v, want rates 2, 6, 12", got)
	}
	if got[0].Burst < 2 {
		t.Errorf("10%%: burst %d, want room for jitter (at least 2)", got[0].Burst)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		avail := Share{rng.Int64N(1000), rng.Int64N(100)}
		d := make([]int64, 1+rng.IntN(6))
		for i := range d {
			d[i] = rng.Int64N(500)
		}
		var sum Share
		for i, s := range targets(avail, d) {
			sum = sum.add(s)
			if s.Rate < 0 || s.Burst < 0 || (s.Rate > 0) != (s.Burst > 0) {
				t.Fatalf("%v %v: share %d is %v", avail, d, i, s)
			}
		}
		if !sum.within(avail) {
			t.Fatalf("%v %v: the shares sum to %v", avail, d, sum)
		}
	}
}

// TestAgentMaxKeys: a key asked for beyond MaxKeys is neither reported nor held, and counted.
func TestAgentMaxKeys(t *testing.T) {
	a := NewAgent(AgentConfig{Region: "eu", TableLease: time.Second, MaxKeys: 2}, nil, 1<<32)
	for _, k := range []string{"a", "b", "c"} {
		a.Observe(k, Share{10, 5}, 7)
	}
	r := a.Report(0)
	if len(r.Keys) != 2 || a.Has("c") || a.Refused != 1 {
		t.Errorf("reported %v, holds c %v, refused %d; want a and b, not c, 1 refused", r.Keys, a.Has("c"), a.Refused)
	}
}
