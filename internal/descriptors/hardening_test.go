package descriptors

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
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
				t.Fatalf("period %v, Validate %v; want a period past %v and ErrInvalidLimit", l.Spec.Period, err, limit.MaxTolerance)
			}
		})
	}
}

// What the strict decoder must still accept as the reflection-based one did.
func TestLoadAccepts(t *testing.T) {
	rs := mustParse(t, map[string]string{"a.yaml": `domain: a
descriptors:
  - key: std
    rate_limit: &std {unit: second, requests_per_unit: 5, name: std}
  - key: alias
    rate_limit: *std
  - key: merged
    rate_limit:
      <<: *std
      name: merged
      burst: 7
  - key: whole_float
    rate_limit: {unit: minute, requests_per_unit: 100.0, burst: 1e3, unit_multiplier: 0x2}
  - key: nulls
    value: ~
    rate_limit: ~
    descriptors: ~
    metadata: ~
  - key: yes_no
    shadow_mode: yes
    rate_limit: {unit: second, requests_per_unit: 1_000}
  - key: children
    descriptors: &kids
      - {key: c, rate_limit: {unit: day, requests_per_unit: 1}}
  - key: children2
    descriptors: *kids
  - key: meta
    metadata: &meta {team: a, tags: [x, y]}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: meta2
    metadata: *meta
    rate_limit: {unit: second, requests_per_unit: 1}
---
`})
	lim := func(key string) Limit {
		t.Helper()
		r := rs.Match("a", entries(key, "x"))
		if r == nil || len(r.Limits) != 1 {
			t.Fatalf("%s: rule %+v, want one limit", key, r)
		}
		return r.Limits[0]
	}
	if l := lim("alias"); l.Name != "std" || l.RequestsPerUnit != 5 {
		t.Errorf("alias: %+v", l)
	}
	if l := lim("merged"); l.Name != "merged" || l.RequestsPerUnit != 5 || l.Burst != 7 || l.Unit != limit.Second {
		t.Errorf("merge key: %+v, want the anchor's values with name and burst overridden", l)
	}
	if l := lim("whole_float"); l.RequestsPerUnit != 100 || l.Burst != 1000 || l.UnitMultiplier != 2 {
		t.Errorf("whole floats and hex: %+v", l)
	}
	if r := rs.Match("a", entries("nulls", "x")); r != nil {
		t.Errorf("nulls: %+v, want no limit", r)
	}
	if r := rs.Match("a", entries("yes_no", "x")); r == nil || !r.ShadowMode || r.Limits[0].RequestsPerUnit != 1000 {
		t.Errorf("yes_no: %+v", r)
	}
	for _, k := range []string{"meta", "meta2"} {
		if r := rs.Match("a", entries(k, "x")); r == nil || r.Metadata["team"] != "a" || len(r.Metadata["tags"].([]any)) != 2 {
			t.Errorf("%s: metadata %+v", k, r)
		}
	}
	for _, k := range []string{"children", "children2"} {
		if r := rs.Match("a", entries(k, "x", "c", "y")); r == nil || r.Path != k+"/c" {
			t.Errorf("%s: %+v", k, r)
		}
	}
}

// globReference is the matcher the tree had before wildcards were indexed: the pattern split
// at '*', its first part a prefix, its last a suffix, the others found leftmost in order.
func globReference(pattern, v string) bool {
	segs := strings.Split(pattern, "*")
	first, last := segs[0], segs[len(segs)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	v = v[len(first) : len(v)-len(last)]
	for _, s := range segs[1 : len(segs)-1] {
		i := strings.Index(v, s)
		if i < 0 {
			return false
		}
		v = v[i+len(s):]
	}
	return true
}

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
