package policy

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestReadmePolicy parses every caller policy docs/security.md shows, so the documentation cannot
// drift from the format.
func TestReadmePolicy(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(callers:.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) == 0 {
		t.Fatal("docs/security.md shows no caller policy")
	}
	for i, b := range blocks {
		p, err := Parse("docs/security.md block", b[1])
		if err != nil {
			t.Errorf("caller policy %d in docs/security.md: %v", i+1, err)
			continue
		}
		if len(p.Callers) == 0 || p.Default == nil {
			t.Errorf("caller policy %d in docs/security.md: want callers and a default entry", i+1)
		}
	}
}
