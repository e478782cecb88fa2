package grpclimit_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/grpclimit"
	"github.com/rls-project/rls/internal/rlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rules = `
domain: grpc
descriptors:
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 2}
  - key: method
    value: /grpc.health.v1.Health/Watch
    rate_limit: {name: watches, unit: hour, requests_per_unit: 1}
  - key: remote_address
    rate_limit: {name: per_peer, unit: hour, requests_per_unit: 100}
`

// serve runs the gRPC health service (a unary Check and a server-streaming Watch) behind the
// interceptors, and returns a client of it.
func serve(t *testing.T, lim *grpclimit.Limiter) healthpb.HealthClient {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.Unary()), grpc.StreamInterceptor(lim.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func newClient(t *testing.T, addr string, policy client.FailurePolicy) *client.Client {
	t.Helper()
	c, err := client.New(addr, client.Options{Domain: "grpc", OnFailure: policy, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func withKey(key string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = cancel // ends with the timeout
	return metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
}

func TestUnary(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	lim := grpclimit.New(newClient(t, p.GRPCAddr, client.FailError), grpclimit.Options{},
		grpclimit.By(grpclimit.Metadata("X-API-Key", "api_key")), grpclimit.By(grpclimit.Peer()))
	hc := serve(t, lim)
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		var hdr metadata.MD
		_, err := hc.Check(withKey("k"), &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
		if got := status.Code(err); got != want {
			t.Fatalf("call %d: %v, want %v", i, err, want)
		}
		// Both descriptors are limited: the key, and the peer (127.0.0.1) under per_peer.
		if got := strings.Join(hdr.Get("ratelimit-policy"), ""); got != `"per_key";q=2;w=3600, "per_peer";q=100;w=3600` {
			t.Errorf("call %d: ratelimit-policy %q", i, got)
		}
		if want != codes.ResourceExhausted {
			continue
		}
		if got := hdr.Get("retry-after"); len(got) != 1 || got[0] != "1800" {
			t.Errorf("retry-after %v", got)
		}
		var retry *errdetails.RetryInfo
		var quota *errdetails.QuotaFailure
		for _, d := range status.Convert(err).Details() {
			switch d := d.(type) {
			case *errdetails.RetryInfo:
				retry = d
			case *errdetails.QuotaFailure:
				quota = d
			}
		}
		if retry == nil || retry.RetryDelay.AsDuration() <= 29*time.Minute || retry.RetryDelay.AsDuration() > 30*time.Minute {
			t.Errorf("RetryInfo %v, want just under 30m", retry)
		}
		if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "api_key=k" ||
			quota.Violations[0].Description != "per_key: 2 requests per 1h0m0s" {
			t.Errorf("QuotaFailure %v", quota)
		}
		if msg := status.Convert(err).Message(); msg != "rate limit exceeded: api_key=k" {
			t.Errorf("message %q", msg)
		}
	}
	// Another key has its own limit; no key at all leaves only the peer's descriptor.
	if _, err := hc.Check(withKey("other"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Error(err)
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Error(err)
	}
}

func TestStream(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	lim := grpclimit.New(newClient(t, p.GRPCAddr, client.FailError), grpclimit.Options{Headers: client.HeadersLegacy},
		grpclimit.By(grpclimit.Method()))
	hc := serve(t, lim)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("first watch: %v", err)
	}
	if hdr, _ := w.Header(); strings.Join(hdr.Get("x-ratelimit-limit"), "") != `1, 1;w=3600;name="watches"` {
		t.Errorf("first watch: header %v", hdr)
	}
	w2, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w2.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("second watch: %v, want ResourceExhausted", err)
	}
	// Unary calls of the same service are another method, not limited.
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Error(err)
	}
}

func TestFailurePolicies(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	addr := p.GRPCAddr
	p.Stop(t)
	for _, tc := range []struct {
		policy client.FailurePolicy
		want   codes.Code
	}{
		{client.FailAllow, codes.OK},
		{client.FailDeny, codes.ResourceExhausted},
		{client.FailError, codes.Unavailable},
	} {
		lim := grpclimit.New(newClient(t, addr, tc.policy), grpclimit.Options{}, grpclimit.By(grpclimit.Method()))
		_, err := serve(t, lim).Check(withKey("k"), &healthpb.HealthCheckRequest{})
		if got := status.Code(err); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.policy, err, tc.want)
		}
		if tc.policy == client.FailDeny {
			for _, d := range status.Convert(err).Details() {
				if r, ok := d.(*errdetails.RetryInfo); ok && r.RetryDelay.AsDuration() != time.Second {
					t.Errorf("deny: RetryInfo %v", r)
				}
			}
		}
	}
}
