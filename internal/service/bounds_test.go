package service

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/rlstest"
)

// wireEntry encodes a descriptor entry.
func wireEntry(k, v string) []byte {
	var e []byte
	e = protowire.AppendTag(e, 1, protowire.BytesType)
	e = protowire.AppendString(e, k)
	e = protowire.AppendTag(e, 2, protowire.BytesType)
	return protowire.AppendString(e, v)
}

// wireRequest encodes a request of domain "api" with descs, each an encoded descriptor.
func wireRequest(descs ...[]byte) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "api")
	for _, d := range descs {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

func wireDescriptor(entries ...[]byte) []byte {
	var d []byte
	for _, e := range entries {
		d = protowire.AppendTag(d, 1, protowire.BytesType)
		d = protowire.AppendBytes(d, e)
	}
	return d
}

// A request crossing a bound is refused while it is decoded, with the reason validation gives
// for the same request decoded whole, and without building what lies past the bound: 4 MiB of
// empty descriptors (two million of them) allocates next to nothing.
func TestUnmarshalStopsAtBounds(t *testing.T) {
	many := func(n int, b []byte) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = b
		}
		return out
	}
	ok := wireEntry("key", "v")
	tests := map[string][]byte{
		"descriptors": wireRequest(many(limit.MaxDescriptors+1, wireDescriptor(ok))...),
		"entries":     wireRequest(wireDescriptor(ok), wireDescriptor(many(limit.MaxEntries+3, ok)...)),
		"key":         wireRequest(wireDescriptor(ok), wireDescriptor(ok, wireEntry(strings.Repeat("k", limit.MaxKeyBytes+1), "v"))),
		"value":       wireRequest(wireDescriptor(ok, wireEntry("key", strings.Repeat("v", limit.MaxValueBytes+1)))),
		"domain": protowire.AppendString(protowire.AppendTag(wireRequest(wireDescriptor(ok)), 1, protowire.BytesType),
			strings.Repeat("d", limit.MaxValueBytes+1)),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			var whole rlsv3.RateLimitRequest
			if err := proto.Unmarshal(b, &whole); err != nil {
				t.Fatal(err)
			}
			want := validate(&whole)
			if want == nil {
				t.Fatal("validate accepts the request decoded whole")
			}
			var m rlsv3.RateLimitRequest
			err := UnmarshalRequest(b, &m)
			var be *boundError
			if !errors.As(err, &be) || be.reason != want.Error() {
				t.Fatalf("UnmarshalRequest: %v, want the bound error %q", err, want)
			}
		})
	}

	// A string past its bound that a later occurrence of its field replaces is no error, as
	// protobuf keeps the last one.
	replaced := wireRequest(wireDescriptor(append(wireEntry("key", strings.Repeat("v", limit.MaxValueBytes+1)),
		protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "short")...)))
	var r rlsv3.RateLimitRequest
	if err := UnmarshalRequest(replaced, &r); err != nil || r.Descriptors[0].Entries[0].Value != "short" {
		t.Fatalf("a long value replaced by a short one: %v %v", &r, err)
	}

	huge := make([]byte, 0, 4<<20)
	for len(huge) < 4<<20-2 {
		huge = protowire.AppendTag(huge, 2, protowire.BytesType)
		huge = protowire.AppendVarint(huge, 0)
	}
	var m rlsv3.RateLimitRequest
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := UnmarshalRequest(huge, &m)
	runtime.ReadMemStats(&after)
	if want := tooManyDescriptors(len(huge) / 2); err == nil || err.Error() != want {
		t.Fatalf("4 MiB of empty descriptors: %v, want %q", err, want)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("4 MiB of empty descriptors allocated %d bytes before being refused", got)
	}
}

