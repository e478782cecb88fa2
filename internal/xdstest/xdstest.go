// Package xdstest runs go-control-plane's own xDS management server for tests: it serves
// RateLimitConfig snapshots per node id over ADS, records what clients ACK and NACK, and can be
// stopped and started again on the same address.
package xdstest

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// Reply is what a client answered to a snapshot version: ACK (Error empty) or NACK.
type Reply struct {
	Version string // the version the client holds (after an ACK, the new one)
	Nonce   string
	Error   string // the NACK's reason
}

// Server is a management server on loopback.
type Server struct {
	t     testing.TB
	Addr  string
	cache cache.SnapshotCache
	tls   *tls.Config

	mu      sync.Mutex
	grpc    *grpc.Server
	replies []Reply
	headers []metadata.MD // of each stream opened
	streams int
}

// Start starts a server; tlsConf, when set, makes it serve TLS. It stops with the test.
func Start(t testing.TB, tlsConf *tls.Config) *Server {
	t.Helper()
	return start(t, tlsConf, true)
}

// StartAsAIGateway starts a plaintext server built as Envoy AI Gateway's controller builds its
// rate-limit xDS server (internal/ratelimit/runner): the aggregated discovery service over a
// snapshot cache without ADS ordering. It stops with the test.
func StartAsAIGateway(t testing.TB) *Server {
	t.Helper()
	return start(t, nil, false)
}

func start(t testing.TB, tlsConf *tls.Config, ads bool) *Server {
	t.Helper()
	s := &Server{t: t, cache: cache.NewSnapshotCache(ads, cache.IDHash{}, nil), tls: tlsConf}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Addr = l.Addr().String()
	s.serve(l)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) serve(l net.Listener) {
	cb := server.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			s.mu.Lock()
			s.streams++
			s.headers = append(s.headers, md)
			s.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			if req.GetResponseNonce() == "" {
				return nil // a subscription, not an answer
			}
			s.mu.Lock()
			s.replies = append(s.replies, Reply{Version: req.GetVersionInfo(), Nonce: req.GetResponseNonce(), Error: req.GetErrorDetail().GetMessage()})
			s.mu.Unlock()
			return nil
		},
	}
	var opts []grpc.ServerOption
	if s.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	g := grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, server.NewServer(context.Background(), s.cache, cb))
	s.mu.Lock()
	s.grpc = g
	s.mu.Unlock()
	go g.Serve(l)
}

// Set makes configs the snapshot of node at version.
func (s *Server) Set(node, version string, configs ...*rlconfv3.RateLimitConfig) {
	s.t.Helper()
	res := make([]types.Resource, len(configs))
	for i, c := range configs {
		res[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		s.t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		s.t.Fatal(err)
	}
}

// Stop stops serving; every stream ends.
func (s *Server) Stop() {
	s.mu.Lock()
	g := s.grpc
	s.grpc = nil
	s.mu.Unlock()
	if g != nil {
		g.Stop()
	}
}

// Restart serves again on the same address, with the snapshots it had.
func (s *Server) Restart() {
	s.t.Helper()
	var l net.Listener
	var err error
	for range 50 { // the port is free once Stop returns, but may take a moment on some kernels
		if l, err = net.Listen("tcp", s.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatal(err)
	}
	s.serve(l)
}

// Replies returns what clients answered so far.
func (s *Server) Replies() []Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Reply(nil), s.replies...)
}

// Streams returns how many streams were opened, and the metadata of each.
func (s *Server) Streams() (int, []metadata.MD) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams, append([]metadata.MD(nil), s.headers...)
}

// WaitACK waits until a client has ACKed version, and fails the test after timeout.
func (s *Server) WaitACK(version string, timeout time.Duration) {
	s.t.Helper()
	s.wait(timeout, "an ACK of version "+version, func(r Reply) bool { return r.Error == "" && r.Version == version })
}

// WaitNACK waits for a NACK among the replies after the first `after` (see Replies), returns
// it, and fails the test after timeout.
func (s *Server) WaitNACK(after int, timeout time.Duration) Reply {
	s.t.Helper()
	return s.wait(timeout, "a NACK", func(r Reply) bool { return r.Error != "" }, after)
}

func (s *Server) wait(timeout time.Duration, what string, match func(Reply) bool, after ...int) Reply {
	s.t.Helper()
	from := 0
	if len(after) > 0 {
		from = after[0]
	}
	deadline := time.Now().Add(timeout)
	for {
		rs := s.Replies()
		for _, r := range rs[min(from, len(rs)):] {
			if match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no %s within %v; replies: %+v", what, timeout, rs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
