package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// grpcConnFlags registers the flags bounding the gRPC connections rls holds: how many at once,
// from one source, how long one may take to start and to send a call's message, and how long
// one may stay open with no call in flight.
func grpcConnFlags(fs *flag.FlagSet, g *server.GRPCConfig) {
	fs.IntVar(&g.MaxConnections, "grpc-max-connections", g.MaxConnections,
		"gRPC connections served at once; one more waits in the listen queue, unserved, until another closes (0: no bound)")
	fs.IntVar(&g.MaxConnsPerSource, "grpc-max-connections-per-source", g.MaxConnsPerSource,
		"gRPC connections served at once from one source address (an IPv6 source is its /64); one more is closed as it is accepted and counted in rls_grpc_connections_refused_total. Raise it when more than this many Envoy worker threads reach rls from behind one NAT address (0: no bound)")
	fs.DurationVar(&g.HandshakeTimeout, "grpc-handshake-timeout", g.HandshakeTimeout,
		"a new gRPC connection must finish its handshake (TLS, then HTTP/2's preface and SETTINGS) within this long or it is closed, counted in rls_grpc_handshake_timeouts_total")
	fs.DurationVar(&g.MessageTimeout, "grpc-message-timeout", g.MessageTimeout,
		"a unary gRPC call (ShouldRateLimit, health Check) must deliver its whole request message within this long after its headers or it is cancelled, counted in rls_grpc_slow_calls_total (0: no deadline)")
	fs.DurationVar(&g.MaxConnectionIdle, "grpc-max-connection-idle", g.MaxConnectionIdle,
		"close a gRPC connection (with GOAWAY) that has had no call in flight for this long; Envoy reconnects on its next call (0: never)")
}
