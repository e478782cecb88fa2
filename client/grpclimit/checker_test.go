package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/grpclimit"
)

// player is a client.Checker playing rls: it answers each check with answer and keeps the
// descriptors it was asked about.
type player struct {
	mu     sync.Mutex
	asked  []string
	answer func(descs []client.Descriptor) (client.Decision, error)
}

func (p *player) checker() client.Checker {
	return client.CheckerFunc(func(ctx context.Context, descs ...client.Descriptor) (client.Decision, error) {
		p.mu.Lock()
		p.asked = append(p.asked, fmt.Sprint(descs))
		p.mu.Unlock()
		return p.answer(descs)
	})
}

func (p *player) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.asked
	p.asked = nil
	return a
}

// over answers every check denied on its first descriptor, 1 per hour, for 90 more seconds.
func over(descs []client.Descriptor) (client.Decision, error) {
	return client.NewDecision(client.Status{Descriptor: descs[0], OverLimit: true, Wait: 90 * time.Second,
		Limit: client.Limit{Name: "one", Requests: 1, Window: time.Hour}}), nil
}

// calls makes a unary Check and a streaming Watch (its first message), and returns the header
// metadata and the status of each.
func calls(t *testing.T, hc healthpb.HealthClient) (uh, sh metadata.MD, unary, stream error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(withKey("k"), 10*time.Second)
	defer cancel()
	_, unary = hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&uh))
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, stream = w.Recv()
	sh, _ = w.Header()
	return uh, sh, unary, stream
}

// TestMethods: Options.Methods chooses each method's descriptors, the full method name before
// its service's entry before New's descriptors; a method mapped to none is not checked.
func TestMethods(t *testing.T) {
	p := &player{answer: func(descs []client.Descriptor) (client.Decision, error) { return client.NewDecision(), nil }}
	key := grpclimit.By(grpclimit.Metadata("x-api-key", "api_key"))
	lim := grpclimit.New(p.checker(), grpclimit.Options{Methods: map[string][]grpclimit.Descriptor{
		"/grpc.health.v1.Health/Watch": {grpclimit.By(grpclimit.Static("watch", "1")), key},
		"/grpc.health.v1.Health/List":  {},
	}}, key, grpclimit.By(grpclimit.Method()))
	hc := serve(t, lim)
	ctx := withKey("k")
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := hc.List(ctx, &healthpb.HealthListRequest{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"[api_key=k method=/grpc.health.v1.Health/Check]", "[watch=1 api_key=k]"}
	if got := p.take(); !slices.Equal(got, want) {
		t.Errorf("asked %q, want %q", got, want)
	}

	// A service's entry covers its methods; another service keeps New's descriptors.
	lim = grpclimit.New(p.checker(), grpclimit.Options{Methods: map[string][]grpclimit.Descriptor{
		"/grpc.health.v1.Health/": {grpclimit.By(grpclimit.Generic("health"))},
		"/other.Service/":         {},
	}}, key)
	if _, err := serve(t, lim).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := p.take(); !slices.Equal(got, []string{"[generic_key=health]"}) {
		t.Errorf("asked %q, want the service's descriptor", got)
	}
}

// TestDeny: a denied unary call and stream end with Denied's RESOURCE_EXHAUSTED by default,
// with the rate-limit headers and retry-after; Options.Deny chooses the status (nil admits),
// and gets the method.
func TestDeny(t *testing.T) {
	p := &player{answer: over}
	uh, sh, unary, stream := calls(t, serve(t, grpclimit.New(p.checker(), grpclimit.Options{}, grpclimit.By(grpclimit.Method()))))
	for name, c := range map[string]struct {
		err error
		hdr metadata.MD
		m   string
	}{"unary": {unary, uh, "/grpc.health.v1.Health/Check"}, "stream": {stream, sh, "/grpc.health.v1.Health/Watch"}} {
		st := status.Convert(c.err)
		if st.Code() != codes.ResourceExhausted || st.Message() != "rate limit exceeded: method="+c.m {
			t.Errorf("%s: %v", name, c.err)
		}
		var retry *errdetails.RetryInfo
		var quota *errdetails.QuotaFailure
		for _, d := range st.Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				retry = d
			case *errdetails.QuotaFailure:
				quota = d
			}
		}
		if retry.GetRetryDelay().AsDuration() != 90*time.Second || len(quota.GetViolations()) != 1 ||
			quota.Violations[0].Subject != "method="+c.m || quota.Violations[0].Description != "one: 1 requests per 1h0m0s" {
			t.Errorf("%s: details %v %v", name, retry, quota)
		}
		if got := strings.Join(c.hdr.Get("retry-after"), ""); got != "90" {
			t.Errorf("%s: retry-after %q", name, got)
		}
		if got := strings.Join(c.hdr.Get("ratelimit"), ""); got != `"one";r=0;t=90` {
			t.Errorf("%s: ratelimit %q", name, got)
		}
	}

	var denied []string
	var mu sync.Mutex
	lim := grpclimit.New(p.checker(), grpclimit.Options{Headers: client.HeadersNone,
		Deny: func(ctx context.Context, method string, d client.Decision) error {
			mu.Lock()
			denied = append(denied, method)
			mu.Unlock()
			if strings.HasSuffix(method, "/Watch") {
				return nil // streams are only counted
			}
			return status.Errorf(codes.PermissionDenied, "%s over %s", d.Descriptor, d.Limit.Name)
		}}, grpclimit.By(grpclimit.Metadata("x-api-key", "api_key")))
	uh, sh, unary, stream = calls(t, serve(t, lim))
	if st := status.Convert(unary); st.Code() != codes.PermissionDenied || st.Message() != "api_key=k over one" {
		t.Errorf("unary with Options.Deny: %v", unary)
	}
	if stream != nil {
		t.Errorf("stream with Options.Deny admitting: %v", stream)
	}
	if want := []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}; !slices.Equal(denied, want) {
		t.Errorf("Options.Deny got %q, want %q", denied, want)
	}
	for _, h := range []metadata.MD{uh, sh} {
		if got := h.Get("retry-after"); len(got) != 1 || got[0] != "90" || len(h.Get("ratelimit")) != 0 {
			t.Errorf("HeadersNone: header %v, want retry-after 90 only", h)
		}
	}
}

