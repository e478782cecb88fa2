// Package grpclimit is a pair of gRPC server interceptors, unary and stream, that rate-limit
// calls with rls. Descriptors are built from the method name, the incoming metadata and the
// peer's address; a denied call ends RESOURCE_EXHAUSTED with errdetails.RetryInfo (how long to
// wait) and errdetails.QuotaFailure (which descriptors are over), and every call carries the
// rate-limit headers as response header metadata.
//
//	lim := grpclimit.New(c, grpclimit.Options{
//		// Uploads are limited per key and method; every other method per key only.
//		Methods: map[string][]grpclimit.Descriptor{
//			"/shop.Store/Upload": {grpclimit.By(grpclimit.Metadata("x-api-key", "api_key"), grpclimit.Method())},
//		}},
//		grpclimit.By(grpclimit.Metadata("x-api-key", "api_key")))
//	srv := grpc.NewServer(grpc.UnaryInterceptor(lim.Unary()), grpc.StreamInterceptor(lim.Stream()))
//
// Options.Deny and Options.Error choose the status of a denied call and of a call that had no
// decision, as httplimit's hooks choose the response.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/rls-project/rls/client"
)

// Part yields one entry of a descriptor from a call; ok false drops the whole descriptor from
// this call, and its other descriptors are still sent.
type Part func(ctx context.Context, fullMethod string) (e client.Entry, ok bool)

// Descriptor builds one descriptor from a call: the entries of its parts, in order.
type Descriptor struct{ parts []Part }

// By returns the descriptor of parts, in order; several parts make a composite key.
func By(parts ...Part) Descriptor { return Descriptor{parts: parts} }

func (d Descriptor) build(ctx context.Context, method string) (client.Descriptor, bool) {
	if len(d.parts) == 0 {
		return nil, false
	}
	out := make(client.Descriptor, len(d.parts))
	for i, p := range d.parts {
		e, ok := p(ctx, method)
		if !ok {
			return nil, false
		}
		out[i] = e
	}
	return out, true
}

// Static is the entry key=value on every call.
func Static(key, value string) Part {
	return func(context.Context, string) (client.Entry, bool) { return client.Entry{Key: key, Value: value}, true }
}

// Generic is the entry generic_key=value.
func Generic(value string) Part { return Static("generic_key", value) }

// Method is the entry method=<the full method name>, such as "/pkg.Service/Method".
func Method() Part {
	return func(_ context.Context, m string) (client.Entry, bool) {
		return client.Entry{Key: "method", Value: m}, true
	}
}

// Metadata is the entry key=<the first value of the incoming metadata name>; a call without it
// drops the descriptor.
func Metadata(name, key string) Part {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (client.Entry, bool) {
		vs := metadata.ValueFromIncomingContext(ctx, name)
		if len(vs) == 0 {
			return client.Entry{}, false
		}
		v := strings.ToValidUTF8(vs[0], "\uFFFD")
		if len(v) > client.MaxValueBytes {
			v = strings.ToValidUTF8(v[:client.MaxValueBytes], "")
		}
		return client.Entry{Key: key, Value: v}, true
	}
}

// Peer is the entry remote_address=<the peer's IP> (no port); a peer that is not an IP
// address (a Unix socket) drops the descriptor. Behind a proxy, the peer is the proxy: use
// Metadata on the header it forwards, if it is trusted to set it.
func Peer() Part {
	return func(ctx context.Context, _ string) (client.Entry, bool) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return client.Entry{}, false
		}
		var ip netip.Addr
		switch a := p.Addr.(type) {
		case *net.TCPAddr:
			ip, ok = netip.AddrFromSlice(a.IP)
		default:
			ap, err := netip.ParseAddrPort(a.String())
			ip, ok = ap.Addr(), err == nil
		}
		if !ok {
			return client.Entry{}, false
		}
		return client.Entry{Key: "remote_address", Value: ip.Unmap().String()}, true
	}
}

// Options configures a Limiter. The zero value sends the IETF draft headers, limits every method
// by the descriptors given to New, and ends calls with the default denial and error statuses.
type Options struct {
	// Headers is the style of the rate-limit headers sent as response header metadata (default
	// client.HeadersDraft; client.HeadersNone sends none but retry-after on a denial).
	Headers client.HeaderStyle
	// Methods holds the descriptors of chosen methods, as httplimit's Handler does per route: a
	// call is limited by the entry of its full method name ("/pkg.Service/Method"), else by the
	// entry of its service ("/pkg.Service/"), else by the descriptors given to New. An entry with
	// no descriptors lets its calls pass without asking.
	Methods map[string][]Descriptor
	// Deny returns the status a denied call ends with (default Denied). The rate-limit headers
	// and retry-after are already set as response header metadata. A nil error admits the call.
	Deny func(ctx context.Context, fullMethod string, d client.Decision) error
	// Error returns the status a call ends with when no decision could be had: invalid
	// descriptors, rls unavailable under client.FailError, or the call's own context ended
	// (default Failed). A nil error admits the call.
	Error func(ctx context.Context, fullMethod string, err error) error
	// InFlight makes each call hold a slot of the concurrency limits its descriptors match
	// (rls's docs/concurrency.md) while its handler runs: the Limiter asks with
	// client.Acquirer's Acquire and releases when the handler returns, panics, or the call is
	// cancelled (a stream's, when its handler returns). New panics when InFlight is set and its
	// Checker is no Acquirer.
	InFlight bool
}

