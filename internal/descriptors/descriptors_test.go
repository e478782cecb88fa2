package descriptors

import (
	"fmt"
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
	if l.UnitMultiplier != 2 || l.Spec.Period.Hours() != 2 || l.Spec.Rate != 7 || l.Spec.Burst != 7 {
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
		{"overdraft with unlimited, overdraft not a boolean", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, overdraft: true}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 1, overdraft: maybe}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: unlimited cannot have overdraft`, "a.yaml:6:"}},
		{"syntax", map[string]string{"a.yaml": "domain: [\n"}, []string{"a.yaml:"}},
		{"not a mapping", map[string]string{"a.yaml": "- 1\n"}, []string{"a.yaml:1: a rule file must be a mapping with a domain and descriptors, not a list"}},
		{"wrong type", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: many}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: requests_per_unit must be a whole number, not "many"`}},
		{"zero burst", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n"},
			[]string{"a.yaml:4: domain \"a\": descriptor k: burst 0 must be > 0"}},
		{"zero multiplier", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n"},
			[]string{"a.yaml:4: domain \"a\": descriptor k: unit_multiplier 0: a period of 0 seconds must be > 0"}},
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
			[]string{"a.yaml:4: domain \"a\": descriptor k: invalid limit: burst 1000 × period 8760h0m0s / rate 1 exceeds"}},
		// Counts must be whole numbers in range, not rounded or wrapped.
		{"fractional requests_per_unit", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0.5}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: requests_per_unit must be a whole number, got 0.5`}},
		{"fraction above one", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1.9\n"},
			[]string{`a.yaml:6: domain "a": descriptor k: requests_per_unit must be a whole number, got 1.9`}},
		{"negative requests_per_unit", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: requests_per_unit must not be negative, got -1`}},
		{"requests_per_unit above 2^32-1", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: requests_per_unit must be at most 4294967295, got 4294967296`}},
		{"requests_per_unit beyond int64", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 99999999999999999999999}\n"},
			[]string{`descriptor k: requests_per_unit must be at most 4294967295, got 99999999999999999999999`}},
		{"requests_per_unit as a large float", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1e20}\n"},
			[]string{`descriptor k: requests_per_unit must be at most 4294967295, got 1e20`}},
		{"requests_per_unit infinite", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: .inf}\n"},
			[]string{`descriptor k: requests_per_unit must be a whole number, got .inf`}},
		{"requests_per_unit as a quoted string", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"10\"}\n"},
			[]string{`descriptor k: requests_per_unit must be a whole number, not "10"`}},
		{"fractional burst", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2.5}\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: burst must be a whole number, got 2.5`}},
		{"negative burst", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: -3}\n"},
			[]string{`descriptor k: burst must not be negative, got -3`}},
		{"burst above 2^32-1", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0x100000000}\n"},
			[]string{`descriptor k: burst must be at most 4294967295, got 0x100000000`}},
		{"burst as a list", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: [1]}\n"},
			[]string{`descriptor k: burst must be a whole number, not a list`}},
		{"fractional unit_multiplier", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0.5}\n"},
			[]string{`descriptor k: unit_multiplier must be a whole number, got 0.5`}},
		{"unit_multiplier above 2^32-1", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 4294967296}\n"},
			[]string{`descriptor k: unit_multiplier must be at most 4294967295, got 4294967296`}},
		{"period wraps", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1\n      unit_multiplier: 640511948\n"},
			[]string{`a.yaml:7: domain "a": descriptor k: unit_multiplier 640511948: a period of 640511948 hours is longer than the longest supported, 36500 days`}},
		{"period just too long", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: year, requests_per_unit: 1, unit_multiplier: 101}\n"},
			[]string{`a.yaml:6: domain "a": descriptor k: rate_limits[1]: unit_multiplier 101: a period of 101 years is longer`}},
		// One document per file, and no null in a list.
		{"second document", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n---\ndomain: b\n"},
			[]string{`a.yaml:5: a second YAML document`}},
		{"second document after an empty first", map[string]string{"a.yaml": "---\n---\ndomain: b\n"},
			[]string{`a.yaml:3: a second YAML document`, "a.yaml:1: empty rule file"}},
		{"null descriptor", map[string]string{"a.yaml": "domain: a\ndescriptors: [null]\n"},
			[]string{`a.yaml:2: domain "a": descriptor #1 at the top level is empty (null)`}},
		{"empty list item", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n  -\n"},
			[]string{`a.yaml:4: domain "a": descriptor #2 at the top level is empty (null)`}},
		{"nested null descriptor", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: j\n      - ~\n"},
			[]string{`a.yaml:7: domain "a": descriptor #2 under k=v is empty (null)`}},
		{"null in rate_limits", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - null\n"},
			[]string{`a.yaml:6: domain "a": descriptor k: rate_limits[1] is empty (null)`}},
		{"descriptor not a mapping", map[string]string{"a.yaml": "domain: a\ndescriptors: [k]\n"},
			[]string{`a.yaml:2: domain "a": descriptor #1 at the top level must be a mapping, not "k"`}},
		{"descriptors not a list", map[string]string{"a.yaml": "domain: a\ndescriptors: 5\n"},
			[]string{`a.yaml:2: domain "a": descriptors at the top level must be a list, not 5`}},
		{"rate_limit not a mapping", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: 0\n"},
			[]string{`a.yaml:4: domain "a": descriptor k: rate_limit must be a mapping, not 0`}},
		{"repeated key", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    key: j\n"},
			[]string{`a.yaml:4: key key set twice in Descriptor`}},
		{"bad boolean", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n"},
			[]string{`a.yaml:4: domain "a": shadow_mode must be true or false, not "maybe"`}},
		{"alias bomb", map[string]string{"a.yaml": aliasBomb()}, []string{"anchors and aliases expand the file to more than"}},
		{"aliased large metadata", map[string]string{"a.yaml": aliasedMetadata()}, []string{"anchors and aliases expand the file to more than"}},
		{"aliased mapping with many unknown keys", map[string]string{"a.yaml": aliasedUnknownKeys()}, []string{"anchors and aliases expand the file to more than"}},
		{"tagged non-number", map[string]string{"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: !!int abc}\n"},
			[]string{`descriptor k: requests_per_unit must be a whole number, got abc`}},
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
				if msg := err.Error(); !strings.Contains(msg, w) {
					if len(msg) > 2000 {
						msg = msg[:2000] + "…"
					}
					t.Errorf("error %q\ndoes not contain %q", msg, w)
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
	for _, seed := range []string{
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0.5}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.9, burst: -1}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, unit_multiplier: 640511948}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 4294967295, burst: 4294967295, unit_multiplier: 4294967295}\n",
		"domain: d\ndescriptors:\n  - key: k\n---\ndomain: e\n",
		"domain: d\ndescriptors: [null]\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limits: [~, {unit: second, requests_per_unit: 1e3}]\n",
		"domain: d\ndescriptors:\n  - key: api_key\n    rate_limit: &l {unit: second, requests_per_unit: 5}\n  - key: k\n    rate_limit: {<<: *l, burst: 9}\n    descriptors: &c [{key: path, value: \"/v1/*\"}, {key: path, value: \"*.json\"}]\n  - key: j\n    descriptors: *c\n",
		string(wildcardSiblings(20)),
		aliasBomb(),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := Parse(map[string][]byte{"f.yaml": data})
		if err != nil || rs == nil {
			return
		}
		for _, d := range rs.Domains {
			for _, r := range d.Rules {
				for _, l := range r.Limits {
					if err := l.Spec.Validate(); err != nil {
						t.Fatalf("rule %s loaded with an invalid limit: %v", r.Path, err)
					}
				}
			}
		}
		for _, es := range [][]Entry{
			entries("api_key", "k", "path", "/v1/x"),
			entries("k", "w0000003-x"),
			entries("k", ""),
		} {
			for _, d := range rs.Domains {
				r, _ := rs.Explain(d.Name, es)
				if m := rs.Match(d.Name, es); m != r {
					t.Fatalf("Explain and Match disagree on %v: %v vs %v", es, r, m)
				}
			}
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

// aliasBomb is a rule file whose anchors expand to 10¹⁰ descriptors: each level's ten
// siblings all alias the level below.
func aliasBomb() string {
	var sb strings.Builder
	sb.WriteString("domain: a\ndescriptors:\n")
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&sb, "  - key: k%d\n    descriptors: &l%d [", i, i)
		for j := 0; j < 10; j++ {
			if j > 0 {
				sb.WriteString(", ")
			}
			if i == 0 {
				fmt.Fprintf(&sb, "{key: c%d}", j)
			} else {
				fmt.Fprintf(&sb, "{key: c%d, descriptors: *l%d}", j, i-1)
			}
		}
		sb.WriteString("]\n")
	}
	return sb.String()
}

