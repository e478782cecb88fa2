package main

import (
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/rlstest"
)

const cliRules = `domain: shop
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
`

// TestVersion: a binary built with its version set by the linker says it in rls version, rls
// --version, its start line and rls_build_info; one built without says (devel).
func TestVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "rls")
	build := exec.Command("go", "build", "-o", bin, "-ldflags", "-X github.com/rls-project/rls/internal/version.version=v9.8.7-test", ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	want := "rls v9.8.7-test ("
	for _, arg := range []string{"version", "--version", "-version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil || !strings.HasPrefix(string(out), want) || !strings.HasSuffix(string(out), runtime.Version()+")\n") {
			t.Errorf("rls %s: %v, %q; want %q...%s)", arg, err, out, want, runtime.Version())
		}
	}
	p := rlstest.Launch(t, bin, nil, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "", "--log-format", "text")
	if !strings.Contains(p.Output(), `msg="rls serving"`) || !strings.Contains(p.Output(), `version="v9.8.7-test (`) {
		t.Errorf("the start line lacks the version:\n%s", p.Output())
	}
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	line := regexp.MustCompile(`(?m)^rls_build_info\{goversion="` + regexp.QuoteMeta(runtime.Version()) + `",revision="[0-9a-f]*(-dirty)?",version="v9\.8\.7-test"\} 1$`)
	if !line.Match(metrics) {
		t.Errorf("no rls_build_info{version=\"v9.8.7-test\"} 1 in /metrics:\n%s", grepLines(string(metrics), "rls_build_info"))
	}
	code, out, _ := runArgs("version")
	if code != 0 || !strings.HasPrefix(out, "rls (devel) (") {
		t.Errorf("rls version without a linked version: exit %d, %q", code, out)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCommandLineAgainstServer, against the real binary: flags after the descriptors; check and
// inspect print the same JSON style (snake_case, zeros kept, units as rules write them, durations
// in *_seconds numbers); an unknown domain is said on stderr with the exit status unchanged;
// inspect's URL is --http-url (RLS_HTTP_URL), RLS_ADDR (check's gRPC address) does not reach it,
// and the old --addr still works with a deprecation line.
func TestCommandLineAgainstServer(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: cliRules})
	cmd := func(env []string, args ...string) (int, string, string) {
		t.Helper()
		return binaryRun(t, env, args...)
	}

	// Flags before, between and after the descriptor; "--" ends the flags.
	code, out, errOut := cmd(nil, "check", "user=a", "--domain", "shop", "--addr", p.GRPCAddr)
	if code != 0 || errOut != "" {
		t.Fatalf("check user=a --domain shop: exit %d\n%s%s", code, out, errOut)
	}
	for i := 2; i <= 3; i++ {
		code, out, errOut = cmd(nil, "check", "--addr", p.GRPCAddr, "user=a", "--domain", "shop", "--hits", "1")
	}
	if code != 2 {
		t.Fatalf("third check: exit %d, want 2 (OVER_LIMIT)\n%s%s", code, out, errOut)
	}
	var check map[string]any
	if err := json.Unmarshal([]byte(out), &check); err != nil {
		t.Fatalf("check's output: %v\n%s", err, out)
	}
	status := check["statuses"].([]any)[0].(map[string]any)
	limit, _ := status["current_limit"].(map[string]any)
	if check["overall_code"] != "OVER_LIMIT" || status["code"] != "OVER_LIMIT" || status["limit_remaining"] != float64(0) ||
		limit["unit"] != "minute" || limit["requests_per_unit"] != float64(2) || limit["name"] != "per_user" {
		t.Errorf("check's JSON: want snake_case, limit_remaining 0 kept, unit minute:\n%s", out)
	}
	if reset, ok := status["duration_until_reset_seconds"].(float64); !ok || reset <= 0 || reset > 60 {
		t.Errorf("duration_until_reset_seconds: want a number of seconds in (0, 60]:\n%s", out)
	}
	for _, k := range []string{"response_headers_to_add", "request_headers_to_add"} {
		if _, ok := check[k].([]any); !ok {
			t.Errorf("check's JSON lacks %s as a list:\n%s", k, out)
		}
	}
	code, out, errOut = cmd(nil, "inspect", "--domain", "shop", "--", "user=a")
	if code != 1 || !strings.Contains(errOut, "localhost:8080") {
		t.Errorf("inspect with the default --http-url, nothing there: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = cmd([]string{"RLS_ADDR=" + p.GRPCAddr, "RLS_HTTP_URL=" + p.HTTPAddr}, "inspect", "user=a", "--domain", "shop")
	if code != 0 || errOut != "" {
		t.Fatalf("inspect with RLS_HTTP_URL (and check's RLS_ADDR set): exit %d\n%s%s", code, out, errOut)
	}
	var inspect struct {
		Descriptors []struct {
			Limits []map[string]any `json:"limits"`
		} `json:"descriptors"`
	}
	if err := json.Unmarshal([]byte(out), &inspect); err != nil || len(inspect.Descriptors) != 1 || len(inspect.Descriptors[0].Limits) != 1 {
		t.Fatalf("inspect's output: %v\n%s", err, out)
	}
	l := inspect.Descriptors[0].Limits[0]
	if l["unit"] != limit["unit"] || l["requests_per_unit"] != limit["requests_per_unit"] || l["remaining"] != float64(0) {
		t.Errorf("inspect and check disagree on the limit's style:\ninspect %v\ncheck %v", l, limit)
	}
	if _, ok := l["reset_after_seconds"].(float64); !ok {
		t.Errorf("inspect's reset_after_seconds is not a number: %v", l)
	}
	code, out, errOut = cmd(nil, "inspect", "--addr", p.HTTPAddr, "--domain", "shop", "user=a")
	if code != 0 || !strings.Contains(errOut, "--addr is deprecated") || !strings.Contains(errOut, "--http-url") {
		t.Errorf("inspect --addr: exit %d, want 0 and a deprecation line\n%s%s", code, out, errOut)
	}

	// An unknown domain: said on stderr, OK and exit 0 as Envoy sees it; a known domain whose
	// rules match nothing says nothing.
	code, out, errOut = cmd(nil, "check", "--addr", p.GRPCAddr, "--domain", "shpo", "user=a")
	if code != 0 || !strings.Contains(out, `"overall_code": "OK"`) || !strings.Contains(errOut, `domain "shpo" is in none of the server's rules`) {
		t.Errorf("check of an unknown domain: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	code, out, errOut = cmd(nil, "check", "--addr", p.GRPCAddr, "--domain", "shop", "nosuchkey=a")
	if code != 0 || errOut != "" || !strings.Contains(out, `"current_limit": null`) {
		t.Errorf("check of a known domain matching nothing: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
}

// TestHelpGrouped: rls --help lists serve's flags under the concerns, in order, each flag under
// its own and every flag once; every serve flag belongs to a concern.
func TestHelpGrouped(t *testing.T) {
	code, out, _ := runArgs("--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	at := -1
	var starts []int
	for _, g := range serveGroups {
		i := strings.Index(out, "\n"+g.title+":\n")
		if i < at {
			t.Fatalf("group %q missing or out of order:\n%s", g.title, out)
		}
		at = i
		starts = append(starts, i)
	}
	serve, _ := lookupCommand("serve")
	commandFlags(serve).VisitAll(func(f *flag.Flag) {
		if hidden(f) {
			return
		}
		g := serveGroup(f.Name)
		if g == "" {
			t.Errorf("--%s belongs to no group: add it to serveGroup", f.Name)
			return
		}
		line := "\n  --" + f.Name + " ("
		i := strings.Index(out, line)
		if i < 0 || strings.Count(out, line) != 1 {
			t.Errorf("--%s not listed once", f.Name)
			return
		}
		for k, grp := range serveGroups {
			end := len(out)
			if k+1 < len(starts) {
				end = starts[k+1]
			}
			if grp.name == g && (i < starts[k] || i > end) {
				t.Errorf("--%s not under %q", f.Name, grp.title)
			}
		}
	})
}

// TestHelpListsOnlyTheCommandsFlags: rls help inspect lists none of reset's flags; rls help
// reset lists the admin token's; neither lists the deprecated --addr.
func TestHelpListsOnlyTheCommandsFlags(t *testing.T) {
	_, inspect, _ := runArgs("help", "inspect")
	_, reset, _ := runArgs("help", "reset")
	if strings.Contains(inspect, "--admin-token-file") {
		t.Errorf("rls help inspect lists reset's --admin-token-file:\n%s", inspect)
	}
	if !strings.Contains(reset, "--admin-token-file (RLS_ADMIN_TOKEN_FILE)") {
		t.Errorf("rls help reset lacks --admin-token-file:\n%s", reset)
	}
	for _, out := range []string{inspect, reset} {
		if strings.Contains(out, "  --addr ") || !strings.Contains(out, "  --http-url (RLS_HTTP_URL) string") {
			t.Errorf("want --http-url and not --addr:\n%s", out)
		}
	}
}

// TestValidateFlagsAfterPath: rls validate takes its flags after the path too, and they apply
// (--merge-domains was once copied before the flags were parsed, and ignored).
func TestValidateFlagsAfterPath(t *testing.T) {
	dir := t.TempDir()
	for name, key := range map[string]string{"a.yaml": "user", "b.yaml": "account"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.Replace(cliRules, "user", key, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if code, _, errOut := runArgs("validate", dir); code != 1 || !strings.Contains(errOut, "shop") {
		t.Fatalf("two files of one domain without --merge-domains: exit %d, %s", code, errOut)
	}
	for _, args := range [][]string{{"validate", dir, "--merge-domains"}, {"validate", "--merge-domains", dir}} {
		if code, out, errOut := runArgs(args...); code != 0 || !strings.Contains(out, "ok: 1 domain(s) from 2 file(s)") {
			t.Errorf("rls %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}
}

// TestCommandsDocJSON: docs/commands.md's example of check's output is what check prints: it
// decodes into check's output with no field unknown, and prints back the same.
func TestCommandsDocJSON(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "commands.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n```json\n")
	if i < 0 {
		t.Fatal("docs/commands.md has no json example")
	}
	doc = doc[i+len("\n```json\n"):]
	doc = doc[:strings.Index(doc, "```")]
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.DisallowUnknownFields()
	var out checkOutput
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("docs/commands.md's example is not check's output: %v", err)
	}
	var again strings.Builder
	if err := writeJSON(&again, out); err != nil {
		t.Fatal(err)
	}
	if again.String() != doc {
		t.Errorf("docs/commands.md's example is not as check prints it:\n%s\nwant\n%s", doc, again.String())
	}
}
