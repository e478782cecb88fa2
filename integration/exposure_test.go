package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
)

const exposureRules = `
domain: exposure
descriptors:
  - key: generic_key
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// runToExit runs the rls binary with env added and args, and returns its output and exit code
// (-1 when it was still running after 20 s and was killed: it did not refuse what it was given).
func runToExit(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, rlsBinary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		return out.String(), -1
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

// TestDebugListenerStaysOnLoopback: under envoyproxy/ratelimit's environment the debug listener
// (every rule, any key's state) stays on 127.0.0.1 unless DEBUG_HOST asks otherwise, where it
// used to follow envoyproxy/ratelimit's default of 0.0.0.0.
func TestDebugListenerStaysOnLoopback(t *testing.T) {
	t.Parallel()
	rules := writeRules(t, map[string]string{"exposure.yaml": exposureRules})
	args := []string{"--backend", "memory", "--config", rules, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "text"}
	// DEBUG_PORT alone: the port moves, the host stays loopback.
	p := rlstest.Launch(t, rlsBinary(t), []string{"USE_STATSD=false", "DEBUG_PORT=0"}, args...)
	if p.DebugAddr == "" {
		t.Fatalf("DEBUG_PORT=0 without DEBUG_HOST: the debug listener is not on 127.0.0.1:\n%s", p.Output())
	}
	if code, body := get(t, "http://"+p.DebugAddr+"/rlconfig"); code != 200 || !strings.Contains(body, "exposure.generic_key") {
		t.Errorf("/rlconfig on %s: %d %q", p.DebugAddr, code, body)
	}
	if !strings.Contains(p.Output(), "DEBUG_HOST is not set") {
		t.Errorf("no notice that DEBUG_HOST is not followed:\n%s", p.Output())
	}
	// DEBUG_HOST set: as asked.
	q := rlstest.Launch(t, rlsBinary(t), []string{"USE_STATSD=false", "DEBUG_HOST=0.0.0.0", "DEBUG_PORT=0"}, args...)
	if !regexp.MustCompile(`debug_http=(\[::\]|0\.0\.0\.0):[0-9]+`).MatchString(q.Output()) {
		t.Errorf("DEBUG_HOST=0.0.0.0: the debug listener is not on every interface:\n%s", q.Output())
	}
}

// exposurePassword is the password of the tests below; each checks it appears nowhere.
const exposurePassword = "Sekr1tPassw0rd"

// hidden fails the test when out shows the password, or any of more.
func hidden(t *testing.T, where, out string, more ...string) {
	t.Helper()
	for _, s := range append([]string{exposurePassword, strings.ToLower(exposurePassword)}, more...) {
		if strings.Contains(out, s) {
			t.Errorf("%s shows %q:\n%s", where, s, out)
		}
	}
}

// TestRedisURLRefusedAtStart: a Redis address that can never be dialed (a port out of range or
// not a number, no host) stops rls at start with exit 1, naming the URL (its password hidden)
// and what is wrong, where it used to start with its circuit breaker open for ever. So does
// every URL that does not parse, and not one of these errors shows any part of the password.
func TestRedisURLRefusedAtStart(t *testing.T) {
	t.Parallel()
	pw := exposurePassword
	base := []string{"--backend", "redis", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", ""}
	for _, tc := range []struct {
		name   string
		url    string   // --redis-url, when set
		env    []string // else envoyproxy/ratelimit's environment
		want   []string // in the error
		secret []string // fragments of the password, besides it
	}{
		{name: "port out of range", url: "redis://u:" + pw + "@127.0.0.1:99999", want: []string{`redis://u:xxx@127.0.0.1:99999`, `port "99999"`}},
		{name: "port zero", url: "redis://:" + pw + "@127.0.0.1:0", want: []string{`port "0"`}},
		{name: "port not a number", url: "rediss://:" + pw + "@127.0.0.1:abc", want: []string{`rediss://:xxx@127.0.0.1:abc`, `invalid port ":abc"`}},
		{name: "no host", url: "redis://:" + pw + "@:6379", want: []string{"no host"}},
		{name: "cluster node port", url: "redis-cluster://u:" + pw + "@127.0.0.1:7000,127.0.0.1:70000", want: []string{`address "127.0.0.1:70000"`}},
		{name: "cluster node no host", url: "redis-cluster://127.0.0.1:7000,:7001", want: []string{`address ":7001": no host`}},
		{name: "sentinel port", url: "redis-sentinel://127.0.0.1:99999/mymaster?sentinel_password=" + pw, want: []string{`sentinel_password=xxx`, `address "127.0.0.1:99999"`}},
		{name: "sentinel bad query", url: "redis-sentinel://u:" + pw + "@127.0.0.1:26379/m?sentinel_password=" + pw + "%zz", want: []string{"query is not valid"}, secret: []string{"%zz"}},
		{name: "bad escape in password", url: "redis://u:" + pw + "%zz@127.0.0.1:6379", want: []string{"user info"}, secret: []string{"%zz"}},
		{name: "hash in password", url: "redis://u:ab#" + pw + "@127.0.0.1:6379", want: []string{"user info"}, secret: []string{"ab#"}},
		{name: "question mark in password", url: "redis://u:ab?" + pw + "@127.0.0.1:6379", want: []string{"redis url"}, secret: []string{"ab?"}},
		{name: "unix without a path", url: "unix://u:" + pw + "@", want: []string{"empty unix socket path"}},
		{name: "cluster bad escape", url: "redis-cluster://u:" + pw + "%@127.0.0.1:7000", want: []string{"user info"}, secret: []string{pw + "%"}},
		{name: "no scheme", url: "u:" + pw + "@127.0.0.1:6379", want: []string{"no scheme", "u:xxx@127.0.0.1:6379"}},
		{name: "unknown option", url: "redis://" + pw + "@127.0.0.1:6379?pool=1", want: []string{"unexpected option: pool"}},
		{name: "REDIS_AUTH with a bad port", env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:99999", "REDIS_AUTH=" + pw},
			want: []string{"REDIS_URL"}},
		{name: "REDIS_URL with a password and a bad port", env: []string{"REDIS_TYPE=single", "REDIS_URL=redis://u:" + pw + "@127.0.0.1:99999", "REDIS_AUTH=u:" + pw},
			want: []string{`port "99999"`, "from REDIS_TYPE"}},
		{name: "REDIS_URL that does not parse", env: []string{"REDIS_TYPE=single", "REDIS_URL=redis://u:" + pw + "%zz@h:1"},
			want: []string{"REDIS_URL", "not a valid URL"}, secret: []string{"%zz"}},
		{name: "sentinel environment with a bad port", env: []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster,127.0.0.1:99999", "REDIS_SENTINEL_AUTH=su:" + pw, "REDIS_AUTH=" + pw},
			want: []string{"REDIS_URL"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string(nil), base...)
			env := tc.env
			if tc.url != "" {
				args = append(args, "--redis-url", tc.url)
			} else {
				args = append(args, "--config", writeRules(t, map[string]string{"exposure.yaml": exposureRules}))
			}
			out, code := runToExit(t, env, args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1 (refused at start):\n%s", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("error does not say %q:\n%s", w, out)
				}
			}
			hidden(t, "the error", out, tc.secret...)
		})
	}
}

