// Package fair divides a capacity among demands.
package fair

import "slices"

// MaxMin divides capacity among demands, max-min fair: a demand no larger than an equal
// share of what is left is met whole, the remaining demands split the rest equally, and what
// no demand asks for is spread evenly over all. The result is in the order of demands and sums
// to capacity when there is at least one demand; indivisible units go to the lowest indexes.
// Demands and capacity must be ≥ 0.
func MaxMin(capacity int64, demands []int64) []int64 {
	out := make([]int64, len(demands))
	if len(demands) == 0 || capacity <= 0 {
		return out
	}
	order := make([]int, len(demands))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case demands[a] < demands[b]:
			return -1
		case demands[a] > demands[b]:
			return 1
		}
		return 0
	})
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
	rest := order[k:]
	if len(rest) == 0 {
		rest = order
	}
	rest = slices.Clone(rest)
	slices.Sort(rest)
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
