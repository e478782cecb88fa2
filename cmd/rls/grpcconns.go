package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// grpcConnFlags registers the flags bounding the gRPC connections rls holds: how many at once,
// and how long one may stay open with no call in flight.
func grpcConnFlags(fs *flag.FlagSet, g *server.GRPCConfig) {
	fs.IntVar(&g.MaxConnections, "grpc-max-connections", g.MaxConnections,
		"gRPC connections served at once; one more waits in the listen queue, unserved, until another closes (0: no bound)")
	fs.DurationVar(&g.MaxConnectionIdle, "grpc-max-connection-idle", g.MaxConnectionIdle,
		"close a gRPC connection (with GOAWAY) that has had no call in flight for this long; Envoy reconnects on its next call (0: never)")
}
