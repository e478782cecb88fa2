package descriptors

import (
	"strings"
	"testing"
)

const matchRules = `
domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60}
    descriptors:
      - key: path
        value: /admin
      - key: path
        value: "/v1/*/items/*"
        rate_limit: {unit: second, requests_per_unit: 5, name: items}
      - key: path
        value: "/v1/*"
        rate_limit: {unit: second, requests_per_unit: 10, name: v1}
      - key: path
        value: "*.json"
        rate_limit: {unit: second, requests_per_unit: 11}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 20, name: any_path}
  - key: user
    value: "vip-*"
    rate_limits:
      - {unit: second, requests_per_unit: 100, burst: 300}
      - {unit: day, requests_per_unit: 10000, name: daily}
  - key: user
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: open
    rate_limit: {unlimited: true}
  - key: parent_only
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 7, unit_multiplier: 2}
`

func mustParse(t *testing.T, files map[string]string) *RuleSet {
	t.Helper()
	m := map[string][]byte{}
	for k, v := range files {
		m[k] = []byte(v)
	}
	rs, err := Parse(m)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return rs
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{kv[i], kv[i+1]})
	}
	return es
}

func TestMatch(t *testing.T) {
	rs := mustParse(t, map[string]string{"d.yaml": matchRules})
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		path    string // "" for no rule
	}{
		{"key default", "d", entries("api_key", "k1"), "api_key"},
		{"exact value without limit allow-lists", "d", entries("api_key", "k1", "path", "/admin"), ""},
		{"wildcard in the middle, twice", "d", entries("api_key", "k", "path", "/v1/a/items/b"), "api_key/path=/v1/*/items/*"},
		{"first wildcard in file order wins", "d", entries("api_key", "k", "path", "/v1/x.json"), "api_key/path=/v1/*"},
		{"suffix wildcard", "d", entries("api_key", "k", "path", "/x.json"), "api_key/path=*.json"},
		{"falls back to key default", "d", entries("api_key", "k", "path", "/v2"), "api_key/path"},
		{"prefix wildcard", "d", entries("user", "vip-9"), "user=vip-*"},
		{"star matches anything", "d", entries("user", "bob"), "user=*"},
		{"star matches empty", "d", entries("user", ""), "user=*"},
		{"unlimited", "d", entries("open", "x"), "open"},
		{"request deeper than the tree", "d", entries("open", "x", "more", "y"), ""},
		{"node without limit", "d", entries("parent_only", "x"), ""},
		{"nested", "d", entries("parent_only", "x", "child", "y"), "parent_only/child"},
		{"unknown key", "d", entries("nope", "x"), ""},
		{"unknown domain", "other", entries("api_key", "k"), ""},
		{"second entry misses", "d", entries("user", "bob", "x", "y"), ""},
		{"no backtracking", "d", entries("api_key", "k", "path", "/admin", "x", "y"), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rs.Match(tc.domain, tc.entries)
			got := ""
			if r != nil {
				got = r.Path
			}
			if got != tc.path {
				t.Fatalf("Match(%s, %v) = %q, want %q", tc.domain, tc.entries, got, tc.path)
			}
		})
	}
}

func TestRuleContents(t *testing.T) {
	rs := mustParse(t, map[string]string{"d.yaml": matchRules})
	r := rs.Match("d", entries("user", "vip-1"))
	if len(r.Limits) != 2 || r.Limits[0].Burst != 300 || r.Limits[1].Name != "daily" || r.Limits[1].Burst != 10000 {
		t.Fatalf("rate_limits: got %+v", r.Limits)
	}
	r = rs.Match("d", entries("parent_only", "p", "child", "c"))
	l := r.Limits[0]
	if l.UnitMultiplier != 2 || l.GCRA.Period.Hours() != 2 || l.GCRA.Rate != 7 || l.GCRA.Burst != 7 {
		t.Fatalf("unit_multiplier: got %+v", l)
	}
	if r.Source != "d.yaml:32" {
		t.Fatalf("source: got %q, want d.yaml:32", r.Source)
	}
	if r := rs.Match("d", entries("open", "o")); !r.Unlimited || len(r.Limits) != 0 {
		t.Fatalf("unlimited: got %+v", r)
	}
}

func TestShareThreshold(t *testing.T) {
	rs := mustParse(t, map[string]string{"s.yaml": `
domain: s
descriptors:
  - key: tenant
    value: "team-*"
    share_threshold: true
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 3}
`})
	r := rs.Match("s", entries("tenant", "team-a", "path", "/x"))
	if r == nil || len(r.Share) != 2 || r.Share[0] != "team-*" || r.Share[1] != "" {
		t.Fatalf("got %+v, want Share [team-* \"\"]", r)
	}
}

