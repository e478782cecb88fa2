package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const coreRules = `
domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
    descriptors:
      - key: path
        value: "/search*"
        rate_limit: {unit: hour, requests_per_unit: 1, name: search}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 2, burst: 4}
  - key: health
    value: check
`

func d(kv ...string) *ratelimitv3.RateLimitDescriptor {
	desc := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return desc
}

func codes_(resp *rlsv3.RateLimitResponse) string {
	s := resp.GetOverallCode().String()
	for _, st := range resp.GetStatuses() {
		s += " " + st.GetCode().String()
	}
	return s
}

func TestCoreOverGRPC(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": coreRules}), "--response-headers", "draft")
	c := p.client(t)
	ctx := ctxT(t)
	ask := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		return resp
	}
	shop := func(ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: ds}
	}

	t.Run("matching and statuses", func(t *testing.T) {
		for i := range 3 {
			r := ask(shop(d("api_key", "m1")))
			if codes_(r) != "OK OK" || r.Statuses[0].LimitRemaining != uint32(2-i) || r.Statuses[0].CurrentLimit.GetName() != "per_key" {
				t.Fatalf("request %d: %v", i+1, r)
			}
		}
		r := ask(shop(d("api_key", "m1")))
		if codes_(r) != "OVER_LIMIT OVER_LIMIT" || r.Statuses[0].DurationUntilReset.AsDuration().Seconds() <= 19 {
			t.Fatalf("4th: %v", r)
		}
		if r := ask(shop(d("api_key", "m1", "path", "/search?q=1"))); codes_(r) != "OK OK" || r.Statuses[0].CurrentLimit.GetName() != "search" {
			t.Fatalf("nested wildcard: %v", r)
		}
		if r := ask(shop(d("health", "check"))); codes_(r) != "OK OK" || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("allow-listed: %v", r)
		}
		if r := ask(&rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "m1")}}); codes_(r) != "OK OK" {
			t.Fatalf("unknown domain: %v", r)
		}
	})

	t.Run("headers", func(t *testing.T) {
		r := ask(shop(d("api_key", "h1")))
		got := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			got[h.Key] = h.Value
		}
		if got["RateLimit-Policy"] != `"per_key";q=3;w=60` || got["RateLimit"] != `"per_key";r=2;t=20` {
			t.Fatalf("headers %v", got)
		}
	})

	t.Run("hits and overrides", func(t *testing.T) {
		if r := ask(&rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "x1")}}); r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("hits_addend 3: %v", r)
		}
		refund := d("api_key", "x1")
		refund.HitsAddend = wrapperspb.UInt64(2)
		refund.IsNegativeHits = true
		if r := ask(shop(refund)); r.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("refund 2: %v", r)
		}
		o := d("api_key", "x2")
		o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY}
		if r := ask(shop(o)); codes_(r) != "OK OK" || r.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
			t.Fatalf("override: %v", r)
		}
		if r := ask(shop(o)); codes_(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("override, second: %v", r)
		}
	})

	t.Run("all or nothing", func(t *testing.T) {
		for range 4 {
			ask(shop(d("remote_address", "10.0.0.9")))
		}
		r := ask(shop(d("api_key", "a1"), d("remote_address", "10.0.0.9")))
		if codes_(r) != "OVER_LIMIT OK OVER_LIMIT" || r.Statuses[0].LimitRemaining != 3 {
			t.Fatalf("got %v", r)
		}
		if r := ask(shop(d("api_key", "a1"))); r.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("api key after denied request: %v, want nothing consumed before (remaining 2 now)", r)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for name, req := range map[string]*rlsv3.RateLimitRequest{
			"empty domain":   {Descriptors: []*ratelimitv3.RateLimitDescriptor{d("k", "v")}},
			"no descriptors": {Domain: "shop"},
			"empty key":      shop(d("", "v")),
			"override unit":  shop(&ratelimitv3.RateLimitDescriptor{Entries: d("k", "v").Entries, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}),
			"long value":     shop(d("k", strings.Repeat("v", 5000))),
		} {
			_, err := c.ShouldRateLimit(ctx, req)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
				t.Errorf("%s: got %v, want InvalidArgument with a reason", name, err)
			}
		}
		if r := ask(shop(d())); codes_(r) != "OK OK" {
			t.Fatalf("descriptor without entries: %v", r)
		}
	})

	t.Run("health and reflection", func(t *testing.T) {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health %q: %v %v", svc, h, err)
			}
		}
		stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(resp.String(), "envoy.service.ratelimit.v3.RateLimitService") {
			t.Fatalf("reflection lists %v", resp)
		}
	})
}

func TestJSONEndpoint(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": coreRules}))
	post := func(method, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+p.HTTPAddr+"/json", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	req := `{"domain":"shop","descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}`
	for i := range 4 {
		if code, body := post("POST", req); code != 200 || !strings.Contains(body, `"overallCode":"OK"`) {
			t.Fatalf("request %d: %d %s", i+1, code, body)
		}
	}
	if code, body := post("POST", req); code != 429 || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Fatalf("5th: %d %s", code, body)
	}
	if code, body := post("POST", `{"domain":"","descriptors":[]}`); code != 400 || !strings.Contains(body, "domain must not be empty") {
		t.Fatalf("bad request: %d %s", code, body)
	}
	if code, body := post("POST", `{"domain": 5`); code != 400 || !strings.Contains(body, "invalid RateLimitRequest JSON") {
		t.Fatalf("bad JSON: %d %s", code, body)
	}
	if code, _ := post("GET", ""); code != 405 {
		t.Fatalf("GET: %d", code)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + p.HTTPAddr + path)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, resp, err)
		}
		resp.Body.Close()
	}
}

