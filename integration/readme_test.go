package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/rls-project/rls/internal/descriptors"
)

// TestReadmeRules loads every rule file README.md and the pages of docs/ show, so the
// documentation cannot drift from the format.
func TestReadmeRules(t *testing.T) {
	pages, err := filepath.Glob(filepath.Join(repoRoot(), "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join(repoRoot(), "README.md")}, pages...)
	shown := map[string]int{}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(repoRoot(), page)
		for i, block := range regexp.MustCompile("(?s)```yaml\n(domain:.*?)```").FindAllSubmatch(b, -1) {
			shown[name]++
			if _, err := descriptors.Parse(map[string][]byte{name + " block": block[1]}); err != nil {
				t.Errorf("rule file %d in %s: %v", i+1, name, err)
			}
		}
	}
	// The pages that teach the format must show it.
	for _, name := range []string{"README.md", "docs/rules.md", "docs/algorithms.md", "docs/usage-limits.md"} {
		if shown[filepath.FromSlash(name)] == 0 {
			t.Errorf("%s shows no rule file", name)
		}
	}
}
