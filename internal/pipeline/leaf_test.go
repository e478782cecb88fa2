package pipeline

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeaf keeps the package a leaf: it imports nothing of rls, so it knows nothing of Redis or
// of rls's records.
func TestLeaf(t *testing.T) {
	const mod = "github.com/rls-project/rls/"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+"internal/pipeline").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, mod) && dep != mod+"internal/pipeline" {
			t.Errorf("internal/pipeline depends on %s", dep)
		}
	}
}
