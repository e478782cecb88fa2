package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
)

// The files under test, from the repository root.
const (
	dashboardFile = "deploy/grafana/rls-dashboard.json"
	alertsFile    = "deploy/prometheus/rls-alerts.yaml"
)

// promJob is the scrape job's name: the dashboard's job variable finds it, and the alerts on
// targets select it.
const promJob = "rls"

// promRateInterval stands for Grafana's $__rate_interval: four scrape intervals.
const promRateInterval = "4s"

const promRules = `domain: dash
descriptors:
  - key: api_key
    value: shared
    rate_limit: {name: shared, unit: second, requests_per_unit: 1000, burst: 200}
  - key: api_key
    rate_limit: {name: per_key, unit: minute, requests_per_unit: 3}
  - key: path
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
  - key: model
    concurrency: {max_in_flight: 1, slot_lifetime: 1m}
`

// TestDashboardAndAlertsOnPrometheus runs a real Prometheus scraping three real rls processes
// (the memory backend with RLQS, a single Redis with RLQS, a Redis Cluster) under a short load
// that goes over limits, evicts from the memory backend, reloads a bad and a good rule set,
// opens RLQS streams, and stops the single Redis so that the failure mode answers. Then every
// query of the Grafana dashboard (its variables substituted with what their own queries find)
// and every alert expression, stripped of its comparison, and every selector in it, must
// return series through Prometheus's HTTP API, and none may name a metric, or a label of one,
// that the rls processes' /metrics do not export. The alert rules load in that Prometheus and
// evaluate without error, and the alerts the load causes are seen pending or firing.
func TestDashboardAndAlertsOnPrometheus(t *testing.T) {
	promBin := prometheusBinary(t)
	root := repoRoot()
	dash := readDashboard(t, filepath.Join(root, dashboardFile))
	alerts := readAlertRules(t, filepath.Join(root, alertsFile))

	memRules := writeRules(t, map[string]string{"dash.yaml": promRules})
	redisRules := writeRules(t, map[string]string{"dash.yaml": promRules})
	redisServer := redistest.Start(t)
	prefix := fmt.Sprintf("prom-%d:", time.Now().UnixNano())
	mem := startRLS(t, nil, "--config", memRules, "--rlqs", "--rlqs-domains", "dash", "--memory-max-keys", "20",
		"--grpc-max-calls", "64", "--reload-debounce", "50ms")
	single := startRLS(t, nil, "--config", redisRules, "--rlqs", "--backend", "redis", "--redis-url", redisServer.URL(),
		"--redis-key-prefix", prefix, "--failure-mode", "allow")
	cluster := startRLS(t, nil, "--config", redisRules, "--backend", "redis",
		"--redis-url", redistest.URL(t, redistest.ClusterEnv), "--redis-key-prefix", prefix)
	// One region of limits across regions, its domain global, with a coordination store.
	regional := startRLS(t, nil, "--config", redisRules, "--backend", "redis", "--redis-url", redistest.Start(t).URL(),
		"--region", "eu", "--global-url", redistest.Start(t).URL(), "--global-domains", "dash", "--global-regions", "1",
		"--global-interval", "200ms")
	procs := []*rlsProc{mem, single, cluster, regional}

	prom := startPrometheus(t, promBin, filepath.Join(root, alertsFile), mem.HTTPAddr, single.HTTPAddr, cluster.HTTPAddr,
		regional.HTTPAddr)
	// Scraped once before the load, so that what the load counts is an increase: a counter's
	// first sample is where it starts.
	prom.await(t, `rls_config_generation{job="rls"}`, len(procs))

	// The load. Every call is answered; what it is answered with is checked elsewhere.
	ctx := ctxT(t)
	call := func(p *rlsProc, ds ...*ratelimitv3.RateLimitDescriptor) {
		t.Helper()
		if _, err := p.client(t).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "dash", Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range procs {
		for range 6 { // per_key allows 3 a minute: ok, near_limit, then over_limit
			call(p, d("api_key", "k1"), d("path", "/a"), d("window", "w"))
		}
		call(p, d("api_key", "shared"))
		call(p, d("model", "m", "rls_slot", "s1")) // a slot acquired, then one refused
		call(p, d("model", "m", "rls_slot", "s2"))
	}
	for i := range 40 { // twice --memory-max-keys: the memory backend evicts
		call(mem, d("api_key", fmt.Sprintf("many-%d", i)))
	}
	promRLQS(t, ctx, mem, single)

	// A bad rule set, seen by Prometheus as a failed last load, then a good one.
	writeFile(t, filepath.Join(memRules, "dash.yaml"), strings.Replace(promRules, "unit: hour", "unit: eon", 1))
	awaitMetric(t, mem, `rls_config_last_load_successful`, "0")
	prom.awaitAlert(t, "RLSRuleReloadFailing", mem.HTTPAddr, "pending", "firing")
	writeFile(t, filepath.Join(memRules, "dash.yaml"), strings.Replace(promRules, "requests_per_unit: 3}", "requests_per_unit: 4}", 1))
	awaitMetric(t, mem, `rls_config_generation`, "2")
	awaitMetric(t, mem, `rls_config_last_load_successful`, "1")

	// Redis gone: once 5 calls have failed the breaker opens and the failure mode answers.
	redisServer.Kill()
	deadline := time.Now().Add(30 * time.Second)
	for metricValues(t, single.HTTPAddr)["rls_backend_up"] != "0" {
		if time.Now().After(deadline) {
			t.Fatalf("rls_backend_up of the rls on the stopped Redis is not 0 after 30s\n%s", single.Output())
		}
		call(single, d("api_key", "k2"))
	}
	call(single, d("api_key", "k3"))
	prom.awaitAlert(t, "RLSBackendDown", single.HTTPAddr, "pending", "firing")
	prom.awaitAlert(t, "RLSFailureModeAnswers", single.HTTPAddr, "pending", "firing")
	prom.awaitAlert(t, "RLSMemoryEvicting", mem.HTTPAddr, "firing")

	exported := exportedMetrics(t, procs)
	if len(exported) < 20 {
		t.Fatalf("only %d metric names scraped from rls", len(exported))
	}
	checkMetricsDocumented(t, exported)
	vars := dashboardVariables(t, prom, dash, exported)

	var queries []promCheck
	for _, p := range dashboardPanels(dash.Panels) {
		for _, tg := range p.Targets {
			queries = append(queries, promCheck{where: fmt.Sprintf("panel %q, query %s", p.Title, tg.RefID), expr: vars.Replace(tg.Expr)})
		}
	}
	if len(queries) < 30 {
		t.Fatalf("only %d dashboard queries in %s", len(queries), dashboardFile)
	}
	for _, r := range alerts {
		expr, err := promParse(r.Expr)
		if err != nil {
			t.Errorf("alert %s: %v", r.Alert, err)
			continue
		}
		stripped, ok := stripComparison(expr)
		if !ok {
			t.Errorf("alert %s: %q is not `expression comparison number`, so what it returns says nothing", r.Alert, r.Expr)
			continue
		}
		queries = append(queries, promCheck{where: fmt.Sprintf("alert %s, stripped of its comparison", r.Alert), expr: stripped.String()})
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				queries = append(queries, promCheck{where: fmt.Sprintf("alert %s, selector", r.Alert), expr: vs.String()})
			}
			return nil
		})
	}

	// Every query names only what rls exports, and returns series once Prometheus has
	// scraped the load: polled, since series appear a scrape or two after their first sample.
	for _, q := range queries {
		for _, err := range checkNames(q.expr, exported) {
			t.Errorf("%s: %s: %v", q.where, q.expr, err)
		}
	}
	pending := slices.Clone(queries)
	deadline = time.Now().Add(45 * time.Second)
	for len(pending) > 0 {
		var still []promCheck
		for _, q := range pending {
			n, err := prom.count(q.expr)
			if err != nil {
				t.Errorf("%s: %s: %v", q.where, q.expr, err)
				continue
			}
			if n == 0 {
				still = append(still, q)
			}
		}
		pending = still
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, q := range pending {
		t.Errorf("%s: no series after 45s: %s", q.where, q.expr)
	}
	t.Logf("%d dashboard and alert queries returned series; %d metric names exported", len(queries)-len(pending), len(exported))

	prom.checkRulesHealthy(t, len(alerts))
}

