package replay_test

import (
	"os/exec"
	"testing"
)

// chromium returns the path of the headless browser the HTML report is checked in: Debian's
// chromium package (scripts/test installs it). It fails the test without one.
func chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium in PATH: apt-get install chromium")
	return ""
}
