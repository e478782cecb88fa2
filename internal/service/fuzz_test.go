package service

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// fuzzRules exercise every option a request can reach: lists, replaces, shadow, quota,
// detailed metrics, wildcards, sharing, unlimited, allow-lists and failure modes.
const fuzzRules = rules + `
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: "/api/*"
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5, burst: 8}
  - key: nested
    descriptors:
      - key: inner
        rate_limit: {unit: day, requests_per_unit: 1}
      - key: allow
`

// newFuzzService returns a service as production wires it: memory backend, metrics on a real
// registry, a local fallback, headers on.
func newFuzzService(tb testing.TB) *Service {
	tb.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(fuzzRules)})
	if err != nil {
		tb.Fatal(err)
	}
	now := func() time.Time { return time.Unix(1_800_000_000, 0) }
	mb, err := backend.NewMemory(backend.MemoryOptions{Now: now, MaxKeys: 10_000})
	if err != nil {
		tb.Fatal(err)
	}
	local, _ := backend.NewMemory(backend.MemoryOptions{Now: now, MaxKeys: 1000})
	m, err := NewMetrics(prometheus.NewRegistry(), 0.8)
	if err != nil {
		tb.Fatal(err)
	}
	svc, err := New(rs, Options{Backend: mb, Local: local, Metrics: m, Headers: HeadersDraft, DetailedMetricValues: 5,
		Logger: discardLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	return svc
}

// seedRequests are typical and edge requests, the start of both fuzz corpora.
func seedRequests() []*rlsv3.RateLimitRequest {
	over := desc("key", "o")
	over.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)}
	refund := desc("key", "r")
	refund.HitsAddend = wrapperspb.UInt64(2)
	refund.IsNegativeHits = true
	return []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "k1")}},
		{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("plan", "free"), desc("plan", "gold"), desc("key", "k")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("shadow", "s"), desc("quota", "q"), desc("team", "t-x")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "alice"), desc("path", "/api/v1"), desc("nested", "n", "inner", "i")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{over, refund, desc("open", "x"), desc("nested", "n", "allow", "a")}},
		{Domain: "api", HitsAddend: 100, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "big")}},
		{Domain: "nope", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}},
	}
}

// invalidUTF8 reports whether err is protobuf-go's refusal of invalid UTF-8 in a string.
func invalidUTF8(err error) bool {
	var u interface{ InvalidUTF8() bool }
	return errors.As(err, &u) && u.InvalidUTF8()
}

// FuzzRequest sends arbitrary bytes through the server's codec and ShouldRateLimit. The codec
// must decode exactly what proto.Unmarshal decodes, and also what it refuses only for invalid
// UTF-8; the service must answer every decoded request with a complete response or
// InvalidArgument, never a panic or another code.
func FuzzRequest(f *testing.F) {
	for _, r := range seedRequests() {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	svc := newFuzzService(f)
	c := Codec()
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got rlsv3.RateLimitRequest
		werr := proto.Unmarshal(b, &want)
		// As RegisterServer's handler decodes: a request past a bound is refused as it is
		// decoded, and only a request that validation refuses too may be.
		in := boundedRequest{req: &got}
		err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &in)
		if in.err != nil {
			if status.Code(in.err) != codes.InvalidArgument {
				t.Fatalf("bound error %v, want InvalidArgument", in.err)
			}
			if werr == nil && validate(&want) == nil {
				t.Fatalf("refused while decoding (%v), but the request decoded whole is valid", in.err)
			}
			return
		}
		switch {
		case werr == nil && err != nil:
			t.Fatalf("proto.Unmarshal decodes, the codec refuses: %v", err)
		case werr == nil && !proto.Equal(&want, &got):
			t.Fatalf("the codec decodes\n%v\nproto.Unmarshal\n%v", &got, &want)
		case werr != nil && err == nil && !invalidUTF8(werr):
			t.Fatalf("proto.Unmarshal refuses (%v), the codec decodes %v", werr, &got)
		case err != nil:
			return
		}
		resp, err := svc.ShouldRateLimit(ctx, &got)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("ShouldRateLimit: %v, want OK or InvalidArgument", err)
			}
			return
		}
		if werr != nil {
			// proto.Unmarshal refused a string that a later occurrence of the same field
			// replaced: what is decided must be valid protobuf.
			if _, err := proto.Marshal(&got); err != nil {
				t.Fatalf("a request with invalid UTF-8 (%v) answered %v", err, resp)
			}
		}
		if len(resp.Statuses) != len(got.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(got.Descriptors))
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("response does not marshal: %v", err)
		}
	})
}

// FuzzJSON posts arbitrary bodies to /json: every answer is 200, 429 or 400, never a 5xx.
func FuzzJSON(f *testing.F) {
	for _, r := range seedRequests() {
		b, err := protojsonMarshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	h := newFuzzService(f).JSONHandler()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/json", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest:
		default:
			t.Fatalf("%d %s", rec.Code, strings.TrimSpace(rec.Body.String()))
		}
	})
}

func protojsonMarshal(m proto.Message) ([]byte, error) { return protojson.Marshal(m) }

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
