package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/tlsroots"
)

// FailurePolicy is the answer when rls cannot answer in time: it is down, unreachable, too slow
// for the deadline, or failing (any gRPC error but INVALID_ARGUMENT). It plays the part of
// Envoy's failure_mode_deny for direct callers. The zero value is FailAllow, Envoy's default.
type FailurePolicy uint8

const (
	// FailAllow admits the request (fail open): an outage of rls never takes the service down
	// with it, at the cost of no limit while it lasts.
	FailAllow FailurePolicy = iota
	// FailDeny denies the request (fail closed), with a RetryAfter of one second.
	FailDeny
	// FailError returns an error wrapping ErrUnavailable and leaves the answer to the caller;
	// httplimit answers it 503 and grpclimit UNAVAILABLE.
	FailError
)

func (p FailurePolicy) String() string {
	switch p {
	case FailDeny:
		return "deny"
	case FailError:
		return "error"
	}
	return "allow"
}

// ErrUnavailable is wrapped by the error Check returns under FailError when rls did not answer.
var ErrUnavailable = errors.New("client: rls unavailable")

// DefaultTimeout is Options.Timeout when unset.
const DefaultTimeout = 50 * time.Millisecond

// Options configures a Client.
type Options struct {
	// Domain is the rate-limit domain of every request (required).
	Domain string
	// TLS, when set, secures the connection; a config with Certificates is mutual TLS. TLSConfig
	// builds one from PEM files. Nil: plaintext.
	TLS *tls.Config
	// Timeout is the deadline of one call to rls (default DefaultTimeout). It is cut further to a
	// quarter of the time the caller's context has left, so that the failure policy answers
	// while the caller still has most of its own time.
	Timeout time.Duration
	// OnFailure is the answer when rls cannot answer in time (default FailAllow).
	OnFailure FailurePolicy
	// Local, when set, adds a local tier: see LocalTier.
	Local *LocalTier
	// DialOptions are added to the connection's options. Retries are off by default
	// (grpc.WithDisableRetry): a retried decision could charge a limit twice, and the time a
	// retry takes is better spent by the failure policy.
	DialOptions []grpc.DialOption
}

// Client asks rls for decisions over one gRPC connection, reused by every call. It is safe for
// concurrent use.
type Client struct {
	conn    *grpc.ClientConn // nil when the caller owns the connection
	rls     rlsv3.RateLimitServiceClient
	domain  string
	timeout time.Duration
	policy  FailurePolicy
	local   *local
}

// New returns a Client of the rls at target (a gRPC target such as "rls:8081" or
// "dns:///rls.default.svc:8081"). It does not wait for the connection: the first Check does.
func New(target string, opts Options) (*Client, error) {
	if strings.TrimSpace(target) == "" {
		// gRPC would accept it and fail every call, which the failure policy would then answer:
		// a missing setting would look like an outage, and under FailAllow limit nothing.
		return nil, errors.New("client: no target: want the address of rls, such as rls:8081")
	}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = credentials.NewTLS(opts.TLS)
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithDisableRetry()}, opts.DialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("client: %s: %w", target, err)
	}
	c, err := NewFromConn(conn, opts)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.conn = conn
	return c, nil
}

// NewFromConn returns a Client over a connection the caller made and closes; opts.TLS and
// opts.DialOptions are unused.
func NewFromConn(conn grpc.ClientConnInterface, opts Options) (*Client, error) {
	if opts.Domain == "" {
		return nil, errors.New("client: Options.Domain is empty")
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("client: Options.Timeout %v < 0", opts.Timeout)
	}
	if opts.OnFailure > FailError {
		return nil, fmt.Errorf("client: unknown failure policy %d", opts.OnFailure)
	}
	c := &Client{rls: rlsv3.NewRateLimitServiceClient(conn), domain: opts.Domain, policy: opts.OnFailure,
		timeout: opts.Timeout}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if opts.Local != nil {
		l, err := newLocal(opts.Domain, *opts.Local)
		if err != nil {
			return nil, err
		}
		c.local = l
	}
	return c, nil
}

