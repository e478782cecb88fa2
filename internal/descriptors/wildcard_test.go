package descriptors

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// The index must pick what scanning every wildcard in file order picks.
func TestWildcardIndexAgreesWithScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func(alphabet string, n int) string {
		b := make([]byte, rng.IntN(n+1))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	for round := range 40 {
		seen := map[string]bool{}
		var patterns []string
		var sb strings.Builder
		sb.WriteString("domain: d\ndescriptors:\n")
		for len(patterns) < smallSet+1+rng.IntN(60) {
			p := word("ab*", 6)
			if !strings.Contains(p, "*") || seen[p] {
				continue
			}
			seen[p] = true
			patterns = append(patterns, p)
			fmt.Fprintf(&sb, "  - {key: k, value: %q, rate_limit: {unit: second, requests_per_unit: %d}}\n", p, len(patterns))
		}
		rs := mustParse(t, map[string]string{"d.yaml": sb.String()})
		for range 300 {
			v := word("ab", 8)
			want := ""
			for _, p := range patterns {
				if globReference(p, v) {
					want = "k=" + p
					break
				}
			}
			got := ""
			if r := rs.Match("d", entries("k", v)); r != nil {
				got = r.Path
			}
			if got != want {
				t.Fatalf("round %d: %q matched %q, want %q (patterns %q)", round, v, got, want, patterns)
			}
		}
	}
}

// wildcardSiblings is a rule file with n wildcard siblings, each with its own prefix, after an
// exact value and before the key's default.
func wildcardSiblings(n int) []byte {
	var sb strings.Builder
	sb.WriteString("domain: d\ndescriptors:\n  - key: k\n    value: exact\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	for i := range n {
		fmt.Fprintf(&sb, "  - key: k\n    value: \"w%07d-*\"\n    rate_limit: {unit: second, requests_per_unit: 10}\n", i)
	}
	sb.WriteString("  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	return []byte(sb.String())
}

func TestManyWildcardSiblings(t *testing.T) {
	rs, err := Parse(map[string][]byte{"d.yaml": wildcardSiblings(20000)})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ value, path string }{
		{"exact", "k=exact"},
		{"w0000000-a", "k=w0000000-*"},
		{"w0019999-", "k=w0019999-*"},
		{"w0012345-x-y", "k=w0012345-*"},
		{"w0020000-x", "k"},
		{"w001234", "k"},
		{"", "k"},
	}
	for _, tc := range tests {
		if r := rs.Match("d", entries("k", tc.value)); r == nil || r.Path != tc.path {
			t.Errorf("Match(%q) = %+v, want %s", tc.value, r, tc.path)
		}
	}
	for _, v := range []string{"nothing-matches", "w0012345-x"} {
		es := entries("k", v)
		if n := testing.AllocsPerRun(100, func() { rs.Match("d", es) }); n != 0 {
			t.Errorf("Match(%q) allocates %v times", v, n)
		}
	}
	if _, reason := rs.Explain("d", entries("k", "w0012345-x", "j", "y")); !strings.Contains(reason, "k=w0012345-*") {
		t.Errorf("Explain names %q, want the wildcard", reason)
	}
}

// Loading must be near-linear in the number of wildcard siblings. Counting allocations (not
// time) keeps the test exact: the loader that compared each new wildcard with every earlier one
// allocated four times as much for twice the siblings.
func TestLoadWildcardsLinear(t *testing.T) {
	allocs := func(n int) float64 {
		data := wildcardSiblings(n)
		return testing.AllocsPerRun(1, func() {
			if _, err := Parse(map[string][]byte{"d.yaml": data}); err != nil {
				t.Fatal(err)
			}
		})
	}
	small, large := allocs(2000), allocs(4000)
	if ratio := large / small; ratio > 2.5 {
		t.Fatalf("Parse allocates %v times for 2000 wildcards, %v for 4000 (×%.1f): want about ×2", small, large, ratio)
	}
}

// Levels and keys past smallSet are found through maps; below it, by scanning slices.
func TestManyKeysAndValues(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("domain: d\ndescriptors:\n")
	for k := range 20 {
		for v := range 20 {
			fmt.Fprintf(&sb, "  - {key: k%d, value: v%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", k, v)
		}
		fmt.Fprintf(&sb, "  - {key: k%d, descriptors: [{key: c, value: x}, {key: c, rate_limit: {unit: second, requests_per_unit: 2}}]}\n", k)
	}
	rs := mustParse(t, map[string]string{"d.yaml": sb.String()})
	for _, n := range []int{0, 7, 8, 9, 19} {
		for _, m := range []int{0, 8, 19} {
			k, v := fmt.Sprintf("k%d", n), fmt.Sprintf("v%d", m)
			if r := rs.Match("d", entries(k, v)); r == nil || r.Path != k+"="+v {
				t.Errorf("Match(%s=%s) = %+v", k, v, r)
			}
		}
		k := fmt.Sprintf("k%d", n)
		if r := rs.Match("d", entries(k, "other", "c", "y")); r == nil || r.Path != k+"/c" {
			t.Errorf("Match(%s=other, c=y) = %+v", k, r)
		}
		if r := rs.Match("d", entries(k, "other", "c", "x")); r != nil {
			t.Errorf("Match(%s=other, c=x) = %+v, want allow-listed", k, r)
		}
	}
	if r := rs.Match("d", entries("k20", "v0")); r != nil {
		t.Errorf("unknown key matched %+v", r)
	}
}
