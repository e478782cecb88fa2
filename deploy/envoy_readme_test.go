package deploy_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEnvoyReadmeListsEveryFile: deploy/envoy/README.md's table of files names every file the
// directory ships, so that none is there without a word of what it is.
func TestEnvoyReadmeListsEveryFile(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("envoy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The table's rows: | `file`, `file` | what it is |
	named := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(first, -1) {
			named[m[1]] = true
		}
	}
	err = filepath.WalkDir("envoy", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel("envoy", path)
		if rel != "README.md" && !named[filepath.ToSlash(rel)] {
			t.Errorf("deploy/envoy/%s is not in deploy/envoy/README.md's table of files", filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
