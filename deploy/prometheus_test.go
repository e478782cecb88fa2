package deploy_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The alert rules, their promtool unit tests and their runbook, under deploy/.
const (
	alertRulesFile = "prometheus/rls-alerts.yaml"
	alertTestsFile = "prometheus/rls-alerts.test.yaml"
	runbookFile    = "prometheus/README.md"
	runbookURL     = "https://github.com/rls-project/rls/blob/main/deploy/prometheus/README.md"
)

// promtool is the path of Debian's promtool, failing the test with how to install it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: run the tests with scripts/test, which installs it " +
			"(Debian: apt-get install -y prometheus)")
	}
	return p
}

// runPromtool runs promtool with args in dir and fails the test with its output when it fails.
func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestAlertRulesPromtool: promtool accepts the rule file and its unit tests pass.
func TestAlertRulesPromtool(t *testing.T) {
	out := runPromtool(t, ".", "check", "rules", alertRulesFile)
	if n := len(alertRules(t)); !strings.Contains(out, fmt.Sprintf("SUCCESS: %d rules found", n)) {
		t.Errorf("promtool check rules: want %d rules found:\n%s", n, out)
	}
	if out := runPromtool(t, "prometheus", "test", "rules", filepath.Base(alertTestsFile)); !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules:\n%s", out)
	}
}

// alertRule is one rule of the rule file.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("%s: %v", alertRulesFile, err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

// runbookSections returns the runbook's level-2 sections by their GitHub anchor.
func runbookSections(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	parts := regexp.MustCompile(`(?m)^## `).Split(string(b), -1)
	for _, p := range parts[1:] {
		title, body, _ := strings.Cut(p, "\n")
		sections[githubAnchor(title)] = body
	}
	return sections
}

// githubAnchor is the fragment GitHub gives a heading: lower case, punctuation dropped, spaces
// as hyphens.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestAlertRulesDocumented: every alert has a severity, a summary, a description and a
// runbook_url naming its section of the runbook, which says what it means, what to check and
// what to do; and every alert a section names exists.
func TestAlertRulesDocumented(t *testing.T) {
	rules := alertRules(t)
	sections := runbookSections(t)
	named := map[string]bool{}
	for _, r := range rules {
		if r.Alert == "" {
			continue // a recording rule
		}
		named[strings.ToLower(r.Alert)] = true
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", r.Alert, a)
			}
		}
		if want := runbookURL + "#" + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		body, ok := sections[strings.ToLower(r.Alert)]
		if !ok {
			t.Errorf("%s: no section \"## %s\" in %s", r.Alert, r.Alert, runbookFile)
			continue
		}
		for _, part := range []string{"**Means.**", "**Check.**", "**Do.**"} {
			if !strings.Contains(body, part) {
				t.Errorf("%s: its runbook section has no %s", r.Alert, part)
			}
		}
	}
	for anchor := range sections {
		if !named[anchor] {
			t.Errorf("%s: section #%s names no alert of %s", runbookFile, anchor, alertRulesFile)
		}
	}
}

// TestAlertRulesUnitTested: the promtool unit tests make every alert fire at some time and not
// fire at another, and name no alert the rule file lacks.
func TestAlertRulesUnitTested(t *testing.T) {
	b, err := os.ReadFile(alertTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", alertTestsFile, err)
	}
	if !slices.Equal(f.RuleFiles, []string{filepath.Base(alertRulesFile)}) {
		t.Errorf("%s: rule_files %q, want %q", alertTestsFile, f.RuleFiles, filepath.Base(alertRulesFile))
	}
	fires, quiet := map[string]int{}, map[string]int{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	alerts := map[string]bool{}
	for _, r := range alertRules(t) {
		if r.Alert == "" {
			continue
		}
		alerts[r.Alert] = true
		if fires[r.Alert] == 0 || quiet[r.Alert] == 0 {
			t.Errorf("%s: %d unit tests where it fires and %d where it does not; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
		}
	}
	for name := range fires {
		if !alerts[name] {
			t.Errorf("%s tests alert %s, which %s does not have", alertTestsFile, name, alertRulesFile)
		}
	}
	for name := range quiet {
		if !alerts[name] {
			t.Errorf("%s tests alert %s, which %s does not have", alertTestsFile, name, alertRulesFile)
		}
	}
}