func TestMatchAllocatesNothing(t *testing.T) {
	rs := mustParse(t, map[string]string{"d.yaml": matchRules})
	es := entries("api_key", "k", "path", "/v1/a/items/b")
	if n := testing.AllocsPerRun(100, func() { rs.Match("d", es) }); n != 0 {
		t.Fatalf("Match allocates %v times", n)
	}
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  []string // every one must appear
	}{
		{"unknown key", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n"},
			[]string{"a.yaml:4: unknown key rate_limt in Descriptor"}},
		{"bad unit and unlimited with unit, both reported", map[string]string{"a.yaml": `domain: a
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: j
    rate_limit:
      unlimited: true
      unit: second
`}, []string{`a.yaml:4: domain "a": descriptor k: unit "fortnight"`, `a.yaml:8: domain "a": descriptor j: unlimited must not have a unit`}},
		{"duplicate domain", map[string]string{"a.yaml": "domain: x\n", "b.yaml": "\n\ndomain: x\n"},
			[]string{`b.yaml:3: domain "x": duplicate domain, first defined at a.yaml:1`}},
		{"empty key", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - value: v\n"},
			[]string{`a.yaml:3: domain "a": descriptor #1 at the top level: key must not be empty`}},
		{"empty domain", map[string]string{"a.yaml": "descriptors: []\n"}, []string{"a.yaml:1: domain must not be empty"}},
		{"syntax", map[string]string{"a.yaml": "domain: [\n"}, []string{"a.yaml:"}},
		{"not a mapping", map[string]string{"a.yaml": "- 1\n"}, []string{"a.yaml:1: a rule file must be a mapping with a domain and descriptors, not a list"}},
		{"wrong type", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: many}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: requests_per_unit must be a whole number, not "many"`}},
		{"zero burst", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n"},
			[]string{"a.yaml:4: domain \"a\": descriptor k: burst must be > 0"}},
		{"zero multiplier", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n"},
			[]string{"descriptor k: unit_multiplier must be > 0"}},
		{"rate_limit and rate_limits", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits: [{unit: day, requests_per_unit: 1}]\n"},
			[]string{"a.yaml:5: domain \"a\": descriptor k: set rate_limit or rate_limits, not both"}},
		{"duplicate value", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n"},
			[]string{"a.yaml:5: domain \"a\": descriptor k=v: duplicate value"}},
		{"share_threshold without wildcard", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n"},
			[]string{"a.yaml:5: domain \"a\": descriptor k=v: share_threshold needs a wildcard"}},
		{"bad failure mode", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    failure_mode: maybe\n"},
			[]string{"a.yaml:4: domain \"a\": descriptor k: failure_mode \"maybe\""}},
		{"replaces itself", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n"},
			[]string{"descriptor k: a limit cannot replace itself"}},
		{"tolerance too long", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, burst: 1000}\n"},
			[]string{"a.yaml:4: domain \"a\": descriptor k: invalid limit"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string][]byte{}
			for k, v := range tc.files {
				m[k] = []byte(v)
			}
			_, err := Parse(m)
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseNeverPanics(t *testing.T) {
	inputs := []string{"", "~", "domain: a\ndescriptors: 5\n", "domain: a\ndescriptors:\n  - ~\n", "domain: a\ndescriptors:\n  - key: k\n    descriptors: {a: b}\n",
		"domain: a\ndescriptors:\n  - key: k\n    rate_limits: []\n", "domain: a\ndescriptors:\n  - key: k\n    metadata: {a: [1, {b: c}]}\n", "---\n---\n", "domain: a\n---\ndomain: b\n"}
	for _, in := range inputs {
		_, _ = Parse(map[string][]byte{"x.yaml": []byte(in)})
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(matchRules))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := Parse(map[string][]byte{"f.yaml": data})
		if err == nil && rs != nil {
			rs.Match("d", entries("api_key", "k", "path", "/v1/x"))
		}
	})
}

func BenchmarkMatch(b *testing.B) {
	rs, err := Parse(map[string][]byte{"d.yaml": []byte(matchRules)})
	if err != nil {
		b.Fatal(err)
	}
	es := entries("api_key", "k", "path", "/v1/a/items/b")
	b.ReportAllocs()
	for b.Loop() {
		if rs.Match("d", es) == nil {
			b.Fatal("no match")
		}
	}
}

func TestExplain(t *testing.T) {
	rs := mustParse(t, map[string]string{"d.yaml": matchRules})
	tests := []struct {
		name    string
		domain  string
		entries []Entry
		path    string
		reason  string
	}{
		{"match", "d", entries("api_key", "k", "path", "/v1/x"), "api_key/path=/v1/*", ""},
		{"unknown domain", "x", entries("api_key", "k"), "", `domain "x" has no rules`},
		{"miss", "d", entries("api_key", "k", "nope", "v"), "", `no rule matches entry 1 (key "nope") under api_key`},
		{"too deep", "d", entries("open", "o", "x", "y"), "", "the request is deeper than the rules: open has no children to match entry 1 (x)"},
		{"allow-listed", "d", entries("api_key", "k", "path", "/admin"), "", "api_key/path=/admin has no rate_limit: allow-listed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, reason := rs.Explain(tc.domain, tc.entries)
			got := ""
			if r != nil {
				got = r.Path
			}
			if got != tc.path || reason != tc.reason {
				t.Fatalf("got (%q, %q), want (%q, %q)", got, reason, tc.path, tc.reason)
			}
			if m := rs.Match(tc.domain, tc.entries); m != r {
				t.Fatalf("Explain and Match disagree: %v vs %v", r, m)
			}
		})
	}
}