// TestPasswordsNeverShown: with a password in every form rls takes one (redis://, a user name,
// rediss://, unix://, redis-sentinel:// with sentinel_password, redis-cluster://,
// envoyproxy/ratelimit's REDIS_AUTH and REDIS_SENTINEL_AUTH), whether Redis takes it, refuses it
// or cannot be reached, the password appears nowhere rls shows: its log, /rlconfig, the debug
// pages (the pprof command line among them), /metrics.
func TestPasswordsNeverShown(t *testing.T) {
	t.Parallel()
	pw := exposurePassword
	sock := filepath.Join(t.TempDir(), "redis.sock")
	r := redistest.StartWith(t, "--unixsocket", sock, "--unixsocketperm", "700")
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	if err := admin.ConfigSet(ctxT(t), "requirepass", pw).Err(); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	closed := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)) // nothing listens there
	rules := writeRules(t, map[string]string{"exposure.yaml": exposureRules})
	for _, tc := range []struct {
		name  string
		url   string
		env   []string
		ready bool // Redis takes the password: rls is ready with --failure-mode error
	}{
		{name: "redis password", url: "redis://:" + pw + "@" + r.Addr(), ready: true},
		{name: "redis user and password", url: "redis://default:" + pw + "@" + r.Addr() + "/0", ready: true},
		{name: "unix socket", url: "unix://:" + pw + "@" + sock, ready: true},
		{name: "wrong password", url: "redis://:wrong" + pw + "@" + r.Addr()},
		{name: "rediss to plaintext", url: "rediss://:" + pw + "@" + r.Addr()},
		{name: "sentinel", url: "redis-sentinel://u:" + pw + "@" + closed + "/mymaster?sentinel_username=su&sentinel_password=" + pw},
		{name: "cluster", url: "redis-cluster://:" + pw + "@" + r.Addr()},
		{name: "REDIS_AUTH", env: []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr(), "REDIS_AUTH=" + pw}, ready: true},
		{name: "REDIS_AUTH unix", env: []string{"REDIS_SOCKET_TYPE=unix", "REDIS_URL=" + sock, "REDIS_AUTH=default:" + pw}, ready: true},
		{name: "REDIS_SENTINEL_AUTH", env: []string{"REDIS_TYPE=sentinel", "REDIS_URL=mymaster," + closed, "REDIS_AUTH=u:" + pw, "REDIS_SENTINEL_AUTH=su:" + pw}},
		{name: "REDIS_TYPE cluster", env: []string{"REDIS_TYPE=cluster", "REDIS_URL=" + r.Addr(), "REDIS_AUTH=" + pw}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"--backend", "redis", "--config", rules, "--debug", "--log-level", "debug",
				"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0", "--log-format", "text"}
			if tc.url != "" {
				args = append(args, "--redis-url", tc.url)
			}
			p := rlstest.Launch(t, rlsBinary(t), tc.env, args...)
			if tc.ready {
				p.WaitReady(t)
				if code, body := httpPost(t, "http://"+p.HTTPAddr+"/json", `{"domain":"exposure","descriptors":[{"entries":[{"key":"generic_key","value":"a"}]}]}`); code != 200 {
					t.Errorf("POST /json with Redis taking the password: %d %s", code, body)
				}
			} else {
				// Give the backend time to fail and say so.
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(p.Output(), "unavailable") && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
			}
			if len(tc.env) > 0 && !strings.Contains(p.Output(), "flag=--redis-url value=") {
				t.Errorf("the translated --redis-url is not logged:\n%s", p.Output())
			}
			for _, path := range []string{"/rlconfig", "/debug/rules", "/debug/rlqs", "/debug/pprof/cmdline", "/debug/pprof/"} {
				code, body := get(t, "http://"+p.DebugAddr+path)
				if path == "/debug/pprof/cmdline" && (code != 200 || !strings.Contains(body, "--backend")) {
					t.Errorf("%s: %d %q", path, code, body)
				}
				hidden(t, path, body)
			}
			_, metrics := get(t, "http://"+p.HTTPAddr+"/metrics")
			hidden(t, "/metrics", metrics)
			p.Stop(t)
			hidden(t, "the log", p.Output())
		})
	}
}

