package descriptors

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

func TestNewLimitNeverWraps(t *testing.T) {
	tests := []struct {
		name   string
		unit   limit.Unit
		mult   uint32
		period time.Duration // 0: Validate must fail with a period longer than MaxTolerance
	}{
		{"default multiplier", limit.Hour, 0, time.Hour},
		{"two hours", limit.Hour, 2, 2 * time.Hour},
		{"a hundred years", limit.Year, 100, 100 * 365 * 24 * time.Hour},
		{"one second past a hundred years", limit.Second, uint32(limit.MaxTolerance/time.Second) + 1, 0},
		{"hours that wrapped to about an hour", limit.Hour, 640511948, 0},
		{"largest multiplier of seconds", limit.Second, math.MaxUint32, 0},
		{"largest multiplier of years", limit.Year, math.MaxUint32, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLimit("", 1, tc.unit, tc.mult, 0)
			err := l.Spec.Validate()
			if tc.period != 0 {
				if l.Spec.Period != tc.period || err != nil {
					t.Fatalf("period %v, Validate %v; want %v, nil", l.Spec.Period, err, tc.period)
				}
				return
			}
			if l.Spec.Period <= limit.MaxTolerance || !errors.Is(err, limit.ErrInvalid) {
				t.Fatalf("period %v, Validate %v; want a period past %v and limit.ErrInvalid", l.Spec.Period, err, limit.MaxTolerance)
			}
		})
	}
}