// prometheusBinary is the path of Debian's prometheus, failing the test with how to install it.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus is not installed: run the tests with scripts/test, which installs it " +
			"(Debian: apt-get install -y prometheus, which also gives promtool)")
	}
	return p
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// awaitMetric polls p's /metrics until the sample named key has value want.
func awaitMetric(t *testing.T, p *rlsProc, key, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := metricValues(t, p.HTTPAddr)[key]
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is %q after 30s, want %q\n%s", key, got, want, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// promRLQS opens RLQS streams to each of ps that report a bucket of the "shared" rule every
// 200 ms until the test ends, and on the first of ps, a stream with a malformed report and one
// for a domain it does not serve.
func promRLQS(t *testing.T, ctx context.Context, ps ...*rlsProc) {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, p := range ps {
		s, err := rlqsClient(t, p.GRPCAddr).StreamRateLimitQuotas(sctx)
		if err != nil {
			t.Fatal(err)
		}
		report := &rlqspb.RateLimitQuotaUsageReports{Domain: "dash", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"api_key": "shared"}, 40, 2, 200*time.Millisecond)}}
		if err := s.Send(report); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatalf("RLQS on %s: %v", p.GRPCAddr, err)
		}
		wg.Add(2)
		go func() { // answers are read so that the stream never stalls
			defer wg.Done()
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-sctx.Done():
					return
				case <-tick.C:
					if s.Send(report) != nil {
						return
					}
				}
			}
		}()
	}
	end := func(domain string, want codes.Code) {
		t.Helper()
		s, err := rlqsClient(t, ps[0].GRPCAddr).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"api_key": "shared"}, 1, 0, time.Second)}})
		for err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != want {
			t.Fatalf("RLQS stream for domain %q: %v, want %v", domain, err, want)
		}
	}
	end("", codes.InvalidArgument)       // rls_rlqs_reports_rejected_total
	end("other", codes.PermissionDenied) // rls_rlqs_refused_total
}

