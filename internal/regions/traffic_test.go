package regions

import (
	"encoding/json"
	"flag"
	"fmt"
	"testing"
	"time"
)

var trafficKeys = flag.Int("regions.traffic", 0, "TestCoordinationTraffic: also measure this many keys")

// TestCoordinationTraffic measures what one region sends and receives per Δ against the number
// of its active global keys: in the interval where every key's demand changed (a report naming
// each, a reply granting each), and in a steady one (nothing changed: the report renews the
// lease and names no key). Keys nobody asks for are not reported at all.
// -regions.traffic adds a larger count (100000 for BENCHMARKS.md's figure).
func TestCoordinationTraffic(t *testing.T) {
	counts := []int{1000, 10000}
	if *trafficKeys > 0 {
		counts = append(counts, *trafficKeys)
	}
	for _, n := range counts {
		c := NewCoordinator(CoordinatorConfig{Lease: 10 * time.Second, Margin: 200 * time.Millisecond, Regions: 1}, nil)
		a := NewAgent(AgentConfig{Region: "eu", TableLease: time.Second, Margin: 200 * time.Millisecond}, nil, 1<<32)
		now := int64(time.Hour)
		step := func(demand int64) (report, reply int) {
			for i := range n {
				a.Observe(fmt.Sprintf("4:shop4:user9:user-%05d#0", i), Share{100, 20}, demand)
			}
			r := a.Report(now)
			b, _ := json.Marshal(r)
			c.Receive(now, r)
			var out int
			for _, rep := range c.Step(now) {
				rb, _ := json.Marshal(rep)
				out += len(rb)
				a.Published(now, a.Table())
				a.Receive(now, rep)
				a.Published(now, a.Table())
			}
			now += int64(500 * time.Millisecond)
			return len(b), out
		}
		step(50)                      // the region's claim (nothing held) and the first grants
		step(50)                      // acks
		now += int64(2 * time.Second) // the acks' wait
		changed, changedReply := step(80)
		step(80)
		now += int64(2 * time.Second)
		step(80)
		steady, steadyReply := step(80)
		t.Logf("%d active keys: every demand changed: report %d B, reply %d B (%.0f B a key); steady: report %d B, reply %d B",
			n, changed, changedReply, float64(changed+changedReply)/float64(n), steady, steadyReply)
		if steady > 200 || steadyReply > 200 {
			t.Errorf("%d keys, nothing changed: report %d B and reply %d B, want a few bytes (no key named)", n, steady, steadyReply)
		}
		if changed < 40*n {
			t.Errorf("%d keys, every demand changed: report %d B, want every key named", n, changed)
		}
	}
}
