package policy

import "testing"

// BenchmarkCheck is one allowed request of two descriptors by a listed identity, the work the
// policy adds to each ShouldRateLimit.
func BenchmarkCheck(b *testing.B) {
	p, err := Parse("policy.yaml", []byte(sample))
	if err != nil {
		b.Fatal(err)
	}
	ids := []string{"spiffe://cluster.local/ns/mesh/sa/envoy", "envoy.mesh.svc"}
	r := req("team-a", 1, desc(), refund())
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Check(ids, r); err != nil {
			b.Fatal(err)
		}
	}
}