// TestFailure: under an outage of rls played by the Checker, each failure policy answers unary
// calls and streams alike (fail open OK, fail closed RESOURCE_EXHAUSTED with RetryInfo 1s,
// FailError UNAVAILABLE), invalid descriptors end INTERNAL, and Options.Error chooses the status
// itself (nil fails open).
func TestFailure(t *testing.T) {
	outage := errors.New("connection refused")
	failOpen := func(ctx context.Context, method string, err error) error {
		if !errors.Is(err, outage) || method == "" {
			t.Errorf("Options.Error got %q %v", method, err)
		}
		return nil
	}
	failClosed := func(ctx context.Context, method string, err error) error {
		return status.Error(codes.Aborted, "no decision for "+method)
	}
	for _, tc := range []struct {
		name    string
		answer  func([]client.Descriptor) (client.Decision, error)
		onError func(ctx context.Context, method string, err error) error
		want    codes.Code
	}{
		{"fail open", func([]client.Descriptor) (client.Decision, error) { return client.FailAllow.Answer(outage) }, nil, codes.OK},
		{"fail closed", func([]client.Descriptor) (client.Decision, error) { return client.FailDeny.Answer(outage) }, nil, codes.ResourceExhausted},
		{"fail error", func([]client.Descriptor) (client.Decision, error) { return client.FailError.Answer(outage) }, nil, codes.Unavailable},
		{"invalid", func([]client.Descriptor) (client.Decision, error) {
			return client.Decision{}, fmt.Errorf("%w: value too long", client.ErrInvalid)
		}, nil, codes.Internal},
		{"Options.Error opens", func([]client.Descriptor) (client.Decision, error) { return client.FailError.Answer(outage) }, failOpen, codes.OK},
		{"Options.Error closes", func([]client.Descriptor) (client.Decision, error) { return client.FailError.Answer(outage) }, failClosed, codes.Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &player{answer: tc.answer}
			lim := grpclimit.New(p.checker(), grpclimit.Options{Error: tc.onError}, grpclimit.By(grpclimit.Method()))
			_, _, unary, stream := calls(t, serve(t, lim))
			for name, err := range map[string]error{"unary": unary, "stream": stream} {
				if status.Code(err) != tc.want {
					t.Errorf("%s: %v, want %v", name, err, tc.want)
				}
				if tc.want == codes.Aborted && !strings.HasPrefix(status.Convert(err).Message(), "no decision for /grpc.health.v1.Health/") {
					t.Errorf("%s: %v", name, err)
				}
				for _, d := range status.Convert(err).Details() {
					if r, ok := d.(*errdetails.RetryInfo); ok && r.RetryDelay.AsDuration() != time.Second {
						t.Errorf("%s: RetryInfo %v", name, r)
					}
				}
			}
			if got := p.take(); len(got) != 2 {
				t.Errorf("asked %q, want both calls", got)
			}
		})
	}
}
