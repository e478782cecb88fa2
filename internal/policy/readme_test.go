package policy

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestReadmePolicy parses every caller policy the README shows, so the documentation cannot
// drift from the format.
func TestReadmePolicy(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(callers:.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) == 0 {
		t.Fatal("README shows no caller policy")
	}
	for i, b := range blocks {
		p, err := Parse("README.md block", b[1])
		if err != nil {
			t.Errorf("caller policy %d in README.md: %v", i+1, err)
			continue
		}
		if len(p.Callers) == 0 || p.Default == nil {
			t.Errorf("caller policy %d in README.md: want callers and a default entry", i+1)
		}
	}
}
