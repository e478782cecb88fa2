package integration

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/xdstest"
)

// egConfig is a RateLimitConfig as Envoy Gateway builds them: one per listener, its domain
// named after it, a descriptor per rule.
func egConfig(perMinute uint32, unit rlconfv3.RateLimitUnit) *rlconfv3.RateLimitConfig {
	return &rlconfv3.RateLimitConfig{
		Name: "default/eg/http", Domain: "default/eg/http",
		Descriptors: []*rlconfv3.RateLimitDescriptor{{
			Key: "httproute/default/backend/rule/0/match/0", Value: "httproute/default/backend/rule/0/match/0",
			Descriptors: []*rlconfv3.RateLimitDescriptor{{
				Key:       "rule-0-match-0",
				RateLimit: &rlconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: perMinute},
			}},
		}},
	}
}

// egAsk sends the descriptor Envoy Gateway's route would send for user.
func egAsk(t *testing.T, c rlsv3.RateLimitServiceClient, user string) (rlsv3.RateLimitResponse_Code, error) {
	t.Helper()
	resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		d("httproute/default/backend/rule/0/match/0", "httproute/default/backend/rule/0/match/0", "rule-0-match-0", user),
	}})
	return resp.GetOverallCode(), err
}

// egAdmitted counts how many of n requests for user are admitted.
func egAdmitted(t *testing.T, c rlsv3.RateLimitServiceClient, user string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		code, err := egAsk(t, c, user)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if code == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// envoyGatewayEnv is the environment Envoy Gateway gives its rate-limit deployment
// (internal/infrastructure/kubernetes/ratelimit), with its Redis and xDS server here: as its
// earlier releases give it (statsd) and, with TLS, as its current ones do (below).
func envoyGatewayEnv(redisAddr, xdsAddr string) []string {
	return []string{
		"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_IGNOREDOTFILES=true", "RUNTIME_WATCH_ROOT=false",
		"LOG_LEVEL=info", "USE_STATSD=true", "STATSD_PORT=9125",
		"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xdsAddr, "CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit",
		"FORCE_START_WITHOUT_INITIAL_CONFIG=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
	}
}

// TestEnvoyGatewayEnvironment runs the rls binary with the environment Envoy Gateway gives
// envoyproxy/ratelimit, against go-control-plane's xDS server and a real Redis: with TLS off,
// and on (rls serving gRPC over TLS, and connecting to the xDS server with a client
// certificate). Rules are pushed and updated, an invalid snapshot is NACKed while the rules in
// force keep answering, and after the xDS server restarts rls subscribes again.
func TestEnvoyGatewayEnvironment(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plaintext", true: "tls"}[withTLS], func(t *testing.T) {
			r := redistest.Start(t)
			var pki *testPKI
			var serverTLS *tls.Config
			if withTLS {
				pki = newTestPKI(t, "localhost")
				cert, err := tls.LoadX509KeyPair(pki.serverCert, pki.serverKey)
				if err != nil {
					t.Fatal(err)
				}
				// The xDS server requires the client certificate, as Envoy Gateway's does.
				serverTLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pki.caPool, ClientAuth: tls.RequireAndVerifyClientCert}
			}
			xs := xdstest.Start(t, serverTLS)
			xdsAddr := xs.Addr
			env := envoyGatewayEnv(r.Addr(), xdsAddr)
			if withTLS {
				xdsAddr = strings.Replace(xdsAddr, "127.0.0.1", "localhost", 1)
				env = envoyGatewayEnv(r.Addr(), xdsAddr)
				env = slices.DeleteFunc(env, func(kv string) bool {
					return strings.HasPrefix(kv, "USE_STATSD=") || strings.HasPrefix(kv, "STATSD_PORT=")
				})
				env = append(env, "USE_STATSD=false",
					"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=:19001", "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml",
					// The one addition: the metrics listener on a free port, not 19001, which
					// another process on this machine may hold. RLS_* wins over PROMETHEUS_ADDR.
					"RLS_METRICS_ADDR=127.0.0.1:0",
					"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT="+pki.serverCert, "GRPC_SERVER_TLS_KEY="+pki.serverKey,
					"GRPC_SERVER_TLS_CA_CERT="+pki.caFile,
					"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+pki.clientCert,
					"CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+pki.clientKey, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT="+pki.caFile)
			}
			// FORCE_START_WITHOUT_INITIAL_CONFIG: ready, with no limits, before any rules.
			p := startRLS(t, env)
			var conn *grpc.ClientConn
			var err error
			if withTLS {
				conn, err = grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
					RootCAs: pki.caPool, ServerName: "localhost", Certificates: []tls.Certificate{pki.client}})))
			} else {
				conn, err = grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			if withTLS {
				// GRPC_SERVER_TLS_CA_CERT is the client CA: a client without a certificate
				// signed by it is refused.
				bare, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
					RootCAs: pki.caPool, ServerName: "localhost"})))
				if err != nil {
					t.Fatal(err)
				}
				defer bare.Close()
				if _, err := egAsk(t, rlsv3.NewRateLimitServiceClient(bare), "u0"); status.Code(err) != codes.Unavailable {
					t.Errorf("without a client certificate: %v, want the handshake refused (UNAVAILABLE)", err)
				}
				if !strings.Contains(p.Output(), "grpc-tls-client-ca") {
					t.Errorf("the client CA is not reported at start:\n%s", p.Output())
				}
			}
			if got := egAdmitted(t, c, "u0", 5); got != 5 {
				t.Fatalf("before any rules: %d of 5 admitted, want all", got)
			}
			if code, body := get(t, "http://"+p.HTTPAddr+"/healthcheck"); code != 200 || body != "OK" {
				t.Errorf("/healthcheck before rules with FORCE_START_WITHOUT_INITIAL_CONFIG: %d %q, want 200 OK", code, body)
			}

			xs.Set("envoy-ratelimit", "1", egConfig(3, rlconfv3.RateLimitUnit_MINUTE))
			xs.WaitACK("1", 20*time.Second)
			if got := egAdmitted(t, c, "u1", 5); got != 3 {
				t.Fatalf("version 1 (3/min): %d of 5 admitted", got)
			}
			xs.Set("envoy-ratelimit", "2", egConfig(4, rlconfv3.RateLimitUnit_MINUTE))
			xs.WaitACK("2", 20*time.Second)
			if got := egAdmitted(t, c, "u2", 6); got != 4 {
				t.Fatalf("version 2 (4/min): %d of 6 admitted", got)
			}

			before := len(xs.Replies())
			xs.Set("envoy-ratelimit", "3", egConfig(7, rlconfv3.RateLimitUnit_UNKNOWN))
			nack := xs.WaitNACK(before, 20*time.Second)
			if !strings.Contains(nack.Error, "unit") {
				t.Errorf("NACK %q: want the reason (the unit)", nack.Error)
			}
			if got := egAdmitted(t, c, "u3", 6); got != 4 {
				t.Fatalf("after the invalid version 3: %d of 6 admitted, want version 2's 4", got)
			}

			xs.Stop()
			if got := egAdmitted(t, c, "u4", 6); got != 4 {
				t.Fatalf("xDS server down: %d of 6 admitted, want the rules in force (4)", got)
			}
			xs.Set("envoy-ratelimit", "4", egConfig(2, rlconfv3.RateLimitUnit_MINUTE))
			xs.Restart()
			xs.WaitACK("4", 30*time.Second)
			if got := egAdmitted(t, c, "u5", 5); got != 2 {
				t.Fatalf("after the xDS server restarted, version 4 (2/min): %d of 5 admitted", got)
			}
			if code, body := get(t, "http://"+p.DebugAddr+"/rlconfig"); code != 200 || !strings.Contains(body, "default/eg/http.") || !strings.Contains(body, "requests_per_unit=2") {
				t.Errorf("/rlconfig: %d %q", code, body)
			}
			// The limits are kept in Redis, under the default key prefix.
			if n := redisKeys(t, r.Addr(), "*"); n == 0 {
				t.Error("no key in Redis: the decisions were not made there")
			}
			if withTLS {
				// USE_PROMETHEUS: metrics on their own listener too.
				m := regexp.MustCompile(`metrics_http=(127\.0\.0\.1:[0-9]+)`).FindStringSubmatch(p.Output())
				if m == nil {
					t.Fatalf("no metrics listener in the log:\n%s", p.Output())
				}
				if code, body := get(t, "http://"+m[1]+"/metrics"); code != 200 || !strings.Contains(body, "rls_decisions_total") {
					t.Errorf("metrics listener: %d, %d bytes", code, len(body))
				}
			}
			hc := healthpb.NewHealthClient(conn)
			if resp, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "ratelimit"}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("gRPC health of service ratelimit: %v %v", resp, err)
			}
		})
	}
}