// httpPost posts body as JSON and returns the status and the answer.
func httpPost(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// exposureAsk makes one ShouldRateLimit call on conn, ending it after within.
func exposureAsk(conn *grpc.ClientConn, within time.Duration, opts ...grpc.CallOption) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "exposure", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("generic_key", "a")}}, opts...)
	return err
}

func dialExposure(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestGRPCConnectionCap: with --grpc-max-connections 2, a third connection is not served while
// two are open, and the two go on being answered; when one closes, the third is served.
func TestGRPCConnectionCap(t *testing.T) {
	t.Parallel()
	rules := writeRules(t, map[string]string{"exposure.yaml": exposureRules})
	p := startRLS(t, nil, "--config", rules, "--grpc-max-connections", "2", "--grpc-max-connection-idle", "0")
	a, b := dialExposure(t, p.GRPCAddr), dialExposure(t, p.GRPCAddr)
	for i, conn := range []*grpc.ClientConn{a, b} {
		if err := exposureAsk(conn, 10*time.Second); err != nil {
			t.Fatalf("connection %d of 2: %v", i+1, err)
		}
	}
	c := dialExposure(t, p.GRPCAddr)
	if err := exposureAsk(c, 2*time.Second, grpc.WaitForReady(true)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third connection with 2 open: %v, want it not served (DeadlineExceeded)", err)
	}
	for i, conn := range []*grpc.ClientConn{a, b} {
		if err := exposureAsk(conn, 10*time.Second); err != nil {
			t.Fatalf("connection %d of 2 while a third waits: %v", i+1, err)
		}
	}
	// By its whole name: rls_grpc_connections_refused_total shares its prefix.
	if n := metricValues(t, p.HTTPAddr)["rls_grpc_connections"]; n != "2" {
		t.Errorf("rls_grpc_connections = %q at the cap, want 2", n)
	}
	if !strings.Contains(p.Output(), "gRPC connection cap reached") {
		t.Errorf("no warning that the cap was reached:\n%s", p.Output())
	}
	a.Close()
	if err := exposureAsk(c, 20*time.Second, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the third connection once one closed: %v", err)
	}
	if err := exposureAsk(b, 10*time.Second); err != nil {
		t.Fatalf("the second connection after: %v", err)
	}
}

// TestGRPCIdleConnectionClosed: a connection with no call for --grpc-max-connection-idle is
// closed with GOAWAY, and a gRPC client (as Envoy does) reconnects on its next call.
func TestGRPCIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	rules := writeRules(t, map[string]string{"exposure.yaml": exposureRules})
	p := startRLS(t, nil, "--config", rules, "--grpc-max-connection-idle", "1s")
	h := dialH2(t, p.GRPCAddr)
	select {
	case g := <-h.goaway:
		if g.code != 0 { // NO_ERROR: a graceful close
			t.Errorf("GOAWAY %v %q, want NO_ERROR", g.code, g.debug)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("an idle connection got no GOAWAY within 20s of --grpc-max-connection-idle 1s")
	}
	conn := dialExposure(t, p.GRPCAddr)
	if err := exposureAsk(conn, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Idle past the timeout: the connection is closed, and the next call opens another.
	time.Sleep(2500 * time.Millisecond)
	if err := exposureAsk(conn, 10*time.Second, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the call after an idle GOAWAY: %v", err)
	}
}

// TestRefusedResetsThrottled: a refused key reset, which any client can cause at will, is
// logged once per --log-repeat-interval, then once with how many were suppressed, where every
// refusal used to log a line; none goes unaccounted for.
func TestRefusedResetsThrottled(t *testing.T) {
	t.Parallel()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-admin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rules := writeRules(t, map[string]string{"exposure.yaml": exposureRules})
	const every = time.Second
	p := startRLS(t, nil, "--config", rules, "--admin-token-file", tokenFile, "--log-repeat-interval", every.String())
	const n = 300
	start := time.Now()
	for i := range n {
		req, _ := http.NewRequest("POST", "http://"+p.HTTPAddr+"/v1/keys?domain=exposure&descriptor=generic_key=a", nil)
		req.Header.Set("Authorization", "Bearer wrong-"+strconv.Itoa(i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("reset with a wrong token: %d, want 403", resp.StatusCode)
		}
	}
	elapsed := time.Since(start)
	count := regexp.MustCompile(` suppressed=([0-9]+)`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		lines, occurrences := 0, 0
		for _, l := range strings.Split(p.Output(), "\n") {
			if !strings.Contains(l, "key reset refused") {
				continue
			}
			lines++
			if m := count.FindStringSubmatch(l); m != nil {
				k, _ := strconv.Atoi(m[1])
				occurrences += k
			} else {
				occurrences++
			}
		}
		if occurrences == n {
			if most := 2 * (int(elapsed/every) + 2); lines > most {
				t.Fatalf("%d lines for %d refusals over %v: want at most %d (2 per %v)", lines, n, elapsed, most, every)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines account for %d of %d refusals:\n%s", lines, occurrences, n, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
