// Package xds receives rate-limit rules over xDS: it subscribes to RateLimitConfig resources
// (go-control-plane's ratelimit module) on an aggregated state-of-the-world stream, as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW, and hands every snapshot to a
// callback that takes it whole or rejects it. A taken snapshot is ACKed; a rejected one is NACKed
// with the reason, and the rules in force stay. A broken stream is opened again after a
// jittered, exponentially growing delay.
package xds

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Defaults of Options.
const (
	DefaultBackoffInitial = 500 * time.Millisecond
	DefaultBackoffMax     = 30 * time.Second
)

// Options configures a Client.
type Options struct {
	// Server is the management server's gRPC target, such as envoy-gateway:18001.
	Server string
	// NodeID and NodeMetadata identify this process to the server, which picks the snapshot
	// by them.
	NodeID       string
	NodeMetadata map[string]string
	// Headers are sent as metadata on the stream.
	Headers map[string]string
	// TLS secures the connection; nil means plaintext.
	TLS *tls.Config
	// BackoffInitial and BackoffMax bound the delay before a broken stream or a failed
	// connection is tried again; it doubles from the first to the second, with jitter.
	BackoffInitial, BackoffMax time.Duration
	// MaxMsgSize is the largest response accepted, in bytes (0: gRPC's default, 4 MiB).
	MaxMsgSize int
	// Apply takes a snapshot: every RateLimitConfig the server holds for this node. It swaps
	// the rules in whole, or returns why not, which the server is told.
	Apply func([]*rlconfv3.RateLimitConfig) error
	// Log defaults to slog.Default().
	Log *slog.Logger
}

// Client is a subscription. Create it with New, run it with Run.
type Client struct {
	opts Options
	node *corev3.Node
	conn *grpc.ClientConn
	log  *slog.Logger
}

// New checks opts and prepares the connection; nothing is dialed until Run.
func New(opts Options) (*Client, error) {
	if opts.Server == "" {
		return nil, errors.New("xds: no server address")
	}
	if opts.Apply == nil {
		return nil, errors.New("xds: Options.Apply is nil")
	}
	if opts.BackoffInitial < 0 || opts.BackoffMax < 0 || opts.MaxMsgSize < 0 {
		return nil, errors.New("xds: backoff and message size must not be negative")
	}
	if opts.BackoffInitial == 0 {
		opts.BackoffInitial = DefaultBackoffInitial
	}
	if opts.BackoffMax == 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	if opts.BackoffMax < opts.BackoffInitial {
		return nil, fmt.Errorf("xds: backoff maximum %v is below its initial %v", opts.BackoffMax, opts.BackoffInitial)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dial := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: opts.BackoffInitial, Multiplier: 2, Jitter: 0.2, MaxDelay: opts.BackoffMax},
			MinConnectTimeout: 5 * time.Second,
		}),
	}
	if opts.MaxMsgSize > 0 {
		dial = append(dial, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMsgSize)))
	}
	conn, err := grpc.NewClient(opts.Server, dial...)
	if err != nil {
		return nil, fmt.Errorf("xds: server %q: %w", opts.Server, err)
	}
	md := map[string]*structpb.Value{}
	for k, v := range opts.NodeMetadata {
		md[k] = structpb.NewStringValue(v)
	}
	return &Client{opts: opts, conn: conn, log: opts.Log,
		node: &corev3.Node{Id: opts.NodeID, Metadata: &structpb.Struct{Fields: md}}}, nil
}

// Run subscribes until ctx ends, then closes the connection.
func (c *Client) Run(ctx context.Context) {
	defer c.conn.Close()
	delay := c.opts.BackoffInitial
	for {
		received, err := c.subscribe(ctx)
		if ctx.Err() != nil {
			return
		}
		if received {
			delay = c.opts.BackoffInitial // the server worked: start over
		}
		wait := delay/2 + rand.N(delay/2+1) // jitter: [delay/2, delay]
		c.log.Warn("xds: stream to the management server ended; subscribing again", "server", c.opts.Server, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		delay = min(2*delay, c.opts.BackoffMax)
	}
}

// subscribe opens one stream and takes snapshots from it until it breaks. received reports
// whether any response arrived.
func (c *Client) subscribe(ctx context.Context) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.opts.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.opts.Headers))
	}
	// A new ADS client per stream: its first request carries no version or nonce of an
	// earlier stream, so a restarted server sends its whole state.
	ads := sotw.NewADSClient(ctx, c.node, resource.RateLimitConfigType)
	if err := ads.InitConnect(c.conn); err != nil {
		return false, err
	}
	c.log.Info("xds: subscribed", "server", c.opts.Server, "node", c.opts.NodeID)
	for {
		resp, err := ads.Fetch()
		if err != nil {
			return received, err
		}
		received = true
		configs, err := decode(resp.Resources)
		if err == nil {
			err = c.opts.Apply(configs)
		}
		if err != nil {
			c.log.Error("xds: snapshot rejected; the rules in force stay", "err", err)
			err = ads.Nack(err.Error())
		} else {
			err = ads.Ack()
		}
		if err != nil {
			return received, err
		}
	}
}

// decode unpacks a response's resources, each a RateLimitConfig.
func decode(resources []*anypb.Any) ([]*rlconfv3.RateLimitConfig, error) {
	out := make([]*rlconfv3.RateLimitConfig, 0, len(resources))
	for i, r := range resources {
		if r.GetTypeUrl() != resource.RateLimitConfigType {
			return nil, fmt.Errorf("resource #%d: type %q, want %q", i+1, r.GetTypeUrl(), resource.RateLimitConfigType)
		}
		c := &rlconfv3.RateLimitConfig{}
		if err := r.UnmarshalTo(c); err != nil {
			return nil, fmt.Errorf("resource #%d: %v", i+1, err)
		}
		out = append(out, c)
	}
	return out, nil
}