// Through the codec of RegisterServer's handler the bound error becomes the
// INVALID_ARGUMENT, not a codec failure (which gRPC answers INTERNAL).
func TestCodecBoundIsInvalidArgument(t *testing.T) {
	b := wireRequest(wireDescriptor(wireEntry("key", strings.Repeat("v", limit.MaxValueBytes+1))))
	in := boundedRequest{req: new(rlsv3.RateLimitRequest)}
	if err := Codec().Unmarshal(memSlice(b), &in); err != nil {
		t.Fatalf("codec: %v", err)
	}
	if status.Code(in.err) != codes.InvalidArgument || !strings.Contains(in.err.Error(), "value longer than") {
		t.Fatalf("bound error %v, want InvalidArgument: value longer than", in.err)
	}
	in = boundedRequest{req: new(rlsv3.RateLimitRequest)}
	if err := Codec().Unmarshal(memSlice(wireRequest(wireDescriptor(wireEntry("key", "v")))), &in); err != nil || in.err != nil || in.req.Descriptors[0].Entries[0].Value != "v" {
		t.Fatalf("a valid request: %v %v %v", err, in.err, in.req)
	}
}

func postJSON(h http.Handler, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// POST /json refuses bodies past their bounds, counted while scanned, with validation's reasons.
func TestJSONBounds(t *testing.T) {
	f := newFixture(t, Options{MaxJSONBytes: 64 << 10})
	h := f.svc.JSONHandler()
	descs := func(n int, d string) string {
		return `{"domain":"api","descriptors":[` + strings.TrimSuffix(strings.Repeat(d+",", n), ",") + `]}`
	}
	entry := `{"key":"key","value":"v"}`
	tests := []struct {
		name, body string
		code       int
		want       string
	}{
		{"descriptors", descs(limit.MaxDescriptors+1, `{}`), 400, tooManyDescriptors(limit.MaxDescriptors + 1)},
		{"many empty descriptors", descs(20000, `{}`), 400, tooManyDescriptors(20000)},
		{"entries", descs(2, `{"entries":[`+strings.TrimSuffix(strings.Repeat(entry+",", limit.MaxEntries+1), ",")+`]}`), 400, tooManyEntries(0, limit.MaxEntries+1)},
		{"nesting", `{"domain":"api","descriptors":[{"entries":[{"key":[[[[[[[[[[]]]]]]]]]]}]}]}`, 400, "JSON nested deeper than 8"},
		{"too large", descs(1, `{"entries":[{"key":"key","value":"`+strings.Repeat("v", 64<<10)+`"}]}`), 413, "the body is over 65536 bytes"},
		{"valid", descs(2, `{"entries":[`+entry+`]}`), 200, `"overallCode":"OK"`},
		{"not JSON", `{"domain":`, 400, "invalid RateLimitRequest JSON"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := postJSON(h, tc.body)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
				t.Fatalf("%d %q, want %d %q", w.Code, w.Body.String(), tc.code, tc.want)
			}
		})
	}
}

const monthlyRules = `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: month, requests_per_unit: 3, algorithm: fixed_window}
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 3}
`

func newMonthlyFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(monthlyRules)})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, opts)
	f.svc.SetRules(rs)
	return f
}

func withOverride(d *ratelimitv3.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	return d
}

// An override never touches a rule's state: a check (hits_addend 0) with an override of
// 1000/SECOND on a monthly fixed window's entries once wiped the month's window, so the next 3
// were admitted again.
func TestOverrideCannotResetRule(t *testing.T) {
	for _, algo := range []string{"fixed_window", "gcra", "sliding_window", "sliding_log"} {
		t.Run(algo, func(t *testing.T) {
			f := newFixture(t, Options{})
			rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(strings.Replace(monthlyRules, "fixed_window", algo, 1))})
			if err != nil {
				t.Fatal(err)
			}
			f.svc.SetRules(rs)
			for i := range 3 {
				if r := f.ask(t, desc("tenant", "t")); codesOf(r) != "OK OK" {
					t.Fatalf("request %d: %v", i+1, r)
				}
			}
			if r := f.ask(t, desc("tenant", "t")); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
				t.Fatalf("4th: %v", r)
			}
			o := withOverride(desc("tenant", "t"), 1000, typev3.RateLimitUnit_SECOND)
			o.HitsAddend = wrapperspb.UInt64(0)
			if r := f.ask(t, o); codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 1000 {
				t.Fatalf("the override's check: %v, want OK with 1000 remaining in its own state", r)
			}
			f.clock = f.clock.Add(2 * time.Second)
			for i := range 3 {
				if r := f.ask(t, desc("tenant", "t")); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
					t.Fatalf("after the override, request %d: %v, want the month still spent", i+1, r)
				}
			}
		})
	}
}

