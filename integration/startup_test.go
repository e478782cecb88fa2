package integration

import (
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/server"
)

// silentRedis accepts connections and never answers: rls's start waits on it for its timeouts.
// accepted receives once, at the first connection.
func silentRedis(t *testing.T) (addr string, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	var (
		mu    sync.Mutex
		conns []net.Conn
		once  sync.Once
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			once.Do(func() { close(first) })
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String(), first
}

// A SIGHUP while rls starts, here while it waits on a Redis that does not answer, once ended
// the process (Go's default for SIGHUP, exit 129): the watchers that take it started only after
// the backend was connected. Now it is caught from the process's first instants and reloads once
// the watchers are ready; rls then serves, and a SIGHUP after reloads as ever.
func TestSIGHUPWhileStarting(t *testing.T) {
	redisAddr, accepted := silentRedis(t)
	rules := writeRules(t, map[string]string{"hard.yaml": svcRules})
	out := &rlstest.Buffer{}
	cmd := exec.Command(rlsBinary(t), "--config", rules, "--backend", "redis", "--redis-url", "redis://"+redisAddr,
		"--failure-mode", "allow", "--redis-dial-timeout", "300ms", "--redis-read-timeout", "300ms", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "",
		"--log-format", "text")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	select {
	case <-accepted:
	case err := <-done:
		t.Fatalf("rls exited before dialling Redis: %v\n%s", err, out)
	case <-time.After(30 * time.Second):
		t.Fatalf("rls did not dial Redis within 30 s\n%s", out)
	}
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var addrs map[string]string
	deadline := time.Now().Add(30 * time.Second)
	for len(addrs) == 0 {
		select {
		case err := <-done:
			t.Fatalf("rls exited after a SIGHUP while it connected to Redis: %v\n%s", err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("rls not serving after 30 s\n%s", out)
		}
		time.Sleep(20 * time.Millisecond)
		addrs = rlstest.ServingAddrs(out.String())
	}
	if !strings.Contains(out.String(), "SIGHUP while rls was starting: reloading now that the watchers are ready") {
		t.Errorf("no line about the SIGHUP caught while starting:\n%s", out)
	}
	t.Logf("serving %.2fs after the SIGHUP", time.Since(t0).Seconds())
	p := &rlsProc{&rlstest.Proc{GRPCAddr: addrs["grpc"], HTTPAddr: addrs["http"]}}
	resp, err := p.client(t).ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("ip", "1")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a call after the SIGHUP: %v %v (want OK: --failure-mode allow)\n%s", resp, err, out)
	}
	// The rules were reloaded once the watchers were ready: a second generation.
	waitFor(t, 10*time.Second, func() bool { return metricValues(t, p.HTTPAddr)["rls_config_generation"] == "2" },
		func() string {
			return "rls_config_generation " + metricValues(t, p.HTTPAddr)["rls_config_generation"] + ", want 2"
		})
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return metricValues(t, p.HTTPAddr)["rls_config_generation"] == "3" },
		func() string {
			return "rls_config_generation " + metricValues(t, p.HTTPAddr)["rls_config_generation"] + ", want 3"
		})
	select {
	case err := <-done:
		t.Fatalf("rls exited: %v\n%s", err, out)
	default:
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool, why func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(why())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var memoryLimitLine = regexp.MustCompile(`msg="go memory limit" limit_bytes=(\d+) from=("[^"]*"|\S+)`)

// The bare binary sets a Go memory limit from its bounds (the worst case they allow plus a
// quarter) and logs it; GOMEMLIMIT, when given, is left as it is; with a bound off there is no
// worst case and no limit.
func TestGoMemoryLimit(t *testing.T) {
	rules := writeRules(t, map[string]string{"hard.yaml": svcRules})
	small := server.DefaultConfig()
	small.Memory.MaxBytes = 8 << 20
	want, _ := small.MemoryLimit()
	for _, tc := range []struct {
		name  string
		env   []string
		args  []string
		limit int64
		from  string
	}{
		{"bounds", nil, []string{"--memory-max-bytes", "8388608"}, want, "bounds"},
		{"GOMEMLIMIT", []string{"GOMEMLIMIT=123MiB"}, nil, 123 << 20, `"GOMEMLIMIT=123MiB"`},
		{"unbounded", nil, []string{"--grpc-max-calls", "0"}, 1<<63 - 1, "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startRLS(t, tc.env, append([]string{"--config", rules}, tc.args...)...)
			m := memoryLimitLine.FindStringSubmatch(p.Output())
			if m == nil {
				t.Fatalf("no go memory limit line:\n%s", p.Output())
			}
			if got, _ := strconv.ParseInt(m[1], 10, 64); got != tc.limit || m[2] != tc.from {
				t.Errorf("logged limit %s from %s, want %d from %s", m[1], m[2], tc.limit, tc.from)
			}
			if got := metricValues(t, p.HTTPAddr)["go_gc_gomemlimit_bytes"]; got != "" {
				if f, _ := strconv.ParseFloat(got, 64); int64(f) != tc.limit && tc.limit != 1<<63-1 {
					t.Errorf("go_gc_gomemlimit_bytes %s, want %d", got, tc.limit)
				}
			}
		})
	}
}
