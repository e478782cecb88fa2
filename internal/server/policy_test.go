package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/rlstest"
)

func TestCallerIdentities(t *testing.T) {
	u, _ := url.Parse("spiffe://td/ns/a/sa/b")
	leaf := &x509.Certificate{URIs: []*url.URL{u}, DNSNames: []string{"b.a.svc"}}
	verified := credentials.TLSInfo{State: tls.ConnectionState{
		PeerCertificates: []*x509.Certificate{leaf},
		VerifiedChains:   [][]*x509.Certificate{{leaf, {}}},
	}}
	unverified := credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}}
	tests := []struct {
		name string
		ctx  context.Context
		want []string
	}{
		{"verified certificate", peer.NewContext(context.Background(), &peer.Peer{AuthInfo: verified}), []string{"spiffe://td/ns/a/sa/b", "b.a.svc"}},
		{"certificate not verified", peer.NewContext(context.Background(), &peer.Peer{AuthInfo: unverified}), nil},
		{"plaintext", peer.NewContext(context.Background(), &peer.Peer{}), nil},
		{"no peer (POST /json)", context.Background(), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := callerIdentities(tc.ctx); !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCallerPolicySwapUnderLoad checks requests against the policy while it is reloaded again and
// again: each answer is the old policy's or the new one's, whole, and a broken file changes
// nothing.
func TestCallerPolicySwapUnderLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	allowA := "default:\n  domains: [a]\n"
	allowB := "default:\n  domains: [b]\n"
	if err := os.WriteFile(path, []byte(allowA), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cp, err := newCallerPolicy(Config{CallerPolicy: path}, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	reqA := &rlsv3.RateLimitRequest{Domain: "a", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	reqB := &rlsv3.RateLimitRequest{Domain: "b", Descriptors: reqA.Descriptors}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var both atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// One policy is in force at a time: exactly one of the two domains is allowed.
				p := cp.cur.Load()
				errA, errB := p.Check(nil, reqA), p.Check(nil, reqB)
				if (errA == nil) == (errB == nil) {
					both.Add(1)
				}
				if err := cp.authorize(context.Background(), reqA); err != nil && status.Code(err) != codes.PermissionDenied {
					t.Errorf("authorize: %v", err)
				}
			}
		}()
	}
	for i := range 50 {
		src := allowA
		if i%2 == 0 {
			src = allowB
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := cp.reload(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, []byte("default: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cp.reload(); err == nil || !strings.Contains(err.Error(), path+":") {
		t.Fatalf("broken file: %v", err)
	}
	close(stop)
	wg.Wait()
	if n := both.Load(); n > 0 {
		t.Fatalf("%d checks saw neither or both policies", n)
	}
	// The last good policy (domains [a], from i = 49) stays in force.
	if err := cp.authorize(context.Background(), reqA); err != nil {
		t.Fatalf("after the broken file: %v", err)
	}
	if err := cp.authorize(context.Background(), reqB); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("domain b after the broken file: %v", err)
	}
	if got := rlstest.CounterValue(t, cp.loads.WithLabelValues("success")); got != 51 {
		t.Errorf("loads success %v, want 51", got)
	}
	if got := rlstest.CounterValue(t, cp.loads.WithLabelValues("failure")); got != 1 {
		t.Errorf("loads failure %v, want 1", got)
	}
	if got := rlstest.CounterValue(t, cp.denied.WithLabelValues("domain")); got < 1 {
		t.Errorf("denied domain %v, want at least the one above", got)
	}
}
