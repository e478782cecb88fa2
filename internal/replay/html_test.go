package replay_test

import (
	"bytes"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/replay"
)

// compareReport replays five minutes of traffic of four users against a rule set and a stricter
// one, and returns the report.
func compareReport(t testing.TB) *replay.Report {
	t.Helper()
	parse := func(rate int) *descriptors.RuleSet {
		rs, err := descriptors.Parse(map[string][]byte{"r.yaml": []byte(fmt.Sprintf(`
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: path
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 30}
`, rate))})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	run := &replay.Run{Sets: []*replay.Engine{replay.NewEngine(parse(20), replay.Options{}), replay.NewEngine(parse(10), replay.Options{})},
		Names: []string{"rules.yaml", "stricter.yaml"}}
	start := time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC).UnixMicro()
	for i := range 3000 {
		req := replay.Request{Time: start + int64(i)*100_000, Domain: "shop", Descs: []replay.Desc{
			{Entries: []descriptors.Entry{{Key: "user", Value: fmt.Sprint("u", i%4)}}, Hits: 1},
			{Entries: []descriptors.Entry{{Key: "path", Value: "/a"}}, Hits: 1},
		}}
		if i%4 == 0 && i > 1500 { // u0 twice as busy in the second half
			req.Count = 2
		}
		if err := run.Decide(&req); err != nil {
			t.Fatal(err)
		}
	}
	return run.Report()
}

// TestHTMLReportInChromium loads the HTML report in headless Chromium, once: the page it renders
// has a chart per rule and rule set with admitted and denied bars, the top denied keys' rows, no
// console message, and the screenshot shows both colours of the bars. The page loads nothing.
func TestHTMLReportInChromium(t *testing.T) {
	t.Parallel()
	rep := compareReport(t)
	var page bytes.Buffer
	if err := rep.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`src=`, `href=`, `url\(`, `@import`, `<script`, `<link`} {
		if regexp.MustCompile(re).Match(page.Bytes()) {
			t.Errorf("the report has %s: it must load nothing", re)
		}
	}
	dir := t.TempDir()
	file, shot := filepath.Join(dir, "report.html"), filepath.Join(dir, "shot.png")
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(chromium(t), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
		"--no-first-run", "--disable-extensions", "--disable-background-networking", "--disable-sync", "--disable-component-update",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--window-size=1400,1400", "--hide-scrollbars",
		"--screenshot="+shot, "--dump-dom", "file://"+file)
	var dom, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &dom, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), ":CONSOLE") {
		t.Errorf("console messages:\n%s", stderr.String())
	}
	d := dom.String()
	// Two rules, each under two rule sets; 60 buckets of five seconds each.
	if n := strings.Count(d, `<svg class="series"`); n != 4 {
		t.Errorf("%d charts in the DOM, want 4", n)
	}
	if n := strings.Count(d, `<rect class="denied"`); n != 4*60 {
		t.Errorf("%d denied bars, want 240", n)
	}
	// Top denied keys: four users under each set of the user rule, one path under each set.
	if n := strings.Count(d, "<tr><td>user=u"); n != 8 {
		t.Errorf("%d rows of denied users, want 8", n)
	}
	if !strings.Contains(d, "<tr><td>user=u0</td>") || !strings.Contains(d, "newly denied") {
		t.Errorf("the busiest user or the comparison is missing from the DOM")
	}

	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	near := func(r, g, b uint32, want [3]uint32) bool {
		d := func(a, b uint32) uint32 { return max(a, b) - min(a, b) }
		return d(r>>8, want[0]) <= 4 && d(g>>8, want[1]) <= 4 && d(b>>8, want[2]) <= 4
	}
	var green, red int
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			switch {
			case near(r, g, b, [3]uint32{0x2e, 0x7d, 0x32}):
				green++
			case near(r, g, b, [3]uint32{0xc6, 0x28, 0x28}):
				red++
			}
		}
	}
	// A chart is 600×140 pixels of bars at most: both colours must fill a good part of those
	// in view.
	if green < 5000 || red < 5000 {
		t.Errorf("the screenshot has %d admitted and %d denied pixels: the charts are not drawn", green, red)
	}
}

// TestReportTableAndCSV: the table and the CSV say the same counts as the report.
func TestReportTableAndCSV(t *testing.T) {
	t.Parallel()
	rep := compareReport(t)
	var tab, csv bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteCSV(&csv); err != nil {
		t.Fatal(err)
	}
	u := rep.Rules[1]
	if u.Rule != "user" || u.Denied[1] <= u.Denied[0] || u.NewlyDenied == 0 {
		t.Fatalf("the stricter rule set denies no more: %+v", u)
	}
	for _, want := range []string{
		"stricter.yaml instead of rules.yaml: ",
		fmt.Sprintf("shop    user  %d", u.Requests[0]),
	} {
		if !strings.Contains(tab.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, tab.String())
		}
	}
	for _, want := range []string{
		"domain,rule,rule_set,key,requests,denied,newly_denied,newly_admitted,denied_over\n",
		fmt.Sprintf("shop,user,stricter.yaml,,%d,%d,%d,%d,\n", u.Requests[1], u.Denied[1], u.NewlyDenied, u.NewlyAdmitted),
		fmt.Sprintf("shop,user,rules.yaml,%s,,%d,,,0\n", u.Top[0][0].Key, u.Top[0][0].Denied),
	} {
		if !strings.Contains(csv.String(), want) {
			t.Errorf("the CSV has no %q:\n%s", want, csv.String())
		}
	}
	if u.Top[0][0].Key != "user=u0" {
		t.Errorf("the most denied user is %s, want the busiest, u0", u.Top[0][0].Key)
	}
}
