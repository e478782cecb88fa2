package integration

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
)

// emptyDescriptors encodes a request of domain "hard" followed by empty descriptors up to
// size bytes.
func emptyDescriptors(size int) []byte {
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "hard")
	for len(b)+2 <= size {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}

// Hostile requests cost rls no more than a few MB, whatever their size: a 4 MiB message is
// refused from its length prefix before it is read, one under the bound full of empty
// descriptors is refused as it is decoded, and /json bodies alike; 8 of each at once, while an
// ordinary client beside them is answered as usual. (Before these bounds one 4 MiB request
// took rls from 28 MB to 206 MB, 8 at once to 1.5 GB.) The binary is built without the race
// detector, whose shadow memory would hide what rls itself holds; RLS_TEST_BINARY runs
// another build instead, e.g. an earlier revision's for a before-and-after figure.
func TestHostileRequestsBounded(t *testing.T) {
	bin := os.Getenv("RLS_TEST_BINARY")
	if bin == "" {
		bin = rlstest.BuildBinary(t, false)
	}
	rules := writeRules(t, map[string]string{"hard.yaml": svcRules})
	p := rlstest.Launch(t, bin, nil, "--config", rules, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "")
	p.WaitReady(t)
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	ask := func(user string) rlsv3.RateLimitResponse_Code {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("user", user)}})
		if err != nil {
			t.Errorf("ordinary request: %v", err)
			return 0
		}
		return resp.OverallCode
	}
	postJSON := func(body []byte) (int, string) {
		resp, err := http.Post("http://"+p.HTTPAddr+"/json", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	// Warm up every path once, so the baseline holds what ordinary traffic needs.
	for i := range 3 {
		ask(fmt.Sprint("warm", i))
		postJSON([]byte(`{"domain":"hard","descriptors":[{"entries":[{"key":"user","value":"warm"}]}]}`))
	}
	idle, _ := p.Memory(t)
	p.ResetPeakMemory(t)

	const maxRequest = 64 << 10 // --max-request-bytes's default
	huge := emptyDescriptors(4 << 20)
	under := emptyDescriptors(maxRequest - 16)
	jsonBody := []byte(`{"domain":"hard","descriptors":[` + strings.Repeat(`{},`, (maxRequest-64)/3) + `{}]}`)
	jsonHuge := []byte(`{"domain":"hard","descriptors":[` + strings.Repeat(`{},`, (1<<20)/3) + `{}]}`)
	underN := (len(under) - 6) / 2
	attacks := []struct {
		name string
		run  func() error
	}{
		{"4 MiB message", func() error {
			var out []byte
			err := conn.Invoke(ctxT(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &huge, &out, grpc.ForceCodecV2(svcRawCodec{}))
			if status.Code(err) != codes.ResourceExhausted {
				return fmt.Errorf("got %v, want ResourceExhausted", err)
			}
			return nil
		}},
		{"64 KiB of empty descriptors", func() error {
			var out []byte
			err := conn.Invoke(ctxT(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &under, &out, grpc.ForceCodecV2(svcRawCodec{}))
			if want := fmt.Sprintf("%d descriptors: at most 64", underN); status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
				return fmt.Errorf("got %v, want InvalidArgument %q", err, want)
			}
			return nil
		}},
		{"64 KiB /json of empty descriptors", func() error {
			if code, body := postJSON(jsonBody); code != 400 || !strings.Contains(body, "descriptors: at most 64") {
				return fmt.Errorf("got %d %q, want 400: descriptors: at most 64", code, body)
			}
			return nil
		}},
		{"1 MiB /json", func() error {
			if code, body := postJSON(jsonHuge); code != 413 {
				return fmt.Errorf("got %d %q, want 413", code, body)
			}
			return nil
		}},
	}
	for _, a := range attacks {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if err := a.run(); err != nil {
					t.Errorf("%s: %v", a.name, err)
				}
			})
		}
		// An ordinary client beside them: 3 per minute, then OVER_LIMIT.
		user := "beside " + a.name
		for i := range 4 {
			want := rlsv3.RateLimitResponse_OK
			if i == 3 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if got := ask(user); got != want {
				t.Errorf("%s: ordinary request %d: %v, want %v", a.name, i+1, got, want)
			}
		}
		wg.Wait()
		_, peak := p.Memory(t)
		t.Logf("%s, 8 at once: peak RSS %.1f MB, idle %.1f MB", a.name, float64(peak)/1e6, float64(idle)/1e6)
		if grew := peak - idle; grew > 16<<20 {
			t.Errorf("%s, 8 at once: peak RSS grew by %.1f MB over idle %.1f MB", a.name, float64(grew)/1e6, float64(idle)/1e6)
		}
	}
}

