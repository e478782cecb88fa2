package main

import (
	"flag"
	"fmt"
	"net"
	"time"

	"golang.org/x/net/netutil"
)

// grpcConnLimits bound the gRPC connections rls holds: how many at once, and how long one may
// stay open with no call in flight.
type grpcConnLimits struct {
	maxConns int
	maxIdle  time.Duration
}

// Defaults: Envoy opens a connection or two per worker thread to each rls replica, so a mesh of
// hundreds of proxies stays under the cap. An idle connection holds about 23 kB (measured: 1,000
// idle connections after a call each took rls from 28.8 to 51.6 MB of RSS), so the cap bounds
// what idle connections hold to about 47 MB. Envoy reconnects by itself after an idle GOAWAY,
// on its next call.
const (
	defaultGRPCMaxConnections    = 2048
	defaultGRPCMaxConnectionIdle = 5 * time.Minute
)

// grpcConnFlags registers the connection limits' flags on fs.
func grpcConnFlags(fs *flag.FlagSet, l *grpcConnLimits) {
	fs.IntVar(&l.maxConns, "grpc-max-connections", defaultGRPCMaxConnections,
		"gRPC connections served at once; one more waits in the listen queue, unserved, until another closes (0: no bound)")
	fs.DurationVar(&l.maxIdle, "grpc-max-connection-idle", defaultGRPCMaxConnectionIdle,
		"close a gRPC connection (with GOAWAY) that has had no call in flight for this long; Envoy reconnects on its next call (0: never)")
}

func (l grpcConnLimits) validate() error {
	if l.maxConns < 0 {
		return fmt.Errorf("--grpc-max-connections %d: want 0 (no bound) or more", l.maxConns)
	}
	if l.maxIdle < 0 {
		return fmt.Errorf("--grpc-max-connection-idle %v: want 0 (never) or more", l.maxIdle)
	}
	return nil
}

// limit returns l bounded to --grpc-max-connections connections at once: Accept waits while
// that many are open, so the next connection stays in the kernel's queue until one closes.
func (lim grpcConnLimits) limit(l net.Listener) net.Listener {
	if lim.maxConns == 0 {
		return l
	}
	return netutil.LimitListener(l, lim.maxConns)
}
