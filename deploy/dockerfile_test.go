package deploy_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with continuation lines joined.
type instruction struct {
	cmd  string // upper case
	args string
	line int
}

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(more + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args), start})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// stage is one FROM and what follows it.
type stage struct {
	image, name string
	body        []instruction
}

func stages(t *testing.T) []stage {
	t.Helper()
	var out []stage
	for _, in := range dockerfile(t) {
		if in.cmd == "FROM" {
			var words []string
			for _, w := range strings.Fields(in.args) {
				if !strings.HasPrefix(w, "--") {
					words = append(words, w)
				}
			}
			s := stage{image: words[0]}
			if len(words) == 3 && strings.EqualFold(words[1], "AS") {
				s.name = words[2]
			}
			out = append(out, s)
			continue
		}
		if len(out) == 0 {
			t.Fatalf("Dockerfile:%d: %s before FROM", in.line, in.cmd)
		}
		out[len(out)-1].body = append(out[len(out)-1].body, in)
	}
	return out
}

// shellWords splits a shell command line, honouring quotes. It handles what a Dockerfile RUN
// line for go build needs, not all of sh.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// goBuild is the Dockerfile's go build command: the environment it sets and go's arguments.
type goBuild struct {
	stage *stage
	env   []string
	args  []string // after "go"
}

func dockerGoBuild(t *testing.T, ss []stage) goBuild {
	t.Helper()
	var found []goBuild
	for i := range ss {
		for _, in := range ss[i].body {
			if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
				continue
			}
			b := goBuild{stage: &ss[i]}
			words := shellWords(in.args)
			for len(words) > 0 && strings.HasPrefix(words[0], "--mount=") {
				words = words[1:]
			}
			for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
				b.env = append(b.env, words[0])
				words = words[1:]
			}
			if len(words) < 2 || words[0] != "go" || words[1] != "build" {
				t.Fatalf("Dockerfile:%d: want a RUN of [VAR=value ...] go build ..., got %q", in.line, in.args)
			}
			b.args = words[1:]
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one RUN with go build, found %d", len(found))
	}
	return found[0]
}

