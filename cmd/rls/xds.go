package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// xdsFlags registers the xDS flags on fs.
func xdsFlags(fs *flag.FlagSet, x *server.XDSConfig) {
	fs.StringVar(&x.Server, "xds-server", x.Server, "take the rules from this xDS management server (host:port) instead of files: RateLimitConfig resources, as Envoy Gateway serves them to envoyproxy/ratelimit")
	fs.StringVar(&x.NodeID, "xds-node-id", x.NodeID, "--xds-server: the node id rls subscribes as (the server picks the rules by it)")
	fs.StringVar(&x.NodeMetadata, "xds-node-metadata", x.NodeMetadata, "--xds-server: node metadata as key=value,key=value")
	fs.StringVar(&x.Headers, "xds-header", x.Headers, "--xds-server: gRPC metadata sent on the stream, as key=value,key=value (e.g. an authorization token)")
	fs.BoolVar(&x.TLS, "xds-tls", x.TLS, "--xds-server: connect with TLS (the system's roots unless --xds-tls-ca)")
	fs.StringVar(&x.TLSCert, "xds-tls-cert", x.TLSCert, "--xds-server: PEM client certificate (with --xds-tls-key), for mTLS")
	fs.StringVar(&x.TLSKey, "xds-tls-key", x.TLSKey, "--xds-server: PEM client private key")
	fs.StringVar(&x.TLSCA, "xds-tls-ca", x.TLSCA, "--xds-server: PEM CA bundle that verifies the server")
	fs.StringVar(&x.TLSServerName, "xds-tls-server-name", x.TLSServerName, "--xds-server: name the server's certificate must carry (default: the host of --xds-server)")
	fs.DurationVar(&x.BackoffInitial, "xds-backoff-initial", x.BackoffInitial, "--xds-server: first delay before subscribing again after the stream breaks; it doubles, with jitter, up to --xds-backoff-max")
	fs.DurationVar(&x.BackoffMax, "xds-backoff-max", x.BackoffMax, "--xds-server: longest delay between attempts to subscribe")
	fs.IntVar(&x.MaxMsgSize, "xds-max-msg-size", x.MaxMsgSize, "--xds-server: largest response accepted, in bytes (0: 4 MiB)")
}