// TestXDSWithoutInitialRules: without FORCE_START_WITHOUT_INITIAL_CONFIG rls is not ready,
// and answers UNAVAILABLE, until the first rules arrive; with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
// it answers at once but is not ready until then either.
func TestXDSWithoutInitialRules(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       []string
		answersOK bool // before rules
	}{
		{"default", nil, false},
		{"force start, healthy with a config", []string{"FORCE_START_WITHOUT_INITIAL_CONFIG=true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			xs := xdstest.Start(t, nil)
			env := append([]string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL=" + xs.Addr,
				"CONFIG_GRPC_XDS_NODE_ID=n1", "RLS_BACKEND=memory"}, tc.env...)
			p := launchRLS(t, env)
			c := p.client(t)
			code, err := egAsk(t, c, "u")
			if tc.answersOK {
				if err != nil || code != rlsv3.RateLimitResponse_OK {
					t.Errorf("before rules: %v %v, want OK", code, err)
				}
			} else if status.Code(err) != codes.Unavailable {
				t.Errorf("before rules: %v %v, want UNAVAILABLE", code, err)
			}
			if code, body := get(t, "http://"+p.HTTPAddr+"/healthcheck"); code != 500 || !strings.Contains(body, "no rules") {
				t.Errorf("/healthcheck before rules: %d %q, want 500 saying no rules", code, body)
			}
			xs.Set("n1", "1", egConfig(1, rlconfv3.RateLimitUnit_HOUR))
			xs.WaitACK("1", 20*time.Second)
			p.WaitReady(t)
			if code, body := get(t, "http://"+p.HTTPAddr+"/healthcheck"); code != 200 || body != "OK" {
				t.Errorf("/healthcheck with rules: %d %q", code, body)
			}
			if got := egAdmitted(t, c, "u", 3); got != 1 {
				t.Errorf("1/hour: %d of 3 admitted", got)
			}
			// SIGHUP, which reloads rule files, must not end a process whose rules come over xDS.
			p.Signal(t, syscall.SIGHUP)
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.Output(), "nothing to reload"); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("no word of the SIGHUP:\n%s", p.Output())
				}
			}
			if got := egAdmitted(t, c, "u", 1); got != 0 {
				t.Errorf("after SIGHUP: %d admitted, want the rules still in force", got)
			}
		})
	}
}

