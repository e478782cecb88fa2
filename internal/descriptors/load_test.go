package descriptors

import (
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/limit"
)

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
