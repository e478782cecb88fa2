package server

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// panicky is a RateLimitService whose handler panics.
type panicky struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (panicky) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	var m map[string]int
	//lint:ignore SA5000 the handler panics with a runtime error on purpose
	m["boom"]++ // a nil map write: a runtime panic
	return nil, nil
}

// TestPanicAnswersInternal checks that the server's interceptors turn a handler's panic into
// INTERNAL, for unary and streaming calls, and that the server survives it.
func TestPanicAnswersInternal(t *testing.T) {
	tests := []struct {
		name     string
		register func(*grpc.Server)
		call     func(context.Context, *grpc.ClientConn) error
	}{
		{"unary", func(gs *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(gs, panicky{}) },
			func(ctx context.Context, conn *grpc.ClientConn) error {
				_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
				return err
			}},
		{"stream", func(gs *grpc.Server) { rlqspb.RegisterRateLimitQuotaServiceServer(gs, panickyQuota{}) },
			func(ctx context.Context, conn *grpc.ClientConn) error {
				s, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
				if err == nil {
					_, err = s.Recv()
				}
				return err
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gs, err := newGRPCServer(DefaultConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
			if err != nil {
				t.Fatal(err)
			}
			tc.register(gs)
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go gs.Serve(l)
			defer gs.Stop()
			conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			for i := range 2 { // the server survives the first panic
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := tc.call(ctx, conn)
				cancel()
				if status.Code(err) != codes.Internal {
					t.Fatalf("call %d: got %v, want Internal", i+1, err)
				}
			}
		})
	}
}

// panickyQuota is a Rate Limit Quota Service whose stream handler panics.
type panickyQuota struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
}

func (panickyQuota) StreamRateLimitQuotas(rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	var m map[string]int
	//lint:ignore SA5000 the handler panics with a runtime error on purpose
	m["boom"]++ // a nil map write: a runtime panic
	return nil
}

// TestClientSAN: --grpc-tls-client-san needs client certificates, and accepts one that names
// it among its DNS names, URIs, e-mail addresses or IPs.
func TestClientSAN(t *testing.T) {
	c := testConfig()
	c.GRPC.TLSClientSAN = "x"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--grpc-tls-client-san needs") {
		t.Errorf("--grpc-tls-client-san without --grpc-tls-client-ca: %v", err)
	}
	u, _ := url.Parse("spiffe://cluster.local/ns/gw/sa/envoy")
	cert := &x509.Certificate{DNSNames: []string{"envoy.gw.svc"}, URIs: []*url.URL{u},
		EmailAddresses: []string{"ops@example.com"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.7")}}
	for san, want := range map[string]bool{
		"envoy.gw.svc": true, "spiffe://cluster.local/ns/gw/sa/envoy": true, "ops@example.com": true, "10.0.0.7": true,
		"other.gw.svc": false, "envoy": false, "10.0.0.8": false, "": false,
	} {
		if got := hasSAN(cert, san); got != want {
			t.Errorf("hasSAN(%q) = %v, want %v", san, got, want)
		}
	}
}
