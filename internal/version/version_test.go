package version

import (
	"runtime/debug"
	"testing"
)

// TestFromBuild: the linker's version wins over the module's; without either the version is
// "(devel)"; the commit is shortened and marked dirty.
func TestFromBuild(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v0.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"},
	}}
	for _, tc := range []struct {
		linked string
		bi     *debug.BuildInfo
		want   string
	}{
		{"", bi, "v0.4.0 (commit 0123456789ab-dirty, go1.99.1)"},
		{"v1.2.3", bi, "v1.2.3 (commit 0123456789ab-dirty, go1.99.1)"},
		{"", &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "(devel)"}}, "(devel) (go1.99.1)"},
		{"", &debug.BuildInfo{GoVersion: "go1.99.1"}, "(devel) (go1.99.1)"},
	} {
		if got := fromBuild(tc.linked, tc.bi, true).String(); got != tc.want {
			t.Errorf("fromBuild(%q): %q, want %q", tc.linked, got, tc.want)
		}
	}
	if got := fromBuild("", nil, false); got.Version != "(devel)" || got.GoVersion == "" {
		t.Errorf("without build information: %+v", got)
	}
}
