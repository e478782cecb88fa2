package limit

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayers keeps the packages' layers one-way: limit imports nothing of rls, and the rule
// loader knows nothing of the stores, so rules and stores each build on limit alone.
func TestLayers(t *testing.T) {
	const mod = "github.com/rls-project/rls/"
	for _, tc := range []struct {
		pkg       string
		forbidden []string // import path prefixes, below mod
	}{
		{"internal/limit", []string{""}},
		{"internal/descriptors", []string{"internal/backend", "internal/service", "internal/server", "cmd/"}},
		{"internal/backend", []string{"internal/descriptors", "internal/service", "internal/server", "cmd/"}},
		{"client", []string{"internal/descriptors", "internal/service", "internal/server", "internal/backend/redis", "cmd/"}},
	} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+tc.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", tc.pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			rest, ok := strings.CutPrefix(dep, mod)
			if !ok || rest == tc.pkg {
				continue
			}
			for _, f := range tc.forbidden {
				if strings.HasPrefix(rest, f) {
					t.Errorf("%s depends on %s", tc.pkg, rest)
				}
			}
		}
	}
}