// exportedMetrics scrapes every process's /metrics and returns each sample name (a histogram's
// _bucket, _sum and _count) with the label names it carries anywhere.
func exportedMetrics(t *testing.T, ps []*rlsProc) map[string]map[string]bool {
	t.Helper()
	names := map[string]map[string]bool{}
	add := func(name string, labels ...string) {
		if names[name] == nil {
			names[name] = map[string]bool{}
		}
		for _, l := range labels {
			names[name][l] = true
		}
	}
	for _, p := range ps {
		resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("/metrics of %s: %v", p.HTTPAddr, err)
		}
		for name, f := range fams {
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName())
				}
				switch {
				case m.GetHistogram() != nil:
					add(name+"_bucket", append(labels, "le")...)
					add(name+"_sum", labels...)
					add(name+"_count", labels...)
				case m.GetSummary() != nil:
					add(name, append(labels, "quantile")...)
					add(name+"_sum", labels...)
					add(name+"_count", labels...)
				default:
					add(name, labels...)
				}
			}
		}
	}
	return names
}

// targetLabels are the labels Prometheus adds to every series it scrapes.
var targetLabels = []string{"job", "instance"}

// prometheusSeries are the series Prometheus makes of a scrape itself, which rls does not
// export: only up, which the alerts on targets read.
var prometheusSeries = map[string][]string{"up": nil}