// Close closes the connection New made.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// TLSConfig returns a TLS config from PEM files: rls's certificate is verified against the
// system's roots with caFile's certificates added (empty: the system's roots alone), as rls
// reads --xds-tls-ca and --redis-tls-ca; certFile and keyFile, when set, are this client's
// certificate for mutual TLS.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := tlsroots.Pool(caFile)
		if err != nil {
			return nil, fmt.Errorf("client: CA: %w", err)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client: certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Check asks whether a request described by descs is admitted, charging one hit to each
// descriptor. See CheckN.
func (c *Client) Check(ctx context.Context, descs ...Descriptor) (Decision, error) {
	return c.CheckN(ctx, 1, descs...)
}

// CheckN asks whether a request of n hits described by descs is admitted (n = 0 counts as 1,
// as in rls). A request is admitted whole or not at all.
//
// It returns an error only for invalid descriptors (wrapping ErrInvalid), when ctx itself ends
// first (the caller no longer waits for any answer), or under FailError when rls did not
// answer (wrapping ErrUnavailable). Otherwise the failure policy answers for rls, with Source
// SourceFailure and the cause in Decision.Err.
func (c *Client) CheckN(ctx context.Context, n uint32, descs ...Descriptor) (Decision, error) {
	if err := validate(descs); err != nil {
		return Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, fmt.Errorf("client: %w", err)
	}
	if c.local != nil {
		d, ok, err := c.local.decide(descs, n)
		if err != nil || ok {
			return d, err
		}
	}
	timeout := c.timeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl)/4)
	}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.rls.ShouldRateLimit(callCtx, request(c.domain, n, descs))
	if err != nil {
		return c.failed(ctx, err)
	}
	return decision(descs, resp), nil
}

func request(domain string, n uint32, descs []Descriptor) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: n,
		Descriptors: make([]*ratelimitv3.RateLimitDescriptor, len(descs))}
	entries := 0
	for _, d := range descs {
		entries += len(d)
	}
	// One allocation for every entry of the request.
	es := make([]ratelimitv3.RateLimitDescriptor_Entry, entries)
	ptrs := make([]*ratelimitv3.RateLimitDescriptor_Entry, entries)
	pds := make([]ratelimitv3.RateLimitDescriptor, len(descs))
	k := 0
	for i, d := range descs {
		start := k
		for _, e := range d {
			es[k].Key, es[k].Value = e.Key, e.Value
			ptrs[k] = &es[k]
			k++
		}
		pds[i].Entries = ptrs[start:k:k]
		req.Descriptors[i] = &pds[i]
	}
	return req
}

func decision(descs []Descriptor, resp *rlsv3.RateLimitResponse) Decision {
	d := Decision{Source: SourceRLS, Statuses: make([]Status, len(descs)), Body: resp.GetRawBody()}
	for i := range descs {
		d.Statuses[i].Descriptor = descs[i]
		if i >= len(resp.GetStatuses()) {
			continue
		}
		st := resp.Statuses[i]
		s := &d.Statuses[i]
		s.OverLimit = st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
		s.Remaining = st.GetLimitRemaining()
		s.Wait = st.GetDurationUntilReset().AsDuration()
		if l := st.GetCurrentLimit(); l != nil {
			s.Limit = Limit{Name: l.GetName(), Requests: l.GetRequestsPerUnit(), Window: window(l)}
		}
	}
	if hs := resp.GetResponseHeadersToAdd(); len(hs) > 0 {
		d.RLSHeaders = make(http.Header, len(hs))
		for _, h := range hs {
			d.RLSHeaders.Add(h.GetKey(), h.GetValue())
		}
	}
	// As Envoy: only OVER_LIMIT denies; any other overall code admits.
	d.decide(resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT)
	return d
}

func window(l *rlsv3.RateLimitResponse_RateLimit) time.Duration {
	mult := int64(1)
	if m := l.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = int64(m.GetValue())
	}
	secs := limit.Unit(l.GetUnit()).Seconds()
	return time.Duration(secs*mult) * time.Second
}

// failed answers a call to rls that returned err.
func (c *Client) failed(ctx context.Context, err error) (Decision, error) {
	if status.Code(err) == codes.InvalidArgument {
		return Decision{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if ctx.Err() != nil {
		return Decision{}, fmt.Errorf("client: %w", ctx.Err())
	}
	return c.policy.Answer(err)
}