// Requests with and without an override count apart, and two overrides of the same entries
// count apart unless they ask for the same limit.
func TestOverridesCountApart(t *testing.T) {
	f := newMonthlyFixture(t, Options{})
	perMin := func() *ratelimitv3.RateLimitDescriptor {
		return withOverride(desc("key", "k"), 2, typev3.RateLimitUnit_MINUTE)
	}
	for i := range 2 {
		if r := f.ask(t, perMin()); codesOf(r) != "OK OK" {
			t.Fatalf("override request %d: %v", i+1, r)
		}
	}
	if r := f.ask(t, perMin()); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("3rd override request: %v", r)
	}
	// The rule's 3 per minute are untouched.
	for i := range 3 {
		if r := f.ask(t, desc("key", "k")); codesOf(r) != "OK OK" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
			t.Fatalf("rule request %d: %v", i+1, r)
		}
	}
	// Another override of the same entries has its own state, and cannot re-express the first.
	if r := f.ask(t, withOverride(desc("key", "k"), 5, typev3.RateLimitUnit_MINUTE)); codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("5/minute override: %v", r)
	}
	if r := f.ask(t, perMin()); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("2/minute override after the 5/minute one: %v", r)
	}
}

func TestOverridePolicy(t *testing.T) {
	o := func() *ratelimitv3.RateLimitDescriptor {
		return withOverride(desc("key", "p"), 1, typev3.RateLimitUnit_HOUR)
	}
	t.Run("refuse", func(t *testing.T) {
		f := newMonthlyFixture(t, Options{Overrides: OverridePolicy{Refuse: true}})
		_, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "p"), o()}})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "descriptors[1].limit: limit overrides are refused") {
			t.Fatalf("got %v, want PermissionDenied naming descriptors[1]", err)
		}
		if r := f.ask(t, desc("key", "p")); codesOf(r) != "OK OK" {
			t.Fatalf("without an override: %v", r)
		}
	})
	t.Run("ignore", func(t *testing.T) {
		f := newMonthlyFixture(t, Options{Overrides: OverridePolicy{Ignore: true}})
		for i := range 3 {
			if r := f.ask(t, o()); codesOf(r) != "OK OK" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 3 {
				t.Fatalf("request %d: %v, want the rule's 3/minute", i+1, r)
			}
		}
		if r := f.ask(t, desc("key", "p")); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
			t.Fatalf("4th: %v", r)
		}
	})
	t.Run("max period", func(t *testing.T) {
		f := newMonthlyFixture(t, Options{Overrides: OverridePolicy{MaxPeriod: 24 * time.Hour}})
		if r := f.ask(t, withOverride(desc("key", "p"), 1, typev3.RateLimitUnit_DAY)); codesOf(r) != "OK OK" {
			t.Fatalf("a day: %v", r)
		}
		long := withOverride(desc("key", "p"), 1, typev3.RateLimitUnit_HOUR)
		long.Limit.UnitMultiplier = wrapperspb.UInt32(25)
		_, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{long}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "a period of 25h0m0s is longer than --override-max-period 24h0m0s") {
			t.Fatalf("25 hours: %v", err)
		}
	})
	t.Run("unknown domain", func(t *testing.T) {
		f := newMonthlyFixture(t, Options{})
		for range 3 {
			resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "nope",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{withOverride(desc("key", "p"), 0, typev3.RateLimitUnit_HOUR)}})
			if err != nil || codesOf(resp) != "OK OK" || resp.Statuses[0].CurrentLimit != nil {
				t.Fatalf("an override of 0/hour in a domain no rule defines: %v %v, want OK with no limit", resp, err)
			}
		}
	})
}

