package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/rls-project/rls/client"
)

// Part yields one entry of a descriptor from a request; ok false drops the whole descriptor from
// this request (as an Envoy rate-limit action that finds nothing), and its other descriptors are
// still sent.
type Part func(r *http.Request) (e client.Entry, ok bool)

// Descriptor builds one descriptor from a request: the entries of its parts, in order.
type Descriptor struct{ parts []Part }

// By returns the descriptor of parts, in order: one part for a simple key, several for a
// composite key such as By(Header("X-API-Key", "api_key"), Method()).
func By(parts ...Part) Descriptor { return Descriptor{parts: parts} }

// build returns the descriptor of r, or ok false when a part found nothing.
func (d Descriptor) build(r *http.Request) (client.Descriptor, bool) {
	if len(d.parts) == 0 {
		return nil, false
	}
	out := make(client.Descriptor, len(d.parts))
	for i, p := range d.parts {
		e, ok := p(r)
		if !ok {
			return nil, false
		}
		out[i] = e
	}
	return out, true
}

// clean makes a request-supplied value acceptable to rls: invalid UTF-8 replaced, and cut to
// the longest value rls takes. A value the client controls never turns into an error (or into
// no descriptor, which would let it past the limit).
func clean(v string) string {
	if !utf8.ValidString(v) {
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	if len(v) > client.MaxValueBytes {
		v = strings.ToValidUTF8(v[:client.MaxValueBytes], "")
	}
	return v
}

// Static is the entry key=value on every request.
func Static(key, value string) Part {
	return func(*http.Request) (client.Entry, bool) { return client.Entry{Key: key, Value: value}, true }
}

// Generic is the entry generic_key=value, as Envoy's generic_key action sends it.
func Generic(value string) Part { return Static("generic_key", value) }

// Header is the entry key=<the first value of the request header name>. A request without the
// header drops the descriptor: limit anonymous requests with another descriptor.
func Header(name, key string) Part {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (client.Entry, bool) {
		vs := r.Header[name]
		if len(vs) == 0 {
			return client.Entry{}, false
		}
		return client.Entry{Key: key, Value: clean(vs[0])}, true
	}
}

// Method is the entry method=<the request method>.
func Method() Part {
	return func(r *http.Request) (client.Entry, bool) {
		return client.Entry{Key: "method", Value: clean(r.Method)}, true
	}
}

// Path is the entry path=<the request path>. rls rules match it with wildcards ("/login*").
// Paths are as many as clients care to send: prefer Route where the path holds identifiers.
func Path() Part {
	return func(r *http.Request) (client.Entry, bool) {
		return client.Entry{Key: "path", Value: clean(r.URL.Path)}, true
	}
}

// Route is the entry route=<the ServeMux pattern that matched>, such as "GET /users/{id}": one
// value per route however many paths it serves. It needs the middleware inside the ServeMux
// (mux.Handle(pattern, lim.Handler(h, ...))); a request no pattern matched drops the descriptor.
func Route() Part {
	return func(r *http.Request) (client.Entry, bool) {
		if r.Pattern == "" {
			return client.Entry{}, false
		}
		return client.Entry{Key: "route", Value: r.Pattern}, true
	}
}

// PathPattern is the entry path=<the first of patterns that matches the request>, patterns in
// ServeMux syntax ("/users/{id}", "/static/", "POST /login"); no match drops the descriptor. It
// groups paths into few values when the middleware sits outside any ServeMux.
func PathPattern(patterns ...string) (Part, error) {
	mux := http.NewServeMux()
	for _, p := range patterns {
		if err := handle(mux, p); err != nil {
			return nil, err
		}
	}
	return func(r *http.Request) (client.Entry, bool) {
		_, pattern := mux.Handler(r)
		if pattern == "" {
			return client.Entry{}, false
		}
		return client.Entry{Key: "path", Value: pattern}, true
	}, nil
}

var noop = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

// handle registers pattern, returning ServeMux's complaint about it as an error.
func handle(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("httplimit: pattern %q: %v", pattern, p)
		}
	}()
	mux.Handle(pattern, noop)
	return nil
}

