package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/rls-project/rls/api"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/rlstest"
)

// repoFile reads a file of the repository by its path from the root.
func repoFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(path)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRulesDocValidateExample: docs/rules.md's example of rls validate, run as shown: the file
// it shows, validated by the real binary, gives exactly the errors it shows.
func TestRulesDocValidateExample(t *testing.T) {
	t.Parallel()
	doc := repoFile(t, "docs/rules.md")
	m := regexp.MustCompile("(?s)```\n\\$ cat rules/api.yaml\n(.*?)\\$ go run ./cmd/rls validate rules/\n(.*?)```").FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("docs/rules.md: no example of `cat rules/api.yaml` then `go run ./cmd/rls validate rules/`")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "rules"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules", "api.yaml"), []byte(m[1]), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(rlstest.Binary(t), "validate", "rules/")
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("rls validate on the doc's file: %v, want exit status 1", err)
	}
	want := strings.TrimSuffix(m[2], "exit status 1\n") // what go run adds
	if stderr.String() != want {
		t.Errorf("docs/rules.md shows\n%s\nrls validate prints\n%s", want, stderr.String())
	}
}

// TestRulesDocKeysTable: every key of a rule file (api's yaml fields) has a row in
// docs/rules.md's Keys table.
func TestRulesDocKeysTable(t *testing.T) {
	t.Parallel()
	doc := repoFile(t, "docs/rules.md")
	start := strings.Index(doc, "## Keys")
	end := strings.Index(doc[start+1:], "\n## ")
	if start < 0 || end < 0 {
		t.Fatal("docs/rules.md: no Keys section")
	}
	table := doc[start : start+1+end]
	for _, typ := range []reflect.Type{reflect.TypeFor[api.RuleFile](), reflect.TypeFor[api.Descriptor](), reflect.TypeFor[api.RateLimit]()} {
		for f := range typ.Fields() {
			key := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if key == "" || key == "-" {
				continue
			}
			if !regexp.MustCompile("\n\\| [^|]*`" + regexp.QuoteMeta(key) + "`").MatchString(table) {
				t.Errorf("docs/rules.md's Keys table has no row for %s's key %s", typ.Name(), key)
			}
		}
	}
}

// TestGoClientDocMatchesReadmeRules: the descriptors of docs/go-client.md's own client example
// are limited by the rules the README has a reader write (rules/shop.yaml), with the values
// below for the example's variables.
func TestGoClientDocMatchesReadmeRules(t *testing.T) {
	t.Parallel()
	readme := repoFile(t, "README.md")
	shop := regexp.MustCompile("(?s)Put this in `rules/shop.yaml`:\n\n```yaml\n(.*?)```").FindStringSubmatch(readme)
	if shop == nil {
		t.Fatal("README.md: no rules/shop.yaml")
	}
	rs, err := descriptors.Parse(map[string][]byte{"shop.yaml": []byte(shop[1])})
	if err != nil {
		t.Fatal(err)
	}
	doc := repoFile(t, "docs/go-client.md")
	domain := regexp.MustCompile(`client\.New\("[^"]*", client\.Options\{\s*Domain:\s*"([^"]+)"`).FindStringSubmatch(doc)
	check := regexp.MustCompile(`c\.Check\(ctx, (.*)\)\n`).FindStringSubmatch(doc)
	if domain == nil || check == nil {
		t.Fatal("docs/go-client.md: no client.New with a Domain, or no c.Check(ctx, ...) call")
	}
	values := map[string]string{"key": "k1", "ip": "192.0.2.1", "r.URL.Path": "/login"}
	descs := regexp.MustCompile(`client\.Desc\(((?:[^()]|\([^()]*\))*)\)((?:\.With\([^()]*\))*)`).FindAllStringSubmatch(check[1], -1)
	if len(descs) == 0 {
		t.Fatalf("docs/go-client.md: no client.Desc in %q", check[1])
	}
	pair := regexp.MustCompile(`^"([^"]+)", (.+)$`)
	for _, d := range descs {
		var entries []descriptors.Entry
		args := []string{d[1]}
		for _, w := range regexp.MustCompile(`\.With\(([^()]*)\)`).FindAllStringSubmatch(d[2], -1) {
			args = append(args, w[1])
		}
		for _, a := range args {
			p := pair.FindStringSubmatch(a)
			if p == nil {
				t.Fatalf("docs/go-client.md: %q is not a key and a value", a)
			}
			name := strings.TrimSpace(p[2])
			v, ok := values[name]
			if strings.HasPrefix(name, `"`) {
				v, ok = strings.Trim(name, `"`), true
			}
			if !ok {
				t.Fatalf("docs/go-client.md: the example's variable %s has no value in this test: add one", name)
			}
			entries = append(entries, descriptors.Entry{Key: p[1], Value: v})
		}
		if r := rs.Match(domain[1], entries); r == nil || len(r.Limits) == 0 {
			t.Errorf("docs/go-client.md's descriptor %v in domain %s: no rule of README.md's rules/shop.yaml limits it", entries, domain[1])
		}
	}
}