// Limiter makes interceptors that ask one client. It is safe for concurrent use.
type Limiter struct {
	c     client.Checker
	opts  Options
	descs []Descriptor
}

// New returns a Limiter asking c (a *client.Client, or in an interceptor's tests a
// client.CheckerFunc playing rls) with the descriptors descs of each call of a method that
// Options.Methods does not name. A call that yields no descriptor passes without asking.
func New(c client.Checker, opts Options, descs ...Descriptor) *Limiter {
	if opts.Deny == nil {
		opts.Deny = func(_ context.Context, _ string, d client.Decision) error { return Denied(d) }
	}
	if opts.Error == nil {
		opts.Error = func(ctx context.Context, _ string, err error) error { return Failed(ctx, err) }
	}
	if _, ok := c.(client.Acquirer); opts.InFlight && !ok {
		panic("grpclimit: Options.InFlight needs a client.Acquirer")
	}
	return &Limiter{c: c, opts: opts, descs: descs}
}

// descriptors returns the descriptors of the calls of method.
func (l *Limiter) descriptors(method string) []Descriptor {
	if ds, ok := l.opts.Methods[method]; ok {
		return ds
	}
	if i := strings.LastIndexByte(method, '/'); i > 0 {
		if ds, ok := l.opts.Methods[method[:i+1]]; ok {
			return ds
		}
	}
	return l.descs
}

// check decides one call; a nil error admits it. It sends the headers with set. release frees
// the call's slots (Options.InFlight); it is never nil.
func (l *Limiter) check(ctx context.Context, method string, set func(metadata.MD) error) (release func(), err error) {
	release = func() {}
	var buf [4]client.Descriptor
	descs := buf[:0]
	for _, d := range l.descriptors(method) {
		if cd, ok := d.build(ctx, method); ok {
			descs = append(descs, cd)
		}
	}
	if len(descs) == 0 {
		return release, nil
	}
	var d client.Decision
	if l.opts.InFlight {
		d, release, err = l.c.(client.Acquirer).Acquire(ctx, descs...)
	} else {
		d, err = l.c.Check(ctx, descs...)
	}
	if err != nil {
		return release, l.opts.Error(ctx, method, err)
	}
	if h := d.Header(l.opts.Headers); len(h) > 0 {
		md := make(metadata.MD, len(h))
		for k, vs := range h {
			md[strings.ToLower(k)] = vs
		}
		_ = set(md) // fails only once headers are sent, which an interceptor runs before
	}
	if d.Allowed {
		return release, nil
	}
	return release, l.opts.Deny(ctx, method, d)
}

// Failed returns the status of a call whose check returned err: UNAVAILABLE when rls was
// unavailable, the context's status when the call's context ended, INTERNAL otherwise.
func Failed(ctx context.Context, err error) error {
	if errors.Is(err, client.ErrUnavailable) {
		return status.Error(codes.Unavailable, "rate limit service unavailable")
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Error(codes.Internal, "rate limit check failed")
}

// Denied returns the RESOURCE_EXHAUSTED status of a denied decision, with RetryInfo and a
// QuotaFailure violation per over-limit descriptor (the limiting one when rls named none, as
// under the deny failure policy: then with no subject).
func Denied(d client.Decision) error {
	msg := "rate limit exceeded"
	if d.Descriptor != nil {
		msg = fmt.Sprintf("rate limit exceeded: %s", d.Descriptor)
	}
	qf := &errdetails.QuotaFailure{}
	for _, st := range d.Statuses {
		if st.OverLimit {
			qf.Violations = append(qf.Violations, violation(st.Descriptor, st.Limit))
		}
	}
	if len(qf.Violations) == 0 {
		qf.Violations = append(qf.Violations, violation(d.Descriptor, d.Limit))
	}
	s, err := status.New(codes.ResourceExhausted, msg).WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}, qf)
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return s.Err()
}

func violation(d client.Descriptor, l client.Limit) *errdetails.QuotaFailure_Violation {
	v := &errdetails.QuotaFailure_Violation{Subject: d.String()}
	if l.Requests != 0 {
		v.Description = fmt.Sprintf("%d requests per %v", l.Requests, l.Window)
		if l.Name != "" {
			v.Description = l.Name + ": " + v.Description
		}
	}
	return v
}

// Unary returns the unary server interceptor.
func (l *Limiter) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		set := func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }
		release, err := l.check(ctx, info.FullMethod, set)
		defer release() // runs on a panic of the handler too
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream returns the stream server interceptor: one decision when the stream opens.
func (l *Limiter) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		release, err := l.check(ss.Context(), info.FullMethod, ss.SetHeader)
		defer release()
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}