// checkNames parses expr and returns an error for each metric it names that is not in exported
// (nor one of prometheusSeries), and each label it matches, groups or joins on that the
// metrics it reads do not carry (beside targetLabels).
func checkNames(expr string, exported map[string]map[string]bool) []error {
	e, err := promParse(expr)
	if err != nil {
		return []error{err}
	}
	var errs []error
	labelsOf := func(name string) (map[string]bool, bool) {
		if l, ok := exported[name]; ok {
			return l, true
		}
		l, ok := prometheusSeries[name]
		m := map[string]bool{}
		for _, n := range l {
			m[n] = true
		}
		return m, ok
	}
	// read returns the label names the selectors under n can carry.
	read := func(n parser.Node) map[string]bool {
		all := map[string]bool{}
		for _, l := range targetLabels {
			all[l] = true
		}
		parser.Inspect(n, func(c parser.Node, _ []parser.Node) error {
			if vs, ok := c.(*parser.VectorSelector); ok {
				ls, _ := labelsOf(vs.Name)
				for l := range ls {
					all[l] = true
				}
			}
			return nil
		})
		return all
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == "" {
				errs = append(errs, fmt.Errorf("selector %s names no metric", n))
				return nil
			}
			ls, ok := labelsOf(n.Name)
			if !ok {
				errs = append(errs, fmt.Errorf("metric %s is not exported by rls", n.Name))
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != model.MetricNameLabel && !ls[m.Name] && !slices.Contains(targetLabels, m.Name) {
					errs = append(errs, fmt.Errorf("metric %s has no label %s", n.Name, m.Name))
				}
			}
		case *parser.AggregateExpr:
			have := read(n.Expr)
			for _, l := range n.Grouping {
				if !have[l] {
					errs = append(errs, fmt.Errorf("%s groups by %s, which what it aggregates does not carry", n.Op, l))
				}
			}
		case *parser.BinaryExpr:
			if n.VectorMatching == nil {
				return nil
			}
			have := read(n)
			for _, l := range append(slices.Clone(n.VectorMatching.MatchingLabels), n.VectorMatching.Include...) {
				if !have[l] {
					errs = append(errs, fmt.Errorf("%s matches on %s, which neither side carries", n.Op, l))
				}
			}
		}
		return nil
	})
	return errs
}

func promParse(expr string) (parser.Expr, error) {
	return parser.NewParser(parser.Options{}).ParseExpr(expr)
}

// stripComparison returns the side of a top-level `expression comparison number` that is not
// the number.
func stripComparison(e parser.Expr) (parser.Expr, bool) {
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			break
		}
		e = p.Expr
	}
	b, ok := e.(*parser.BinaryExpr)
	if !ok || !b.Op.IsComparisonOperator() || b.ReturnBool {
		return nil, false
	}
	if _, ok := b.RHS.(*parser.NumberLiteral); ok {
		return b.LHS, true
	}
	if _, ok := b.LHS.(*parser.NumberLiteral); ok {
		return b.RHS, true
	}
	return nil, false
}

// promCheck is one query to evaluate, and where it comes from.
type promCheck struct{ where, expr string }