// Value is the entry key=f(r); f returning ok false drops the descriptor.
func Value(key string, f func(r *http.Request) (string, bool)) Part {
	return func(r *http.Request) (client.Entry, bool) {
		v, ok := f(r)
		if !ok {
			return client.Entry{}, false
		}
		return client.Entry{Key: key, Value: clean(v)}, true
	}
}

// ContextValue is the entry key=<the request context's value for ctxKey>, such as the user an
// authentication middleware stored; the value must be a string or a fmt.Stringer, and anything
// else (or nothing) drops the descriptor.
func ContextValue(ctxKey any, key string) Part {
	return Value(key, func(r *http.Request) (string, bool) { return stringValue(r.Context(), ctxKey) })
}

func stringValue(ctx context.Context, k any) (string, bool) {
	switch v := ctx.Value(k).(type) {
	case string:
		return v, true
	case fmt.Stringer:
		return v.String(), true
	}
	return "", false
}

// Proxies is the set of addresses whose X-Forwarded-For is believed. The zero value and nil
// trust nobody.
type Proxies struct{ prefixes []netip.Prefix }

// TrustProxies returns the proxies at addrs: addresses ("10.0.0.7", "::1") or CIDR prefixes
// ("10.0.0.0/8").
func TrustProxies(addrs ...string) (*Proxies, error) {
	p := &Proxies{}
	for _, a := range addrs {
		if strings.Contains(a, "/") {
			pre, err := netip.ParsePrefix(a)
			if err != nil {
				return nil, fmt.Errorf("httplimit: trusted proxy %q: %w", a, err)
			}
			p.prefixes = append(p.prefixes, pre.Masked())
			continue
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q: %w", a, err)
		}
		ip = ip.Unmap()
		p.prefixes = append(p.prefixes, netip.PrefixFrom(ip, ip.BitLen()))
	}
	return p, nil
}

func (p *Proxies) trusts(ip netip.Addr) bool {
	if p == nil {
		return false
	}
	for _, pre := range p.prefixes {
		if pre.Contains(ip) {
			return true
		}
	}
	return false
}

// ClientIP is the entry remote_address=<the client's IP>, as Envoy's remote_address action
// sends it (no port, IPv6 without brackets). The client is the connection's peer, unless the
// peer is one of trusted: then X-Forwarded-For is read from the right, past every trusted
// proxy, to the first address that is not one; if all are, the leftmost. A peer that is not
// trusted cannot choose its address by sending X-Forwarded-For. A request over a non-IP
// connection drops the descriptor.
func ClientIP(trusted *Proxies) Part {
	return func(r *http.Request) (client.Entry, bool) {
		ip, ok := clientIP(r, trusted)
		if !ok {
			return client.Entry{}, false
		}
		return client.Entry{Key: "remote_address", Value: ip.String()}, true
	}
}

func clientIP(r *http.Request, trusted *Proxies) (netip.Addr, bool) {
	peer, ok := parseHop(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if !trusted.trusts(peer) {
		return peer, true
	}
	xff := r.Header["X-Forwarded-For"]
	client := peer
	for i := len(xff) - 1; i >= 0; i-- {
		hops := xff[i]
		for hops != "" {
			var hop string
			if j := strings.LastIndexByte(hops, ','); j >= 0 {
				hop, hops = hops[j+1:], hops[:j]
			} else {
				hop, hops = hops, ""
			}
			ip, ok := parseHop(strings.TrimSpace(hop))
			if !ok {
				// Nothing left of a hop that isn't an address can be believed.
				return client, true
			}
			client = ip
			if !trusted.trusts(ip) {
				return client, true
			}
		}
	}
	return client, true
}

// parseHop parses an address with or without a port ("1.2.3.4", "1.2.3.4:5", "[::1]:5", "::1").
func parseHop(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return ip.Unmap(), true
	}
	return netip.Addr{}, false
}
