package httplimit

import (
	"errors"
	"net/http"

	"github.com/rls-project/rls/client"
)

// Options configures a Limiter. The zero value writes the IETF draft headers and default
// denial and error responses.
type Options struct {
	// Headers is the style of the rate-limit headers on every response (default
	// client.HeadersDraft: RateLimit and RateLimit-Policy as rls emits them; client.HeadersLegacy:
	// X-RateLimit-Limit/-Remaining/-Reset).
	Headers client.HeaderStyle
	// Deny writes the response to a denied request (default WriteDenied). The rate-limit headers
	// and Retry-After are already on w.Header(); Deny writes the status, normally 429, and body.
	Deny func(w http.ResponseWriter, r *http.Request, d client.Decision)
	// Error writes the response when no decision could be had: invalid descriptors, or rls
	// unavailable under client.FailError (default WriteError).
	Error func(w http.ResponseWriter, r *http.Request, err error)
	// InFlight makes each request hold a slot of the concurrency limits its descriptors match
	// (rls's docs/concurrency.md) while its handler runs: the Limiter asks with
	// client.Acquirer's Acquire and releases when the handler returns, panics, or its request's
	// context is cancelled. New panics when InFlight is set and its Checker is no Acquirer.
	InFlight bool
}

// Limiter makes middleware that asks one client. It is safe for concurrent use.
type Limiter struct {
	c    client.Checker
	opts Options
}

// New returns a Limiter asking c: a *client.Client, or in a handler's tests a
// client.CheckerFunc playing rls.
func New(c client.Checker, opts Options) *Limiter {
	if opts.Deny == nil {
		opts.Deny = WriteDenied
	}
	if opts.Error == nil {
		opts.Error = WriteError
	}
	if _, ok := c.(client.Acquirer); opts.InFlight && !ok {
		panic("httplimit: Options.InFlight needs a client.Acquirer")
	}
	return &Limiter{c: c, opts: opts}
}

// Handler returns next behind the limits of descs: every descriptor a request yields is sent
// to rls in one call, and the request is admitted only if all are within their limits. A
// request that yields no descriptor passes without a call. Wrap each route's handler with its
// own descriptors to choose limits per route.
func (l *Limiter) Handler(next http.Handler, descs ...Descriptor) http.Handler {
	return &handler{l: l, next: next, descs: descs}
}

// Middleware returns Handler as a func(http.Handler) http.Handler, for middleware chains.
func (l *Limiter) Middleware(descs ...Descriptor) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler { return l.Handler(next, descs...) }
}

type handler struct {
	l     *Limiter
	next  http.Handler
	descs []Descriptor
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buf [4]client.Descriptor
	descs := buf[:0]
	for _, d := range h.descs {
		if cd, ok := d.build(r); ok {
			descs = append(descs, cd)
		}
	}
	if len(descs) == 0 {
		h.next.ServeHTTP(w, r)
		return
	}
	var d client.Decision
	var err error
	if h.l.opts.InFlight {
		var release func()
		d, release, err = h.l.c.(client.Acquirer).Acquire(r.Context(), descs...)
		defer release() // runs on a panic of the handler too
	} else {
		d, err = h.l.c.Check(r.Context(), descs...)
	}
	if err != nil {
		h.l.opts.Error(w, r, err)
		return
	}
	d.WriteHeaders(w.Header(), h.l.opts.Headers)
	if !d.Allowed {
		h.l.opts.Deny(w, r, d)
		return
	}
	h.next.ServeHTTP(w, r)
}

// WriteDenied writes 429 Too Many Requests with rls's raw_body when it sent one, else a short
// text.
func WriteDenied(w http.ResponseWriter, r *http.Request, d client.Decision) {
	if len(d.Body) > 0 {
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write(d.Body)
		return
	}
	http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
}

// WriteError writes 503 Service Unavailable when rls was unavailable, 500 otherwise.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, client.ErrUnavailable) {
		http.Error(w, "rate limit service unavailable", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, "rate limit check failed", http.StatusInternalServerError)
}
