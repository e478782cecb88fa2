package integration

import (
	"math"
	"testing"
	"time"
)

const rlqsSkewRules = `domain: rlqs_skew
descriptors:
  - key: api_key
    value: skew
    rate_limit: {unit: second, requests_per_unit: 100, burst: 20}
`

// skewUtilisation is Σ min(assigned, demand) ÷ min(limit, Σ demand), averaged over the samples
// of the run's second half, and the most assigned in all at any sample.
func skewUtilisation(r emuResult, demand []float64, limit float64, total time.Duration) (util, most float64) {
	var sumD float64
	for _, d := range demand {
		sumD += d
	}
	n := 0
	for _, sh := range r.shares {
		var used, all float64
		for i, rate := range sh.rates {
			used += math.Min(rate, demand[i])
			all += rate
		}
		most = math.Max(most, all)
		if sh.at < total/2 {
			continue
		}
		util += used / math.Min(limit, sumD)
		n++
	}
	return util / float64(n), most
}

// TestRLQSSkewedUtilisation: ten proxies share a bucket of 100/s with skewed demands; the
// shares they are assigned are used (Σ min(assigned, demand) over min(limit, Σ demand), in the
// second half of a 10 s run) at least 95%, and never admit more than the limit (and its burst)
// in any 5 s.
func TestRLQSSkewedUtilisation(t *testing.T) {
	rules := writeRules(t, map[string]string{"skew.yaml": rlqsSkewRules})
	const total, limit = 10 * time.Second, 100.0
	for _, tc := range []struct {
		name   string
		demand []float64
	}{
		{"nine at 5/s, one at 200/s", []float64{5, 5, 5, 5, 5, 5, 5, 5, 5, 200}},
		{"1 to 160/s", []float64{1, 2, 3, 4, 5, 10, 20, 40, 80, 160}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startRLS(t, nil, rlqsArgs("--config", rules)...)
			run := rlqsRun{domain: "rlqs_skew", bucket: map[string]string{"api_key": "skew"}, interval: rlqsInterval,
				phases: []phase{{0, tc.demand}}, total: total}
			r := run.run(t, []string{p.GRPCAddr}, len(tc.demand))
			util, most := skewUtilisation(r, tc.demand, limit, total)
			// The assignments as the proxies received them can briefly sum above the limit
			// while shares move (one proxy's raise arriving before another's cut, more so on a
			// busy machine); what the limit bounds is what they admit.
			max5 := r.maxWindow(5 * time.Second)
			t.Logf("%s: utilisation %.3f, most assigned at once as received %.0f/s, most admitted in 5 s %.0f", tc.name, util, most, max5)
			if util < 0.95 {
				t.Errorf("utilisation %.3f, want ≥ 0.95", util)
			}
			if bound := 5*limit + 20; max5 > bound {
				t.Errorf("%.0f admitted in a 5 s window, more than the limit and one burst (%.0f)", max5, bound)
			}
		})
	}
}