func TestDockerfile(t *testing.T) {
	ss := stages(t)
	if len(ss) < 2 {
		t.Fatalf("%d stages: want a build stage and a small final stage", len(ss))
	}
	final := ss[len(ss)-1]
	b := dockerGoBuild(t, ss)
	names := map[string]bool{}
	checks := []struct {
		name  string
		check func() error
	}{
		{"base images pinned", func() error {
			for _, s := range ss {
				if s.image != "scratch" && !names[s.image] {
					if err := pinned(s.image); err != nil {
						return err
					}
				}
				names[s.name] = true
			}
			return nil
		}},
		{"final image is small", func() error {
			if final.image != "scratch" && !strings.Contains(final.image, "distroless/static") {
				return fmt.Errorf("final stage from %q: want scratch or distroless static", final.image)
			}
			return nil
		}},
		{"runs as a non-root user", func() error {
			var user string
			for _, in := range final.body {
				if in.cmd == "USER" {
					user = in.args
				}
			}
			uid, _, _ := strings.Cut(user, ":")
			if n, err := strconv.Atoi(uid); user == "" || uid == "root" || (err == nil && n == 0) {
				return fmt.Errorf("final stage USER %q", user)
			}
			return nil
		}},
		{"builds ./cmd/rls statically", func() error {
			if !slices.Contains(b.env, "CGO_ENABLED=0") {
				return fmt.Errorf("go build environment %q lacks CGO_ENABLED=0", b.env)
			}
			if b.args[len(b.args)-1] != "./cmd/rls" {
				return fmt.Errorf("go %q does not build ./cmd/rls", b.args)
			}
			return nil
		}},
		{"final image runs the binary the build stage made", func() error {
			out := b.args[slices.Index(b.args, "-o")+1]
			var copied, entry bool
			for _, in := range final.body {
				copied = copied || (in.cmd == "COPY" && strings.Contains(in.args, "--from="+b.stage.name+" "+out+" "))
				entry = entry || (in.cmd == "ENTRYPOINT" && strings.Contains(in.args, `"/`+path.Base(out)+`"`))
			}
			if !copied || !entry {
				return fmt.Errorf("final stage does not copy %s from %s and run it", out, b.stage.name)
			}
			return nil
		}},
		{"answers at /bin/ratelimit, the command envoyproxy/ratelimit's deployments run", func() error {
			// The build stage links <dir>/ratelimit to the binary's final path; the final
			// stage copies <dir> to /bin.
			bin := "/" + path.Base(b.args[slices.Index(b.args, "-o")+1])
			link := regexp.MustCompile(`ln -s (\S+) (\S+)/ratelimit\b`)
			for _, in := range b.stage.body {
				m := link.FindStringSubmatch(in.args)
				if in.cmd != "RUN" || m == nil || m[1] != bin {
					continue
				}
				for _, fin := range final.body {
					if fin.cmd == "COPY" && strings.HasSuffix(fin.args, "--from="+b.stage.name+" "+m[2]+" /bin") {
						return nil
					}
				}
				return fmt.Errorf("%s/ratelimit links to %s but the final stage does not copy %s to /bin", m[2], bin, m[2])
			}
			return fmt.Errorf("no RUN ln -s %s <dir>/ratelimit in stage %s", bin, b.stage.name)
		}},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			if err := ck.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestDockerfileBuildIsStatic runs the Dockerfile's go build command here, for this machine's
// platform, and checks that the binary needs no dynamic loader: a dynamic one would not start
// in an image without libc.
func TestDockerfileBuildIsStatic(t *testing.T) {
	b := dockerGoBuild(t, stages(t))
	declared := map[string]bool{}
	for _, in := range b.stage.body {
		if in.cmd == "ARG" {
			for _, a := range strings.Fields(in.args) {
				name, _, _ := strings.Cut(a, "=")
				declared[name] = true
			}
		}
	}
	platform := map[string]string{"TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH}
	expand := func(s string) string {
		return os.Expand(s, func(v string) string {
			if !declared[v] {
				t.Fatalf("Dockerfile uses $%s without an ARG in the build stage; it would be empty", v)
			}
			val, ok := platform[v]
			if !ok {
				t.Fatalf("Dockerfile uses $%s, which this test cannot supply", v)
			}
			return val
		})
	}
	bin := filepath.Join(t.TempDir(), "rls")
	args := slices.Clone(b.args)
	for i := range args {
		args[i] = expand(args[i])
		if i > 0 && args[i-1] == "-o" {
			args[i] = bin
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = os.Environ()
	for _, e := range b.env {
		cmd.Env = append(cmd.Env, expand(e))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs %q", libs)
	}
}

// dockerignore reads .dockerignore's patterns.
func dockerignore(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rest, deep := strings.CutPrefix(line, "**/")
		if strings.HasPrefix(line, "!") || strings.Contains(rest, "**") || (deep && strings.Contains(rest, "/")) {
			t.Fatalf(".dockerignore: %q is a pattern this test cannot evaluate", line)
		}
		if _, err := path.Match(rest, ""); err != nil {
			t.Fatalf(".dockerignore: %q: %v", line, err)
		}
		pats = append(pats, line)
	}
	return pats
}

// ignoredBy returns the pattern that keeps rel (slash-separated, relative to the context root)
// out of the build context, or "". As in Docker, a pattern that matches a directory excludes
// everything below it.
func ignoredBy(pats []string, rel string) string {
	segs := strings.Split(rel, "/")
	for _, p := range pats {
		for i := 1; i <= len(segs); i++ {
			var ok bool
			if rest, deep := strings.CutPrefix(p, "**/"); deep {
				ok, _ = path.Match(rest, segs[i-1])
			} else {
				ok, _ = path.Match(p, strings.Join(segs[:i], "/"))
			}
			if ok {
				return p
			}
		}
	}
	return ""
}

// TestDockerignoreKeepsBuildInputs: a file go build ./cmd/rls reads but .dockerignore leaves out
// breaks the image build only, where no test runs.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	pats := dockerignore(t)
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,GoFiles,CgoFiles,EmbedFiles,Module", "./cmd/rls")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir                           string
			GoFiles, CgoFiles, EmbedFiles []string
			Module                        *struct{ Main bool }
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.EmbedFiles) {
			inputs = append(inputs, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if !slices.Contains(inputs, "cmd/rls/main.go") {
		t.Fatalf("go list found no cmd/rls/main.go among %q", inputs)
	}
	for _, f := range inputs {
		if p := ignoredBy(pats, f); p != "" {
			t.Errorf("%s is needed to build and excluded by .dockerignore's %q", f, p)
		}
	}
	// And the patterns do what they are for.
	for _, f := range []string{".git/config", "deploy/compose.yaml", "internal/service/service_test.go", "README.md"} {
		if ignoredBy(pats, f) == "" {
			t.Errorf("%s is in the build context", f)
		}
	}
}