// TestHTTPConnectionLimits: the HTTP listener cuts off a client that sends its body too slowly
// and closes keep-alive connections left idle, instead of holding their file descriptors for
// ever. Short flag values stand in for the defaults.
func TestHTTPConnectionLimits(t *testing.T) {
	const readTimeout, idleTimeout = 500 * time.Millisecond, 500 * time.Millisecond
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": coreRules}),
		"--http-read-timeout", readTimeout.String(), "--http-idle-timeout", idleTimeout.String())
	t.Run("a body sent at a byte per 100ms is cut off", func(t *testing.T) {
		c, err := net.Dial("tcp", p.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const bodyLen = 100 // 10 s at this pace
		fmt.Fprintf(c, "POST /json HTTP/1.1\r\nHost: rls\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bodyLen)
		closed := make(chan struct{})
		go func() { // reads until the server closes the connection
			defer close(closed)
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			io.Copy(io.Discard, c)
		}()
		start := time.Now()
		sent := 0
	send:
		for ; sent < bodyLen; sent++ {
			select {
			case <-closed:
				break send
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write([]byte(" ")); err != nil {
				break // the server closed it
			}
		}
		<-closed
		if sent == bodyLen {
			t.Fatalf("the server read the whole %d-byte body over %v; want it cut off after --http-read-timeout %v", bodyLen, time.Since(start), readTimeout)
		}
		if took := time.Since(start); took < readTimeout/2 {
			t.Errorf("closed after %v, before the read timeout %v", took, readTimeout)
		}
	})

	t.Run("an idle keep-alive connection is closed", func(t *testing.T) {
		c, err := net.Dial("tcp", p.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: rls\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("GET /healthz: %d, close %v; want 200 on a kept-alive connection", resp.StatusCode, resp.Close)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("idle keep-alive connection: read %v, want EOF once --http-idle-timeout %v has passed", err, idleTimeout)
		}
	})
}

func TestEmbeddedDefaultAndEnv(t *testing.T) {
	p := startRLS(t, []string{"RLS_RESPONSE_HEADERS=legacy"})
	r, err := p.client(t).ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "k")}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Statuses[0].CurrentLimit.GetName() != "per_api_key" || len(r.ResponseHeadersToAdd) == 0 {
		t.Fatalf("embedded rules with RLS_RESPONSE_HEADERS=legacy: %v", r)
	}
}

func runBinary(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(rlsBinary(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

func TestValidateCommand(t *testing.T) {
	good := writeRules(t, map[string]string{"shop.yaml": coreRules})
	for _, args := range [][]string{{"validate", good}, {"validate", "--config", good}, {"validate", "--config=" + good}} {
		if out, code := runBinary(t, args...); code != 0 || !strings.Contains(out, "ok: 1 domain(s) from 1 file(s)") {
			t.Fatalf("rls %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
	}
	for _, args := range [][]string{{"validate"}, {"validate", "--config", good, good}, {"validate", good, good}} {
		if out, code := runBinary(t, args...); code != 64 || !strings.Contains(out, "usage: rls validate PATH, or rls validate --config PATH") {
			t.Errorf("rls %s: exit %d, want 64 and the usage\n%s", strings.Join(args, " "), code, out)
		}
	}
	bad := writeRules(t, map[string]string{
		"a.yaml": "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
		"b.yml":  "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n    colour: red\n",
	})
	out, code := runBinary(t, "validate", bad)
	for _, want := range []string{
		filepath.Join(bad, "a.yaml") + `:4: domain "a": descriptor k: unit "fortnight"`,
		filepath.Join(bad, "b.yml") + ":5: unknown key colour in Descriptor",
		filepath.Join(bad, "b.yml") + `:4: domain "b": descriptor k: unlimited must not have a unit`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if t.Failed() {
		t.Log(out)
	}
	// The server refuses to start on them, with the same errors.
	if out, code := runBinary(t, "--config", bad, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"); code != 1 || !strings.Contains(out, "fortnight") {
		t.Fatalf("serve with bad rules: exit %d\n%s", code, out)
	}
}

func TestCheckCommand(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": coreRules}))
	for i, want := range []int{0, 0, 0, 2} {
		out, code := runBinary(t, "check", "--addr", p.GRPCAddr, "--domain", "shop", "api_key=c1")
		if code != want {
			t.Fatalf("check %d: exit %d, want %d\n%s", i+1, code, want, out)
		}
	}
	if out, code := runBinary(t, "check", "--addr", p.GRPCAddr); code != 64 || !strings.Contains(out, "at least one descriptor") {
		t.Fatalf("check without descriptors: exit %d\n%s", code, out)
	}
	// hits_addend is 32 bits: a larger count is refused, not cut to its low bits (2^32+3 to 3).
	if out, code := runBinary(t, "check", "--addr", p.GRPCAddr, "--domain", "shop", "--hits", "4294967299", "api_key=c2"); code != 64 || !strings.Contains(out, "32 bits") {
		t.Fatalf("check --hits 2^32+3: exit %d\n%s", code, out)
	}
}

// TestUsageErrors: a usage error exits 64 and says what is wrong, whether the flag package
// found it or rls's own checks did.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rlqs", "--rlqs-tick", "0s"}, "--rlqs-tick 0s: want a positive duration"},
		{[]string{"--rlqs", "--rlqs-assignment-ttl", "1500ms"}, "--rlqs-assignment-ttl 1.5s: want a whole number of seconds"},
		{[]string{"serve", "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"--no-such-flag"}, "flag provided but not defined: --no-such-flag"},
	} {
		if out, code := runBinary(t, tc.args...); code != 64 || !strings.Contains(out, tc.want) {
			t.Errorf("rls %s: exit %d, want 64 and %q in:\n%s", strings.Join(tc.args, " "), code, tc.want, out)
		}
	}
}