// grafanaDashboard is what the test reads of the dashboard JSON.
type grafanaDashboard struct {
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type grafanaPanel struct {
	Title   string         `json:"title"`
	Type    string         `json:"type"`
	Panels  []grafanaPanel `json:"panels"` // a collapsed row's
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func readDashboard(t *testing.T, path string) grafanaDashboard {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d grafanaDashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d
}

// dashboardPanels flattens rows into the panels that have queries.
func dashboardPanels(ps []grafanaPanel) []grafanaPanel {
	var out []grafanaPanel
	for _, p := range ps {
		out = append(out, dashboardPanels(p.Panels)...)
		if len(p.Targets) > 0 {
			out = append(out, p)
		}
	}
	return out
}

var labelValuesQuery = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// dashboardVariables evaluates the dashboard's query variables in order, as Grafana does, and
// returns a replacer of each by the values it found, multi-valued ones as a regexp alternation
// (Grafana's "All"); $__rate_interval becomes promRateInterval. A variable whose query finds
// nothing, or names what rls does not export, fails the test.
func dashboardVariables(t *testing.T, prom *prometheusProc, d grafanaDashboard, exported map[string]map[string]bool) *strings.Replacer {
	t.Helper()
	pairs := []string{"$__rate_interval", promRateInterval}
	var seen []string
	for _, v := range d.Templating.List {
		switch v.Type {
		case "datasource":
			continue
		case "query":
		default:
			t.Fatalf("variable %s: type %q, which this test does not evaluate", v.Name, v.Type)
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
		}
		m := labelValuesQuery.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		sel := strings.NewReplacer(pairs...).Replace(m[1])
		label := m[2]
		for _, err := range checkNames(fmt.Sprintf("count by (%s) (%s)", label, sel), exported) {
			t.Errorf("variable %s: %v", v.Name, err)
		}
		values := prom.labelValues(t, sel, label)
		if len(values) == 0 {
			t.Fatalf("variable %s: %s finds no %s", v.Name, sel, label)
		}
		if v.Name == "job" && !slices.Contains(values, promJob) {
			t.Fatalf("variable job: %v, want %q among them", values, promJob)
		}
		var alt []string
		for _, val := range values {
			alt = append(alt, strings.ReplaceAll(regexp.QuoteMeta(val), `\`, `\\`))
		}
		value := "(" + strings.Join(alt, "|") + ")"
		if v.Name == "job" {
			value = promJob
		}
		pairs = append(pairs, "${"+v.Name+"}", value, "$"+v.Name, value)
		seen = append(seen, v.Name)
	}
	for _, want := range []string{"job", "instance"} {
		if !slices.Contains(seen, want) {
			t.Fatalf("the dashboard has no %s variable", want)
		}
	}
	return strings.NewReplacer(pairs...)
}

// alertRule is what the test reads of a rule in the rule file.
type alertRule struct {
	Alert  string `yaml:"alert"`
	Record string `yaml:"record"`
	Expr   string `yaml:"expr"`
}

// readAlertRules returns every rule of the file's groups, alerts and recording rules alike,
// with the recording rules named in Alert.
func readAlertRules(t *testing.T, path string) []alertRule {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var rules []alertRule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				r.Alert = "record " + r.Record
			}
			rules = append(rules, r)
		}
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules", path)
	}
	return rules
}

// prometheusProc is a running Prometheus.
type prometheusProc struct {
	addr string
	out  *rlstest.Buffer
}

// listeningOn is Prometheus's log line naming the address it bound.
var listeningOn = regexp.MustCompile(`msg="Listening on" address=(127\.0\.0\.1:[0-9]+)`)

// startPrometheus runs Prometheus on a loopback port the kernel picks, scraping targets every
// second as job promJob and evaluating ruleFile every second, and stops it when the test ends.
func startPrometheus(t *testing.T, bin, ruleFile string, targets ...string) *prometheusProc {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{ruleFile},
		"scrape_configs": []any{map[string]any{
			"job_name":       promJob,
			"static_configs": []any{map[string]any{"targets": targets}},
		}},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	writeFile(t, cfgPath, string(b))
	p := &prometheusProc{out: &rlstest.Buffer{}}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:0", "--log.level=info")
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-done:
			t.Fatalf("prometheus exited early:\n%s", p.out.String())
		default:
		}
		if m := listeningOn.FindStringSubmatch(p.out.String()); m != nil && p.addr == "" {
			p.addr = m[1]
		}
		if p.addr != "" {
			if resp, err := http.Get("http://" + p.addr + "/-/ready"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s:\n%s", p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// api GETs path with query q from Prometheus's HTTP API and decodes its data into v.
func (p *prometheusProc) api(path string, q url.Values, v any) error {
	resp, err := http.Get("http://" + p.addr + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("%s: %s: %v", path, body, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s: %s", path, r.Error)
	}
	return json.Unmarshal(r.Data, v)
}

// count evaluates expr now and returns how many series it returns.
func (p *prometheusProc) count(expr string) (int, error) {
	var data struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return 0, err
	}
	if data.ResultType != "vector" {
		return 0, fmt.Errorf("a %s, not an instant vector", data.ResultType)
	}
	return len(data.Result), nil
}

// await polls until expr returns n series.
func (p *prometheusProc) await(t *testing.T, expr string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := p.count(expr)
		if err != nil {
			t.Fatalf("%s: %v", expr, err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d series after 30s, want %d", expr, got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// labelValues is what Grafana's label_values(sel, label) finds: the values of label on the
// series sel selects, polled until there are some.
func (p *prometheusProc) labelValues(t *testing.T, sel, label string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var series []map[string]string
		if err := p.api("/api/v1/series", url.Values{"match[]": {sel}, "start": {fmt.Sprint(time.Now().Add(-time.Hour).Unix())}}, &series); err != nil {
			t.Fatalf("label_values(%s, %s): %v", sel, label, err)
		}
		set := map[string]bool{}
		for _, s := range series {
			if v := s[label]; v != "" {
				set[v] = true
			}
		}
		if len(set) > 0 || time.Now().After(deadline) {
			values := make([]string, 0, len(set))
			for v := range set {
				values = append(values, v)
			}
			sort.Strings(values)
			return values
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// promAlert is one alert as /api/v1/alerts lists it.
type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// awaitAlert polls /api/v1/alerts until alert name is in one of states for instance.
func (p *prometheusProc) awaitAlert(t *testing.T, name, instance string, states ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last []promAlert
	for {
		var data struct {
			Alerts []promAlert `json:"alerts"`
		}
		if err := p.api("/api/v1/alerts", nil, &data); err != nil {
			t.Fatal(err)
		}
		for _, a := range data.Alerts {
			if a.Labels["alertname"] == name && a.Labels["instance"] == instance && slices.Contains(states, a.State) {
				return
			}
		}
		last = data.Alerts
		if time.Now().After(deadline) {
			t.Fatalf("alert %s for %s not %v after 30s; alerts: %v", name, instance, states, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkRulesHealthy waits until every one of the want rules Prometheus loaded has been
// evaluated, and fails the test for each that did not evaluate cleanly.
func (p *prometheusProc) checkRulesHealthy(t *testing.T, want int) {
	t.Helper()
	type rule struct {
		Name           string `json:"name"`
		Health         string `json:"health"`
		LastError      string `json:"lastError"`
		LastEvaluation string `json:"lastEvaluation"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var data struct {
			Groups []struct {
				Rules []rule `json:"rules"`
			} `json:"groups"`
		}
		if err := p.api("/api/v1/rules", nil, &data); err != nil {
			t.Fatal(err)
		}
		var rules []rule
		for _, g := range data.Groups {
			rules = append(rules, g.Rules...)
		}
		evaluated := 0
		for _, r := range rules {
			if !strings.HasPrefix(r.LastEvaluation, "0001-") {
				evaluated++
			}
		}
		if len(rules) == want && evaluated == want {
			for _, r := range rules {
				if r.Health != "ok" || r.LastError != "" {
					t.Errorf("rule %s in Prometheus: health %q, error %q", r.Name, r.Health, r.LastError)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			var b bytes.Buffer
			for _, r := range rules {
				fmt.Fprintf(&b, "  %s: %s %s\n", r.Name, r.Health, r.LastEvaluation)
			}
			t.Fatalf("Prometheus has %d rules, %d evaluated, after 30s; want %d:\n%s%s", len(rules), evaluated, want, b.String(), p.out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkMetricsDocumented fails for each rls_* metric family rls exports that no page of docs/
// names: the metrics tables are what an operator reads.
func checkMetricsDocumented(t *testing.T, exported map[string]map[string]bool) {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot(), "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	var docs strings.Builder
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	for name := range exported {
		if !strings.HasPrefix(name, "rls_") {
			continue
		}
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if f, ok := strings.CutSuffix(name, suffix); ok && exported[f+"_bucket"] != nil {
				family = f
			}
		}
		if !strings.Contains(docs.String(), "`"+family+"`") && !strings.Contains(docs.String(), "`"+family+"{") {
			t.Errorf("metric %s is exported but no page of docs/ names it (as `name` or `name{labels}`)", family)
		}
	}
}
