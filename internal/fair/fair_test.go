package fair

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
			if got := MaxMin(tt.capacity, tt.demands); !slices.Equal(got, tt.want) {
				t.Errorf("MaxMin(%d, %v) = %v, want %v", tt.capacity, tt.demands, got, tt.want)
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
		got := MaxMin(capacity, d)
		var sum int64
		for _, g := range got {
			sum += g
		}
		if sum != capacity {
			t.Fatalf("case %d: MaxMin(%d, %v) = %v sums to %d", i, capacity, d, got, sum)
		}
		for j := range d {
			if got[j] < min(d[j], capacity/int64(n)) {
				t.Fatalf("case %d: demand %d got %d < min(demand %d, equal share %d)", i, j, got[j], d[j], capacity/int64(n))
			}
		}
	}
}
