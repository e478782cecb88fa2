package service

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestAuthorize checks Options.Authorize: asked about valid requests only, its refusal is the
// answer (gRPC and POST /json, 403) and charges nothing, and without it nothing is asked.
func TestAuthorize(t *testing.T) {
	var asked []string
	f := newFixture(t, Options{Authorize: func(_ context.Context, req *rlsv3.RateLimitRequest) error {
		asked = append(asked, req.GetDomain())
		if req.GetDescriptors()[0].GetIsNegativeHits() {
			return status.Error(codes.PermissionDenied, "caller policy: no refunds here")
		}
		return nil
	}})
	ctx := context.Background()
	refund := desc("key", "k1")
	refund.IsNegativeHits = true
	_, err := f.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{refund}})
	if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "caller policy: no refunds here" {
		t.Fatalf("refund: %v, want the refusal", err)
	}
	// Invalid requests are answered by validation, before the policy is asked.
	_, err = f.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "k1")}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("invalid: %v, want InvalidArgument", err)
	}
	// The refused refund changed nothing: k1 has its 3 per minute, then is over.
	for i := range 3 {
		if r := f.ask(t, desc("key", "k1")); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i+1, r.GetOverallCode())
		}
	}
	if r := f.ask(t, desc("key", "k1")); r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th: %v", r.GetOverallCode())
	}
	if want := "api,api,api,api,api"; strings.Join(asked, ",") != want {
		t.Fatalf("asked about %q, want %q (every valid request, no invalid one)", asked, want)
	}

	post := func(body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		f.svc.JSONHandler().ServeHTTP(rec, r)
		return rec
	}
	rec := post(`{"domain":"api","descriptors":[{"entries":[{"key":"key","value":"k2"}],"isNegativeHits":true}]}`)
	if b, _ := io.ReadAll(rec.Body); rec.Code != http.StatusForbidden || !strings.Contains(string(b), "no refunds here") {
		t.Fatalf("/json refund: %d %s, want 403 with the reason", rec.Code, b)
	}
	if rec := post(`{"domain":"api","descriptors":[{"entries":[{"key":"key","value":"k2"}]}]}`); rec.Code != http.StatusOK {
		t.Fatalf("/json allowed: %d", rec.Code)
	}
}

func TestAuthorizeOtherErrorsPassThrough(t *testing.T) {
	f := newFixture(t, Options{Authorize: func(context.Context, *rlsv3.RateLimitRequest) error {
		return errors.New("plain")
	}})
	if _, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "k")}}); err == nil || err.Error() != "plain" {
		t.Fatalf("got %v", err)
	}
}