// The reported case: on a monthly fixed window, after 3 OK and 1 OVER_LIMIT, one check
// (hits_addend 0) with an override of 1000/SECOND on the same entries wiped the month's window
// in Redis, and the next 3 were OK again. An override now has state of its own.
// Calls open at once over all connections are bounded (--grpc-max-calls): gRPC reads a call's
// message before any handler runs, so calls that never finish sending would otherwise hold up
// to --max-request-bytes each, on every stream of every connection. Past the bound a call is
// refused as it opens; once calls end their places are free again.
func TestGRPCMaxCalls(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}), "--grpc-max-calls", "3")
	c := p.client(t)
	ask := func() error {
		_, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("ip", "1")}})
		return err
	}
	if err := ask(); err != nil {
		t.Fatal(err)
	}
	// Three calls that send their headers and never their message, one per connection.
	var held []*h2Conn
	for range 3 {
		h := dialH2(t, p.GRPCAddr)
		h.openCall()
		held = append(held, h)
	}
	// The third opening races with the next call: wait until the server counts all three.
	deadline := time.Now().Add(10 * time.Second)
	for metricValues(t, p.HTTPAddr)["rls_grpc_calls_open"] != "3" {
		if time.Now().After(deadline) {
			t.Fatalf("rls_grpc_calls_open %q, want 3", metricValues(t, p.HTTPAddr)["rls_grpc_calls_open"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 2 {
		if err := ask(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "too many calls open") {
			t.Fatalf("a fourth call: %v, want UNAVAILABLE: too many calls open", err)
		}
	}
	if got := metricValues(t, p.HTTPAddr)["rls_grpc_calls_refused_total"]; got != "2" {
		t.Fatalf("rls_grpc_calls_refused_total %q, want 2", got)
	}
	// A held call that finishes frees its place, and so does one whose connection closes.
	if code := held[0].finishCall(&rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("ip", "2")}}); code != "0" {
		t.Fatalf("the held call finished with grpc-status %s", code)
	}
	held[1].conn.Close()
	for metricValues(t, p.HTTPAddr)["rls_grpc_calls_open"] != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("rls_grpc_calls_open %q, want 1", metricValues(t, p.HTTPAddr)["rls_grpc_calls_open"])
		}
		time.Sleep(20 * time.Millisecond)
	}
	for range 5 {
		if err := ask(); err != nil {
			t.Fatalf("with places free: %v", err)
		}
	}
}

// With RLQS served, gRPC's one bound on messages is --rlqs-max-report-bytes (usage reports
// are larger than requests), and --max-request-bytes still holds for ShouldRateLimit.
func TestMaxRequestBytesWithRLQS(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}), "--rlqs", "--max-request-bytes", "4096")
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tc := range []struct {
		size int
		code codes.Code
		want string
	}{
		{4096, codes.InvalidArgument, "descriptors: at most 64"},
		{4098, codes.ResourceExhausted, "a request of 4098 bytes: at most 4096 (--max-request-bytes)"},
		{2 << 20, codes.ResourceExhausted, "larger than max"},
	} {
		msg := emptyDescriptors(tc.size) // sizes are even: the domain's 6 bytes, 2 a descriptor
		var out []byte
		err := conn.Invoke(ctxT(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &msg, &out, grpc.ForceCodecV2(svcRawCodec{}))
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d bytes: %v, want %v %q", len(msg), err, tc.code, tc.want)
		}
	}
}

