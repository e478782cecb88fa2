package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/rls-project/rls/internal/descriptors"
)

// TestReadmeRules loads every rule file the README shows, so the documentation cannot drift
// from the format.
func TestReadmeRules(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(domain:.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) == 0 {
		t.Fatal("README shows no rule file")
	}
	for i, b := range blocks {
		if _, err := descriptors.Parse(map[string][]byte{"README.md block": b[1]}); err != nil {
			t.Errorf("rule file %d in README.md: %v", i+1, err)
		}
	}
}
