package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
)

// statsdExporterVersion is the statsd_exporter the tests run, built from its Go module: the
// release envoyproxy/ratelimit itself builds with. Later ones (v0.31.0 among them) refuse its
// default mapper's timer_type.
const statsdExporterVersion = "v0.26.1"

var statsdExporter struct {
	once sync.Once
	path string
	err  error
}

// statsdExporterBinary is Prometheus's statsd_exporter: $RLS_TEST_STATSD_EXPORTER (scripts/test
// builds it there), else built here once per test process with go install.
func statsdExporterBinary(t *testing.T) string {
	t.Helper()
	if script, err := os.ReadFile(filepath.Join(repoRoot(), "scripts", "test")); err != nil || !strings.Contains(string(script), "statsd_exporter@"+statsdExporterVersion+"\n") {
		t.Errorf("scripts/test does not install statsd_exporter@%s, the version this test builds (%v)", statsdExporterVersion, err)
	}
	if p := os.Getenv("RLS_TEST_STATSD_EXPORTER"); p != "" {
		return p
	}
	statsdExporter.once.Do(func() {
		dir, err := os.MkdirTemp("", "rlstest-statsd-exporter-")
		if err != nil {
			statsdExporter.err = err
			return
		}
		cmd := exec.Command("go", "install", "github.com/prometheus/statsd_exporter@"+statsdExporterVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			statsdExporter.err = fmt.Errorf("go install statsd_exporter: %v\n%s", err, out)
			return
		}
		statsdExporter.path = filepath.Join(dir, "statsd_exporter")
	})
	if statsdExporter.err != nil {
		t.Fatal(statsdExporter.err)
	}
	return statsdExporter.path
}

// freeUDPPort returns a loopback UDP port free when it returns.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// freeTCPAddr returns a loopback TCP address free when it returns.
func freeTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startStatsdExporter runs statsd_exporter with envoyproxy/ratelimit's default mapper, listening
// for statsd on UDP only; it returns the UDP port and the address of its /metrics.
func startStatsdExporter(t *testing.T) (udpPort int, web string) {
	t.Helper()
	bin := statsdExporterBinary(t)
	for range 3 {
		udpPort, web = freeUDPPort(t), freeTCPAddr(t)
		cmd := exec.Command(bin, "--statsd.mapping-config="+filepath.Join(repoRoot(), "integration", "testdata", "ratelimit_default_mapper.yaml"),
			"--statsd.listen-udp=127.0.0.1:"+strconv.Itoa(udpPort), "--statsd.listen-tcp=", "--web.listen-address="+web)
		var out rlstest.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-exited:
				deadline = time.Time{} // a port taken meanwhile: try others
				continue
			default:
			}
			if c, err := net.DialTimeout("tcp", web, 100*time.Millisecond); err == nil {
				c.Close()
				t.Cleanup(func() { cmd.Process.Kill(); <-exited })
				return udpPort, web
			}
			time.Sleep(20 * time.Millisecond)
		}
		cmd.Process.Kill()
		<-exited
		t.Logf("statsd_exporter did not serve:\n%s", out.String())
	}
	t.Fatal("statsd_exporter did not start")
	return 0, ""
}