// TestRatelimitFileEnvironment starts rls with envoyproxy/ratelimit's file-based environment
// (RUNTIME_* with its directory layout, REDIS_URL as host:port) and with rls's own flags for
// the same rules and Redis: both answer alike.
func TestRatelimitFileEnvironment(t *testing.T) {
	r := redistest.Start(t)
	root := t.TempDir()
	rules := "domain: files\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n  - key: path\n    value: /slow\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	for _, f := range []struct{ name, content string }{
		{"ratelimit/config/users.yaml", rules},
		{"ratelimit/config/.editor-backup.yaml", "not: [valid"}, // RUNTIME_IGNOREDOTFILES=true skips it
	} {
		p := filepath.Join(root, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	compat := startRLS(t, []string{
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + r.Addr(), "USE_STATSD=false", "CACHE_KEY_PREFIX=compat_",
	})
	own := startRLS(t, nil, "--config", filepath.Join(root, "ratelimit", "config"), "--backend", "redis",
		"--redis-url", "redis://"+r.Addr(), "--redis-key-prefix", "own_")
	ask := func(c rlsv3.RateLimitServiceClient, k, v string) string {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "files", Descriptors: []*ratelimitv3.RateLimitDescriptor{d(k, v)}})
		if err != nil {
			return status.Code(err).String()
		}
		return fmt.Sprintf("%s %d", resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining())
	}
	cc, oc := compat.client(t), own.client(t)
	for i, q := range []struct{ k, v string }{
		{"user", "a"}, {"user", "a"}, {"user", "b"}, {"user", "a"}, {"user", "a"},
		{"path", "/slow"}, {"path", "/slow"}, {"path", "/fast"}, {"other", "x"},
	} {
		if got, want := ask(cc, q.k, q.v), ask(oc, q.k, q.v); got != want {
			t.Errorf("request %d %s=%s: envoyproxy/ratelimit environment answers %q, rls flags %q", i, q.k, q.v, got, want)
		}
	}
	if n := redisKeys(t, r.Addr(), "compat_*"); n == 0 {
		t.Error("CACHE_KEY_PREFIX was not used: no compat_* key in Redis")
	}
	if !strings.Contains(compat.Output(), "USE_STATSD") {
		t.Errorf("USE_STATSD was not reported at start:\n%s", compat.Output())
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// redisKeys counts the keys of the Redis at addr that match pattern.
func redisKeys(t *testing.T, addr, pattern string) int {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	keys, err := c.Keys(ctxT(t), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// TestRatelimitRedisCluster: REDIS_TYPE=cluster with REDIS_URL as envoyproxy/ratelimit takes it,
// host:port,host:port, decides against the real Cluster.
func TestRatelimitRedisCluster(t *testing.T) {
	nodes := strings.TrimPrefix(redistest.URL(t, redistest.ClusterEnv), "redis-cluster://")
	dir := writeRules(t, map[string]string{"c.yaml": "domain: cl\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"})
	p := startRLS(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=cluster", "REDIS_URL=" + nodes,
		"USE_STATSD=false", "CACHE_KEY_PREFIX=" + t.Name() + fmt.Sprint(time.Now().UnixNano()) + "_"}, "--config", dir)
	c := p.client(t)
	ok := 0
	for range 5 {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "cl", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("user", "u")}})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 3 {
		t.Errorf("3/hour over the Cluster: %d of 5 admitted", ok)
	}
	if !strings.Contains(p.Output(), "redis=\"cluster ") {
		t.Errorf("not a Cluster client:\n%s", p.Output())
	}
}