// blocking holds every decision until release is closed.
type blocking struct {
	backend.Backend
	entered chan struct{}
	release chan struct{}
}

func (b blocking) Decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.Backend.Decide(ctx, reqs, out)
}

// Requests past MaxInflightBytes are shed through the failure mode and counted; the ones in
// flight, and every one after them, are decided as usual.
func TestInflightBound(t *testing.T) {
	mem, err := backend.NewMemory(backend.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := blocking{Backend: mem, entered: make(chan struct{}, 64), release: make(chan struct{})}
	req := func(v string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("ip", v)}}
	}
	weight := requestWeight(req("a"))
	f := newFixture(t, Options{Backend: b, MaxInflightBytes: 3 * weight})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		wg.Go(func() {
			_, err := f.svc.ShouldRateLimit(context.Background(), req(fmt.Sprint(i)))
			errs <- err
		})
	}
	for range 3 {
		<-b.entered
	}
	for range 5 {
		_, err := f.svc.ShouldRateLimit(context.Background(), req("z"))
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "too many requests in flight") {
			t.Fatalf("past the bound: %v, want UNAVAILABLE: too many requests in flight", err)
		}
	}
	// A request with nothing to decide holds nothing and is answered.
	if r := f.ask(t, desc("unknown", "x")); codesOf(r) != "OK OK" {
		t.Fatalf("no rule: %v", r)
	}
	close(b.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a request in flight: %v", err)
		}
	}
	if got := rlstest.CounterValue(t, f.svc.metrics.inflight); got != 5 {
		t.Fatalf("rls_inflight_shed_total %v, want 5", got)
	}
	if n := f.svc.inflight.Load(); n != 0 {
		t.Fatalf("%d bytes still counted in flight", n)
	}
	go func() {
		for range b.entered {
		}
	}()
	if r := f.ask(t, desc("ip", "z")); codesOf(r) != "OK OK" {
		t.Fatalf("after: %v", r)
	}
	// Under failure_mode allow, a shed request is admitted, as for any unavailability.
	fa := newFixture(t, Options{Backend: blocking{Backend: mem, entered: make(chan struct{}, 64), release: make(chan struct{})}, MaxInflightBytes: 1, FailureMode: FailAllow})
	if r := fa.ask(t, desc("ip", "y")); codesOf(r) != "OK OK" {
		t.Fatalf("failure mode allow: %v", r)
	}
}

func memSlice(b []byte) mem.BufferSlice { return mem.BufferSlice{mem.SliceBuffer(b)} }

// CodecMax refuses a request over its bound before decoding it, RESOURCE_EXHAUSTED as gRPC's
// own bound answers, for servers whose gRPC bound is higher for RLQS's sake.
func TestCodecMax(t *testing.T) {
	b := wireRequest(wireDescriptor(wireEntry("key", strings.Repeat("v", 2000))))
	in := boundedRequest{req: new(rlsv3.RateLimitRequest)}
	if err := CodecMax(1024).Unmarshal(memSlice(b), &in); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("a request of %d bytes: at most 1024 (--max-request-bytes)", len(b)); status.Code(in.err) != codes.ResourceExhausted || status.Convert(in.err).Message() != want {
		t.Fatalf("got %v, want ResourceExhausted %q", in.err, want)
	}
	if in.req.GetDomain() != "" {
		t.Fatalf("decoded %v", in.req)
	}
	in = boundedRequest{req: new(rlsv3.RateLimitRequest)}
	if err := CodecMax(len(b)).Unmarshal(memSlice(b), &in); err != nil || in.err != nil || in.req.GetDomain() != "api" {
		t.Fatalf("at the bound: %v %v %v", err, in.err, in.req)
	}
}
