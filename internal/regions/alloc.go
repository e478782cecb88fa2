package regions

import (
	"math/bits"
	"slices"

	"github.com/rls-project/rls/internal/fair"
)

// targets divides avail among demands: the rates max-min fair; of the burst, about half split
// equally among the shares with a rate and half in proportion to their rates (rounded down; what
// rounding leaves goes a request at a time to the highest rates, first to any left without a
// burst). A small share thus has room for its requests' jitter, and a region alone gets the
// whole burst. The sum of the results is within avail.
func targets(avail Share, demands []int64) []Share {
	rates := fair.MaxMin(avail.Rate, demands)
	out := make([]Share, len(demands))
	if avail.Rate <= 0 || avail.Burst <= 0 {
		return out
	}
	var sharing int64
	for _, r := range rates {
		if r > 0 {
			sharing++
		}
	}
	var equal int64
	if sharing > 0 {
		equal = min((avail.Burst/2+sharing-1)/sharing, avail.Burst/sharing) // half, rounded up
	}
	prop := avail.Burst - equal*sharing
	left := avail.Burst
	for i, r := range rates {
		var b int64
		if r > 0 {
			b = equal + mulDiv(prop, r, avail.Rate)
		}
		out[i] = Share{r, b}
		left -= b
	}
	// Rates that rounded to no burst get one request each, from what rounding left, the
	// highest rates first; any left after that goes the same way.
	order := make([]int, len(rates))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case rates[a] > rates[b]:
			return -1
		case rates[a] < rates[b]:
			return 1
		}
		return 0
	})
	for _, i := range order {
		if left > 0 && out[i].Rate > 0 && out[i].Burst == 0 {
			out[i].Burst++
			left--
		}
	}
	for _, i := range order {
		if left > 0 && out[i].Rate > 0 {
			out[i].Burst++
			left--
		}
	}
	for i := range out {
		out[i] = out[i].normal()
	}
	return out
}

// mulDiv is a·b/c rounded down, for 0 ≤ a, b ≤ c (so the result fits) and c > 0; a·b may
// need 128 bits (limits go up to 2^32 requests each).
func mulDiv(a, b, c int64) int64 {
	if c <= 0 || a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}
