package descriptors

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const (
	ruleA = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	ruleB = "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	ruleC = "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"
)

func domainNames(rs *RuleSet) string {
	var names []string
	for _, d := range rs.Domains {
		names = append(names, d.Name)
	}
	return strings.Join(names, ",")
}

func TestLoadWithFiles(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"a.yaml":         ruleA,
		"sub/b.conf":     ruleB,
		".hidden/c.yaml": ruleC,
		"notes.txt":      "domain: n\ndescriptors: []\n",
	})
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"rls layout: top-level yaml only", Options{}, "a"},
		{"every file, no dot files", Options{AllFiles: true}, "a,b,n"},
		{"every file and dot files", Options{AllFiles: true, DotFiles: true}, "a,b,c,n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := LoadWith(dir, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := domainNames(rs); got != tc.want {
				t.Errorf("domains %s, want %s (files %v)", got, tc.want, rs.Files)
			}
		})
	}
	// A subdirectory's file is named by its path under the directory, in errors too.
	bad := writeTree(t, map[string]string{"sub/bad.conf": "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	_, err := LoadWith(bad, Options{AllFiles: true})
	if err == nil || !strings.Contains(err.Error(), filepath.Join(bad, "sub", "bad.conf")+":4:") {
		t.Errorf("error %v, want it to name sub/bad.conf:4", err)
	}
	if _, err := LoadWith(t.TempDir(), Options{AllFiles: true}); err == nil || !strings.Contains(err.Error(), "no rule files") {
		t.Errorf("empty directory: %v", err)
	}
}

func TestMergeDomains(t *testing.T) {
	files := map[string][]byte{
		"one.yaml": []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		"two.yaml": []byte("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"),
	}
	if _, err := Parse(files); err == nil || !strings.Contains(err.Error(), "duplicate domain") {
		t.Fatalf("without merging: %v, want duplicate domain", err)
	}
	rs, err := ParseWith(files, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Domains) != 1 || rs.Domains[0].File != "one.yaml" {
		t.Fatalf("domains %+v, want d from one.yaml", rs.Domains)
	}
	for key, want := range map[string]string{"a": "one.yaml:3", "b": "two.yaml:3"} {
		r := rs.Match("d", []Entry{{Key: key}})
		if r == nil || r.Source != want {
			t.Errorf("key %s: rule %+v, want one defined at %s", key, r, want)
		}
	}
	// The same descriptor in two files is a duplicate, reported in the file of the second.
	files["three.yaml"] = []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	_, err = ParseWith(files, Options{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), "three.yaml:3:") || !strings.Contains(err.Error(), "duplicate key") {
		t.Errorf("duplicate across files: %v, want three.yaml:3 duplicate key", err)
	}
}

func TestOverdraftLoads(t *testing.T) {
	dir := writeTree(t, map[string]string{"tokens.yaml": `domain: ai
descriptors:
  - key: api_key
    descriptors:
      - key: model
        rate_limits:
          - {unit: minute, requests_per_unit: 1000, overdraft: true}
          - {unit: day, requests_per_unit: 100000}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 10}
`})
	rs, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Match("ai", []Entry{{Key: "api_key", Value: "k1"}, {Key: "model", Value: "m"}})
	if r == nil || len(r.Limits) != 2 || !r.Limits[0].Spec.Overdraft || r.Limits[1].Spec.Overdraft {
		t.Fatalf("got %+v, want the minute limit with overdraft and the day limit without", r)
	}
	if p := rs.Match("ai", []Entry{{Key: "plain", Value: "x"}}); p == nil || p.Limits[0].Spec.Overdraft {
		t.Fatalf("plain: got %+v, want no overdraft", p)
	}
}

// TestGlobal: a limit is global across regions when it says global: true, or when its domain is
// one of Options.GlobalDomains and it neither says global: false nor cannot be global (a window
// algorithm, overdraft); global: true on a limit that cannot be global is refused at its line.
func TestGlobal(t *testing.T) {
	files := map[string][]byte{"a.yaml": []byte(`domain: shop
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10, global: true}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 10}
`), "b.yaml": []byte(`domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: local
    rate_limit: {unit: second, requests_per_unit: 10, global: false}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 10, overdraft: true}
`)}
	shared := func(rs *RuleSet, domain, key string) bool {
		r := rs.Match(domain, []Entry{{Key: key, Value: "x"}})
		if r == nil {
			t.Fatalf("%s %s: no rule", domain, key)
		}
		return r.Limits[0].Spec.Shared
	}
	for _, tc := range []struct {
		domains []string
		want    map[string]bool
	}{
		{nil, map[string]bool{"shop/user": true, "shop/ip": false, "api/user": false, "api/local": false, "api/window": false, "api/tokens": false}},
		{[]string{"api"}, map[string]bool{"shop/user": true, "shop/ip": false, "api/user": true, "api/local": false, "api/window": false, "api/tokens": false}},
	} {
		rs, err := ParseWith(files, Options{GlobalDomains: tc.domains})
		if err != nil {
			t.Fatal(err)
		}
		for dk, want := range tc.want {
			domain, key, _ := strings.Cut(dk, "/")
			if got := shared(rs, domain, key); got != want {
				t.Errorf("global domains %v: %s: global %v, want %v", tc.domains, dk, got, want)
			}
		}
	}
	_, err := Parse(map[string][]byte{"c.yaml": []byte(`domain: c
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 10
      algorithm: sliding_window
      global: true
`)})
	if err == nil || !strings.Contains(err.Error(), "c.yaml:8:") || !strings.Contains(err.Error(), "global") ||
		!strings.Contains(err.Error(), "gcra only") {
		t.Errorf("global on sliding_window: %v, want an error at c.yaml:8 naming global", err)
	}
}

func TestGlobalOverdraftRefused(t *testing.T) {
	_, err := Parse(map[string][]byte{"d.yaml": []byte(`domain: d
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 10
      overdraft: true
      global: true
`)})
	if err == nil || !strings.Contains(err.Error(), "d.yaml:8:") || !strings.Contains(err.Error(), "global does not apply with overdraft") {
		t.Errorf("global with overdraft: %v, want an error at d.yaml:8", err)
	}
}