// ratelimitMetricsRules are envoyproxy/ratelimit rules: one level with a value, two levels (the
// second a key alone), and a key alone in shadow mode.
const ratelimitMetricsRules = `domain: shop
descriptors:
  - key: api_key
    value: k1
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: checkout
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: bot
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// ratelimitEnv is envoyproxy/ratelimit's environment for the rules above in a runtime directory,
// against a Redis of its own, plus extra.
func ratelimitEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "shop.yaml"), []byte(ratelimitMetricsRules), 0o644); err != nil {
		t.Fatal(err)
	}
	r := redistest.Start(t)
	return append([]string{"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=rl", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr(), "LOG_LEVEL=info"}, extra...)
}

// ratelimitLoad sends the known load: 13 hits on api_key=k1 (10/min: 10 within, of which 3 near
// the limit, rls's near-limit ratio 0.8 counting a decision that leaves at least 8 of 10 used; 3
// over), 6 on path=checkout/method=GET (5/min: 5 within, 2 near, 1 over), 3 on bot=b (2/min in
// shadow mode: 2 within, 1 near, 1 over, that 1 in shadow mode).
func ratelimitLoad(t *testing.T, c rlsv3.RateLimitServiceClient) {
	t.Helper()
	send := func(n int, want rlsv3.RateLimitResponse_Code, last rlsv3.RateLimitResponse_Code, overFrom int, ds ...*ratelimitv3.RateLimitDescriptor) {
		t.Helper()
		for i := range n {
			resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: ds})
			if err != nil {
				t.Fatal(err)
			}
			w := want
			if i >= overFrom {
				w = last
			}
			if resp.OverallCode != w {
				t.Fatalf("request %d of %v: %v, want %v", i+1, ds, resp.OverallCode, w)
			}
		}
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	send(13, ok, over, 10, d("api_key", "k1"))
	send(6, ok, over, 5, d("path", "checkout", "method", "GET"))
	send(3, ok, ok, 3, d("bot", "b"))
}

// ratelimitWant are the series a dashboard built on envoyproxy/ratelimit's default mapper reads
// after ratelimitLoad.
var ratelimitWant = map[string]string{
	`ratelimit_service_rate_limit_total_hits{domain="shop",key1="api_key_k1"}`:                    "13",
	`ratelimit_service_rate_limit_within_limit{domain="shop",key1="api_key_k1"}`:                  "10",
	`ratelimit_service_rate_limit_near_limit{domain="shop",key1="api_key_k1"}`:                    "3",
	`ratelimit_service_rate_limit_over_limit{domain="shop",key1="api_key_k1"}`:                    "3",
	`ratelimit_service_rate_limit_shadow_mode{domain="shop",key1="api_key_k1"}`:                   "",
	`ratelimit_service_rate_limit_total_hits{domain="shop",key1="path_checkout",key2="method"}`:   "6",
	`ratelimit_service_rate_limit_within_limit{domain="shop",key1="path_checkout",key2="method"}`: "5",
	`ratelimit_service_rate_limit_near_limit{domain="shop",key1="path_checkout",key2="method"}`:   "2",
	`ratelimit_service_rate_limit_over_limit{domain="shop",key1="path_checkout",key2="method"}`:   "1",
	`ratelimit_service_rate_limit_total_hits{domain="shop",key1="bot"}`:                           "3",
	`ratelimit_service_rate_limit_within_limit{domain="shop",key1="bot"}`:                         "2",
	`ratelimit_service_rate_limit_near_limit{domain="shop",key1="bot"}`:                           "1",
	`ratelimit_service_rate_limit_over_limit{domain="shop",key1="bot"}`:                           "1",
	`ratelimit_service_rate_limit_shadow_mode{domain="shop",key1="bot"}`:                          "1",
	`ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`:                             "22",
	`ratelimit_service_config_load_success`:                                                       "1",
}

// awaitSeries scrapes addr's /metrics until every series of want has its value ("": absent),
// for at most 15 s, and fails with what differs.
func awaitSeries(t *testing.T, addr string, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := metricValues(t, addr)
		var diff []string
		for k, v := range want {
			if got[k] != v {
				diff = append(diff, fmt.Sprintf("%s = %q, want %q", k, got[k], v))
			}
		}
		if len(diff) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var have []string
			for k, v := range got {
				if strings.HasPrefix(k, "ratelimit_") {
					have = append(have, k+" "+v)
				}
			}
			t.Fatalf("%s/metrics:\n%s\nits ratelimit_ series:\n%s", addr, strings.Join(diff, "\n"), strings.Join(have, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRatelimitStatsdThroughStatsdExporter runs rls under envoyproxy/ratelimit's environment
// with USE_STATSD, sending to a real statsd_exporter that runs envoyproxy/ratelimit's default
// mapper: after a known load the exporter serves the series and counts a dashboard built for
// envoyproxy/ratelimit reads, for one- and two-level descriptors and shadow mode.
func TestRatelimitStatsdThroughStatsdExporter(t *testing.T) {
	port, web := startStatsdExporter(t)
	p := startRLS(t, ratelimitEnv(t, "USE_STATSD=true", "STATSD_HOST=127.0.0.1", "STATSD_PORT="+strconv.Itoa(port),
		"STATS_FLUSH_INTERVAL=100ms"))
	ratelimitLoad(t, p.client(t))
	awaitSeries(t, web, ratelimitWant)
	// Counts are sent as deltas: a later flush with nothing new leaves them as they are.
	time.Sleep(300 * time.Millisecond)
	awaitSeries(t, web, ratelimitWant)
}

// TestRatelimitPrometheusSeries runs rls under envoyproxy/ratelimit's environment with
// USE_PROMETHEUS=true: rls serves the same series itself, on PROMETHEUS_ADDR's listener (here
// moved to a free port by RLS_METRICS_ADDR) beside its own.
func TestRatelimitPrometheusSeries(t *testing.T) {
	p := startRLS(t, ratelimitEnv(t, "USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001",
		"RLS_METRICS_ADDR=127.0.0.1:0"))
	ratelimitLoad(t, p.client(t))
	addr := rlstest.ServingAddrs(p.Output())["metrics_http"]
	if addr == "" {
		t.Fatalf("no metrics listener reported:\n%s", p.Output())
	}
	awaitSeries(t, addr, ratelimitWant)
	if got := metricValues(t, addr)[`rls_hits_total{domain="shop",rule="api_key=k1"}`]; got != "13" {
		t.Errorf("rls's own rls_hits_total beside them: %q, want 13", got)
	}
}

// TestDogStatsDTagsOnTheWire runs rls under envoyproxy/ratelimit's environment with
// USE_DOG_STATSD, EXTRA_TAGS and a mogrifier, and reads the datagrams it sends.
func TestDogStatsDTagsOnTheWire(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var mu sync.Mutex
	sums := map[string]int{} // "name|#tags" → summed value
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				name, rest, ok := strings.Cut(line, ":")
				if !ok {
					continue
				}
				val, tags, _ := strings.Cut(rest, "|c")
				v, _ := strconv.Atoi(val)
				mu.Lock()
				sums[name+tags] += v
				mu.Unlock()
			}
		}
	}()
	port := pc.LocalAddr().(*net.UDPAddr).Port
	p := startRLS(t, ratelimitEnv(t, "USE_STATSD=false", "USE_DOG_STATSD=true", "STATSD_HOST=127.0.0.1",
		"STATSD_PORT="+strconv.Itoa(port), "STATS_FLUSH_INTERVAL=100ms", "EXTRA_TAGS=env:test,team:edge",
		"USE_DOG_STATSD_MOGRIFIERS=HITS",
		`DOG_STATSD_MOGRIFIER_HITS_PATTERN=^ratelimit\.service\.rate_limit\.([^.]+)\.([^.]+)\.total_hits$`,
		"DOG_STATSD_MOGRIFIER_HITS_NAME=ratelimit.hits", "DOG_STATSD_MOGRIFIER_HITS_TAGS=domain:$1,descriptor:$2"))
	ratelimitLoad(t, p.client(t))
	want := map[string]int{
		// Mogrified: renamed, its tags after EXTRA_TAGS.
		"ratelimit.hits|#env:test,team:edge,descriptor:api_key_k1,domain:shop": 13,
		"ratelimit.hits|#env:test,team:edge,descriptor:bot,domain:shop":        3,
		// The two-level key does not match the mogrifier's pattern: its name, EXTRA_TAGS only.
		"ratelimit.service.rate_limit.shop.path_checkout.method.total_hits|#env:test,team:edge": 6,
		"ratelimit.service.rate_limit.shop.api_key_k1.over_limit|#env:test,team:edge":           3,
		"ratelimit.service.rate_limit.shop.bot.shadow_mode|#env:test,team:edge":                 1,
		// Outside the "ratelimit" scope that EXTRA_TAGS tag, as in envoyproxy/ratelimit.
		"ratelimit_server.ShouldRateLimit.total_requests": 22,
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		var diff []string
		for k, v := range want {
			if sums[k] != v {
				diff = append(diff, fmt.Sprintf("%s: %d, want %d", k, sums[k], v))
			}
		}
		var have []string
		for k, v := range sums {
			have = append(have, fmt.Sprintf("%s %d", k, v))
		}
		mu.Unlock()
		if len(diff) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("on the wire:\n%s\nreceived:\n%s", strings.Join(diff, "\n"), strings.Join(have, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