// TestRatelimitRedisTLS: REDIS_TLS with a client certificate and a private CA, as Envoy Gateway
// sets them for a Redis that requires client certificates, against a real redis-server over TLS.
func TestRatelimitRedisTLS(t *testing.T) {
	pki := newTestPKI(t, "localhost")
	port := startTLSRedis(t, pki)
	dir := writeRules(t, map[string]string{"t.yaml": "domain: tls\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"})
	env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=localhost:" + fmt.Sprint(port), "REDIS_TLS=true",
		"REDIS_TLS_CLIENT_CERT=" + pki.clientCert, "REDIS_TLS_CLIENT_KEY=" + pki.clientKey, "REDIS_TLS_CACERT=" + pki.caFile,
		"USE_STATSD=false"}
	p := startRLS(t, env, "--config", dir) // ready: Redis answered over TLS
	c := p.client(t)
	ok := 0
	for range 4 {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "tls", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("user", "u")}})
		if err != nil {
			t.Fatalf("%v\n%s", err, p.Output())
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	if ok != 2 {
		t.Errorf("2/hour over TLS Redis: %d of 4 admitted", ok)
	}
	// By address, the certificate's name (localhost) does not match: verified only with
	// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, which still checks the chain.
	for _, skip := range []bool{false, true} {
		q := launchRLS(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:" + fmt.Sprint(port), "REDIS_TLS=true",
			"REDIS_TLS_CLIENT_CERT=" + pki.clientCert, "REDIS_TLS_CLIENT_KEY=" + pki.clientKey, "REDIS_TLS_CACERT=" + pki.caFile,
			"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=" + fmt.Sprint(skip), "USE_STATSD=false"}, "--config", dir)
		if code, _ := get(t, "http://"+q.HTTPAddr+"/healthcheck"); (code == 200) != skip {
			t.Errorf("by address, skip hostname verification %v: /healthcheck %d\n%s", skip, code, q.Output())
		}
		q.Stop(t)
	}
	// Without the client certificate Redis refuses the connection: rls is not ready.
	bad := launchRLS(t, []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=localhost:" + fmt.Sprint(port), "REDIS_TLS=true",
		"REDIS_TLS_CACERT=" + pki.caFile, "USE_STATSD=false"}, "--config", dir)
	if code, body := get(t, "http://"+bad.HTTPAddr+"/healthcheck"); code != 500 {
		t.Errorf("without a client certificate: /healthcheck %d %q, want 500", code, body)
	}
}

// startTLSRedis starts a redis-server that serves TLS only, requiring client certificates from
// pki's CA, and returns its port. A port picked free may be taken before redis-server binds it,
// so it tries again on another; readiness is read from the server's log, since a plain TCP
// probe cannot tell a TLS-only server is up.
func startTLSRedis(t *testing.T, pki *testPKI) int {
	t.Helper()
	for attempt := 0; attempt < 5; attempt++ {
		port := redistest.FreePort(t)
		srv := exec.Command("redis-server", "--port", "0", "--tls-port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--tls-cert-file", pki.serverCert, "--tls-key-file", pki.serverKey, "--tls-ca-cert-file", pki.caFile,
			"--tls-auth-clients", "yes", "--save", "", "--appendonly", "no")
		out := &rlstest.Buffer{}
		srv.Stdout, srv.Stderr = out, out
		if err := srv.Start(); err != nil {
			t.Fatalf("redis-server: %v (install Debian's redis-server package)", err)
		}
		exited := make(chan struct{})
		go func() { srv.Wait(); close(exited) }()
		deadline := time.After(10 * time.Second)
		for gone := false; !gone; {
			select {
			case <-exited:
				t.Logf("redis-server on port %d exited (retrying on another):\n%s", port, out.String())
				gone = true
				continue
			case <-deadline:
				srv.Process.Kill()
				<-exited
				t.Fatalf("redis-server on port %d not ready within 10s:\n%s", port, out.String())
			case <-time.After(10 * time.Millisecond):
			}
			if strings.Contains(out.String(), "Ready to accept connections") {
				t.Cleanup(func() { srv.Process.Kill(); <-exited })
				return port
			}
		}
	}
	t.Fatal("redis-server over TLS did not start on any of 5 ports")
	return 0
}