func TestOverrideCannotResetMonthlyWindow(t *testing.T) {
	r := redistest.Start(t)
	rules := writeRules(t, map[string]string{"m.yaml": `
domain: m
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 3, algorithm: fixed_window}
`})
	p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", r.URL())
	c := p.client(t)
	ask := func(d *ratelimitv3.RateLimitDescriptor) rlsv3.RateLimitResponse_Code {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "m", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	for i := range 4 {
		want := rlsv3.RateLimitResponse_OK
		if i == 3 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if got := ask(svcDesc("tenant", "t")); got != want {
			t.Fatalf("request %d: %v, want %v", i+1, got, want)
		}
	}
	o := svcDesc("tenant", "t")
	o.HitsAddend = wrapperspb.UInt64(0)
	o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_SECOND}
	if got := ask(o); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the override's check: %v", got)
	}
	for i := range 3 {
		if got := ask(svcDesc("tenant", "t")); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("after the override, request %d: %v, want OVER_LIMIT: the month stays spent", i+1, got)
		}
	}
}

const svcRules = `
domain: hard
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100}
`

func svcDesc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// A cost above the burst is told no wait (none admits it); /json refuses what is not JSON; a
// detailed_metric rule adds at most 100 series of values.
func TestServiceBounds(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}))
	c := p.client(t)
	ctx := ctxT(t)

	big := svcDesc("user", "big")
	big.HitsAddend = wrapperspb.UInt64(5)
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{big}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].GetDurationUntilReset() != nil {
		t.Fatalf("cost 5 over a burst of 3: %v %v, want OVER_LIMIT with no duration_until_reset (no wait admits it)", resp, err)
	}

	post := func(contentType string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.HTTPAddr+"/json",
			strings.NewReader(`{"domain":"hard","descriptors":[{"entries":[{"key":"ip","value":"x"}]}]}`))
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for ct, want := range map[string]int{"text/plain": 415, "application/x-www-form-urlencoded": 415, "application/json": 200} {
		if got := post(ct); got != want {
			t.Errorf("/json with %s: %d, want %d", ct, got, want)
		}
	}

	for i := range 150 {
		if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("tenant", "t"+strings.Repeat("x", i))}}); err != nil {
			t.Fatal(err)
		}
	}
	mresp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	values, overflow := 0, false
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "rls_hits_total{") && strings.Contains(line, `rule="tenant=`) {
			values++
		}
		if strings.HasPrefix(line, "rls_hits_total{") && strings.Contains(line, `rule="tenant/_overflow_"`) && strings.HasSuffix(line, " 50") {
			overflow = true
		}
	}
	if values != 100 || !overflow {
		t.Fatalf("%d tenant series (want 100) and overflow counting 50: %v", values, overflow)
	}
	if !strings.Contains(p.Output(), "detailed_metric") {
		t.Fatalf("no warning logged:\n%s", p.Output())
	}
}

// svcRawCodec sends hand-made bytes.
type svcRawCodec struct{}

func (svcRawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (svcRawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (svcRawCodec) Name() string { return "proto" }

// Invalid UTF-8 in a value is bad input: INVALID_ARGUMENT naming the field. This needs the
// server built with grpc.ForceServerCodecV2(service.Codec()).
func TestServiceInvalidUTF8(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}))
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var entry, d, req []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "user")
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, "\xff\xfe")
	d = protowire.AppendTag(d, 1, protowire.BytesType)
	d = protowire.AppendBytes(d, entry)
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendString(req, "hard")
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	req = protowire.AppendBytes(req, d)
	var out []byte
	err = conn.Invoke(ctxT(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &req, &out, grpc.ForceCodecV2(svcRawCodec{}))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "value is not valid UTF-8") {
		t.Fatalf("got %v, want InvalidArgument: value is not valid UTF-8", err)
	}
}

// TestGRPCConnectionBounds: the gRPC listener tells clients, in its HTTP/2 SETTINGS, how many
// calls one connection may carry at once and how large a call's headers may be: gRPC's own
// defaults (no bound on calls, 16 MiB of headers each) let one connection hold any amount of
// memory with calls that never send.
func TestGRPCConnectionBounds(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": coreRules}), "--grpc-max-concurrent-streams", "300")
	conn, err := net.DialTimeout("tcp", p.GRPCAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			continue
		}
		streams, ok1 := sf.Value(http2.SettingMaxConcurrentStreams)
		headers, ok2 := sf.Value(http2.SettingMaxHeaderListSize)
		if !ok1 || streams != 300 || !ok2 || headers != 64<<10 {
			t.Fatalf("server SETTINGS: max concurrent streams %d (sent %v), max header list size %d (sent %v); want 300 and 65536", streams, ok1, headers, ok2)
		}
		return
	}
}
