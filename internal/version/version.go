// Package version says which rls this is: the version the build was given, else the module
// version Go recorded (a tagged `go install`), with the commit when Go recorded one.
//
// A release build sets it with the linker:
//
//	go build -ldflags "-X github.com/rls-project/rls/internal/version.version=v1.2.3" ./cmd/rls
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set by -ldflags "-X github.com/rls-project/rls/internal/version.version=...";
// empty, the build information decides.
var version string

// Info is what rls says of its build.
type Info struct {
	Version   string // v1.2.3, or "(devel)" for a build from a work tree without one
	Revision  string // the commit, when Go recorded it; "" otherwise
	Modified  bool   // the work tree had uncommitted changes
	GoVersion string // the Go release that built it: go1.26.8
}

// Get returns this binary's Info.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	return fromBuild(version, bi, ok)
}

// fromBuild is Get from its inputs: the linker's version, and the build information when ok.
func fromBuild(linked string, bi *debug.BuildInfo, ok bool) Info {
	in := Info{Version: strings.TrimSpace(linked), GoVersion: runtime.Version()}
	if !ok {
		if in.Version == "" {
			in.Version = "(devel)"
		}
		return in
	}
	if bi.GoVersion != "" {
		in.GoVersion = bi.GoVersion
	}
	if in.Version == "" {
		in.Version = bi.Main.Version
	}
	if in.Version == "" {
		in.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Revision = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	return in
}

// String is the version as one line: "v1.2.3 (commit 0123abcd, go1.26.8)", the commit
// shortened to 12 characters and marked "-dirty" when the tree had changes.
func (in Info) String() string {
	var b strings.Builder
	b.WriteString(in.Version)
	b.WriteString(" (")
	if in.Revision != "" {
		b.WriteString("commit ")
		b.WriteString(in.ShortRevision())
		b.WriteString(", ")
	}
	b.WriteString(in.GoVersion)
	b.WriteString(")")
	return b.String()
}

// ShortRevision is the commit shortened to 12 characters, with "-dirty" when the tree had
// uncommitted changes; "" when none was recorded.
func (in Info) ShortRevision() string {
	r := in.Revision
	if r == "" {
		return ""
	}
	if len(r) > 12 {
		r = r[:12]
	}
	if in.Modified {
		r += "-dirty"
	}
	return r
}