// exactSiblings is a rule file with n exact-value siblings.
func exactSiblings(n int) []byte {
	var sb strings.Builder
	sb.WriteString("domain: d\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&sb, "  - key: k\n    value: \"v%07d\"\n    rate_limit: {unit: second, requests_per_unit: 10}\n", i)
	}
	return []byte(sb.String())
}

func BenchmarkLoad(b *testing.B) {
	for _, bc := range []struct {
		name string
		data []byte
	}{
		{"exact-10k", exactSiblings(10000)},
		{"wildcard-10k", wildcardSiblings(10000)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.data)))
			for b.Loop() {
				if _, err := Parse(map[string][]byte{"d.yaml": bc.data}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMatchWildcardSiblings(b *testing.B) {
	rs, err := Parse(map[string][]byte{"d.yaml": wildcardSiblings(20000)})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, value, path string }{
		{"unmatched", "nothing-matches", "k"},
		{"matched", "w0012345-x", "k=w0012345-*"},
		{"exact", "exact", "k=exact"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			es := entries("k", bc.value)
			b.ReportAllocs()
			for b.Loop() {
				if r := rs.Match("d", es); r == nil || r.Path != bc.path {
					b.Fatalf("got %+v", r)
				}
			}
		})
	}
}

// aliasedUnknownKeys is a rule file whose one mapping of a thousand unknown keys is aliased by a
// thousand descriptors: without a budget, a million errors.
func aliasedUnknownKeys() string {
	var sb strings.Builder
	sb.WriteString("domain: a\ndescriptors:\n  - &d {key: k")
	for i := range 1000 {
		fmt.Fprintf(&sb, ", x%d: 1", i)
	}
	sb.WriteString("}\n")
	for range 1000 {
		sb.WriteString("  - *d\n")
	}
	return sb.String()
}

// aliasedMetadata is a rule file whose one metadata mapping of a thousand values is aliased by a
// thousand descriptors.
func aliasedMetadata() string {
	var sb strings.Builder
	sb.WriteString("domain: a\ndescriptors:\n  - key: k\n    metadata: &m {a: 1")
	for i := range 1000 {
		fmt.Fprintf(&sb, ", x%d: 1", i)
	}
	sb.WriteString("}\n")
	for i := range 1000 {
		fmt.Fprintf(&sb, "  - {key: k%d, metadata: *m}\n", i)
	}
	return sb.String()
}
