package integration

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"golang.org/x/net/http2"

	"github.com/rls-project/rls/internal/redistest"
)

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

// With the default failure mode and Redis gone, every request answers UNAVAILABLE, whatever
// its number of descriptors, and the client never sees Redis's address.
func TestServiceBackendDownManyDescriptors(t *testing.T) {
	r := redistest.Start(t)
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}),
		"--backend", "redis", "--redis-url", r.URL(), "--redis-timeout", "100ms")
	c := p.client(t)
	ctx := ctxT(t)
	if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("user", "u"), svcDesc("ip", "i")}}); err != nil {
		t.Fatalf("Redis up: %v", err)
	}
	r.Kill()
	for n := 1; n <= 3; n++ {
		ds := []*ratelimitv3.RateLimitDescriptor{svcDesc("user", "u"), svcDesc("ip", "i"), svcDesc("tenant", "t")}[:n]
		for i := range 3 {
			_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: ds})
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.Unavailable || !strings.HasPrefix(msg, "rate limit backend unavailable") || strings.Contains(msg, "127.0.0.1") {
				t.Fatalf("%d descriptors, call %d: %v, want UNAVAILABLE without addresses", n, i+1, err)
			}
		}
	}
	if out := p.Output(); strings.Contains(out, "panic") {
		t.Fatalf("rls logged a panic:\n%s", out)
	}
}

// A cost above the burst is never told to retry now; /json refuses what is not JSON; a
// detailed_metric rule adds at most 100 series of values.
func TestServiceBounds(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}))
	c := p.client(t)
	ctx := ctxT(t)

	big := svcDesc("user", "big")
	big.HitsAddend = wrapperspb.UInt64(5)
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{big}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].GetDurationUntilReset().AsDuration() <= 0 {
		t.Fatalf("cost 5 over a burst of 3: %v %v, want OVER_LIMIT with a wait", resp, err)
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
