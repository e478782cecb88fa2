package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/service"
)

func grpcCredentials(c GRPCConfig) (grpc.ServerOption, error) {
	if c.TLSCert == "" && c.TLSKey == "" {
		return nil, nil // with a client CA or name: refused by Validate
	}
	cfg, err := serverTLS("--grpc-tls", c.TLSCert, c.TLSKey, c.TLSClientCA, c.TLSClientSAN, tls.RequireAndVerifyClientCert)
	if err != nil {
		return nil, err
	}
	return grpc.Creds(credentials.NewTLS(cfg)), nil
}

// serverTLS is a listener's TLS configuration: its certificate and key, and with clientCA, client
// certificates verified against it (clientAuth says whether one is required) and, with san, one
// that names san required. prefix names the listener's flags in errors.
func serverTLS(prefix, certFile, keyFile, clientCA, san string, clientAuth tls.ClientAuthType) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s-cert/%s-key: %w", prefix, prefix, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(clientCA)
	if err != nil {
		return nil, fmt.Errorf("%s-client-ca: %w", prefix, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s-client-ca %s: no PEM certificates", prefix, clientCA)
	}
	cfg.ClientCAs = pool
	cfg.ClientAuth = clientAuth
	if san != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) > 0 && hasSAN(cs.PeerCertificates[0], san) {
				return nil
			}
			return fmt.Errorf("client certificate does not name %q", san)
		}
	}
	return cfg, nil
}

// hasSAN reports whether cert names san among its DNS names, URIs, e-mail addresses or IPs.
func hasSAN(cert *x509.Certificate, san string) bool {
	if slices.Contains(cert.DNSNames, san) || slices.Contains(cert.EmailAddresses, san) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == san {
			return true
		}
	}
	for _, ip := range cert.IPAddresses {
		if ip.String() == san {
			return true
		}
	}
	return false
}

// Stream workers: the default keeps a worker for each call of 64 clients at once (Envoy's
// connections carry many); the bound keeps a typo from starting millions of goroutines.
const (
	defaultStreamWorkers = 64
	maxStreamWorkers     = 4096
)

// newGRPCServer returns the gRPC server with the settings Envoy needs: keepalive pings accepted
// every --grpc-keepalive-min-time even without streams, a maximum connection age, optional
// (m)TLS, and panics answered INTERNAL instead of killing the process.
// interceptors (unary) run outside the panic recovery, in order; extra are further server options.
func newGRPCServer(c Config, log *slog.Logger, interceptors []grpc.UnaryServerInterceptor, extra ...grpc.ServerOption) (*grpc.Server, error) {
	recovered := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in gRPC handler", "panic", p)
		return status.Error(codes.Internal, "internal error")
	})
	interceptors = append(interceptors, recovery.UnaryServerInterceptor(recovered))
	opts := append([]grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.GRPC.KeepaliveMinTime, PermitWithoutStream: true}),
		// Bounds on what one connection can hold: calls open at once, and each call's headers
		// (gRPC's own default is 16 MiB of headers per call, with no bound on calls).
		grpc.MaxConcurrentStreams(uint32(min(c.GRPC.MaxConcurrentStreams, math.MaxUint32))),
		grpc.MaxHeaderListSize(grpcMaxHeaderBytes),
		// A larger message is refused from its length prefix, before it is read.
		grpc.MaxRecvMsgSize(c.maxRecvMsgSize()),
		// Fixed flow-control windows, where gRPC's default grows them with the bandwidth it
		// measures (up to 16 MiB): a client can then send no more than a window past what rls
		// has read, so a refused message costs rls 64 KiB of reading, not all of it.
		grpc.InitialWindowSize(grpcWindowBytes),
		grpc.InitialConnWindowSize(grpcConnWindowBytes),
		grpc.ChainUnaryInterceptor(interceptors...),
		// Streams (RLQS) too: a panic ends the stream with INTERNAL, not the process.
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(recovered)),
		// Decodes requests without protobuf's UTF-8 check, so that validation answers invalid
		// UTF-8 InvalidArgument instead of the codec answering INTERNAL.
		grpc.ForceServerCodecV2(service.CodecMax(c.Bounds.MaxRequestBytes)),
	}, extra...)
	if c.GRPC.HandshakeTimeout > 0 {
		// A connection that has not finished its handshake (TLS, HTTP/2 preface and SETTINGS)
		// by then is closed; capConn counts it. Validate refuses 0: gRPC's default is 120 s.
		opts = append(opts, grpc.ConnectionTimeout(c.GRPC.HandshakeTimeout))
	}
	if c.GRPC.StreamWorkers > 0 {
		// A new goroutine per call grows its stack to what the handler needs on every call
		// (runtime.newstack, about a tenth of rls's CPU under load); a worker grows it once.
		opts = append(opts, grpc.NumStreamWorkers(uint32(c.GRPC.StreamWorkers))) // at most maxStreamWorkers
	}
	if c.GRPC.MaxConnectionAge > 0 || c.GRPC.MaxConnectionIdle > 0 {
		kp := keepalive.ServerParameters{MaxConnectionIdle: c.GRPC.MaxConnectionIdle}
		if c.GRPC.MaxConnectionAge > 0 {
			kp.MaxConnectionAge, kp.MaxConnectionAgeGrace = c.GRPC.MaxConnectionAge, c.GRPC.MaxConnectionAgeGrace
		}
		opts = append(opts, grpc.KeepaliveParams(kp))
	}
	creds, err := grpcCredentials(c.GRPC)
	if err != nil {
		return nil, err
	}
	if creds != nil {
		opts = append(opts, creds)
	}
	return grpc.NewServer(opts...), nil
}

// maxRecvMsgSize is the gRPC server's bound on a message: --max-request-bytes, or with RLQS
// served --rlqs-max-report-bytes when larger (gRPC has one bound for every method). A
// ShouldRateLimit request past --max-request-bytes is then refused by the codec, once read.
func (c Config) maxRecvMsgSize() int {
	if c.RLQS.Enabled {
		return max(c.Bounds.MaxRequestBytes, c.RLQS.MaxReportBytes)
	}
	return c.Bounds.MaxRequestBytes
}

// The flow-control windows: one call's (gRPC's least) and one connection's. Envoy's requests
// take a few hundred bytes, so neither slows them.
const (
	grpcWindowBytes     = 64 << 10
	grpcConnWindowBytes = 1 << 20
)

// grpcMaxHeaderBytes bounds the headers (metadata) of one gRPC call: Envoy's rate-limit calls
// carry a few hundred bytes.
const grpcMaxHeaderBytes = 64 << 10

// drainingHealth ends health Watch streams when draining begins: GracefulStop waits for every
// stream, and a client that watches health (gRPC client-side health checking) never ends its
// watch itself, so without this every shutdown would last --shutdown-timeout and end forced.
type drainingHealth struct {
	*health.Server
	draining <-chan struct{}
}

func (h drainingHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx})
}

// watchStream is a Watch stream whose context also ends when draining begins.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (s *watchStream) Context() context.Context { return s.ctx }
