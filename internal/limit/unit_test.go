package limit

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestUnitsNumberedAsEnvoy pins Unit to the numbers of Envoy's RateLimitUnit, which the service
// and the client convert to and from Unit by number.
func TestUnitsNumberedAsEnvoy(t *testing.T) {
	for name, n := range rlsv3.RateLimitResponse_RateLimit_Unit_value {
		u := Unit(n)
		if name == "UNKNOWN" {
			if u != UnitUnknown || u.Seconds() != 0 {
				t.Errorf("UNKNOWN: got %v, %d s", u, u.Seconds())
			}
			continue
		}
		if got, ok := ParseUnit(name); !ok || got != u {
			t.Errorf("Envoy's %s is %d; ParseUnit(%q) = %v, %v", name, n, name, got, ok)
		}
	}
	if n := len(rlsv3.RateLimitResponse_RateLimit_Unit_value); n != len(units) {
		t.Errorf("Envoy has %d units, the table %d", n, len(units))
	}
}

func TestUnitLengths(t *testing.T) {
	for _, tc := range []struct {
		u    Unit
		secs int64
	}{{Second, 1}, {Minute, 60}, {Hour, 3600}, {Day, 86400}, {Week, 604800}, {Month, 2592000}, {Year, 31536000}, {UnitUnknown, 0}, {Unit(99), 0}} {
		if got := tc.u.Seconds(); got != tc.secs {
			t.Errorf("%v: %d s, want %d", tc.u, got, tc.secs)
		}
	}
	if _, ok := ParseUnit("unknown"); ok {
		t.Error(`ParseUnit("unknown") is a unit`)
	}
	if u, ok := ParseUnit("MiNuTe"); !ok || u != Minute {
		t.Errorf(`ParseUnit("MiNuTe") = %v, %v`, u, ok)
	}
}
