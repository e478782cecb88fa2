package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/httplimit"
)

// player is a client.Checker playing rls: it answers each check with answer and keeps the
// descriptors it was asked about.
type player struct {
	asked  [][]client.Descriptor
	answer func(ctx context.Context, descs []client.Descriptor) (client.Decision, error)
}

func (p *player) checker() client.Checker {
	return client.CheckerFunc(func(ctx context.Context, descs ...client.Descriptor) (client.Decision, error) {
		p.asked = append(p.asked, slices.Clone(descs))
		return p.answer(ctx, descs)
	})
}

// perKey is rls's status of the api_key descriptor under 2 per hour, over its limit or not.
func perKey(d client.Descriptor, over bool, remaining uint32, wait time.Duration) client.Status {
	return client.Status{Descriptor: d, OverLimit: over, Remaining: remaining, Wait: wait,
		Limit: client.Limit{Name: "per_key", Requests: 2, Window: time.Hour}}
}

func record(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	if key != "" {
		r.Header.Set("X-API-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHandlerAllowDeny runs a handler against a Checker playing rls, without a server: an
// admitted request reaches the next handler with the rate-limit headers; a denied one does not,
// and is answered 429 with Retry-After (rounded up to whole seconds), by WriteDenied (rls's raw
// body when it sent one) or by Options.Deny; a request without descriptors is not checked.
func TestHandlerAllowDeny(t *testing.T) {
	var next int
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { next++; io.WriteString(w, "ok") })
	p := &player{}
	key := httplimit.By(httplimit.Header("X-API-Key", "api_key"))
	for _, tc := range []struct {
		name    string
		opts    httplimit.Options
		answer  func(d client.Descriptor) client.Decision
		code    int
		body    string
		headers map[string]string // "" value: absent
		next    int
	}{
		{"allow", httplimit.Options{}, func(d client.Descriptor) client.Decision {
			return client.NewDecision(perKey(d, false, 1, 30*time.Minute))
		}, 200, "ok", map[string]string{"RateLimit-Policy": `"per_key";q=2;w=3600`, "RateLimit": `"per_key";r=1;t=1800`, "Retry-After": ""}, 1},
		{"allow legacy", httplimit.Options{Headers: client.HeadersLegacy}, func(d client.Descriptor) client.Decision {
			return client.NewDecision(perKey(d, false, 1, 30*time.Minute))
		}, 200, "ok", map[string]string{"X-RateLimit-Limit": `2, 2;w=3600;name="per_key"`, "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1800", "RateLimit": ""}, 1},
		{"deny", httplimit.Options{}, func(d client.Descriptor) client.Decision {
			return client.NewDecision(perKey(d, true, 0, 89500*time.Millisecond))
		}, 429, "rate limit exceeded\n", map[string]string{"Retry-After": "90", "RateLimit": `"per_key";r=0;t=90`, "Content-Type": "text/plain; charset=utf-8"}, 0},
		{"deny with rls's body", httplimit.Options{}, func(d client.Descriptor) client.Decision {
			dec := client.NewDecision(perKey(d, true, 0, time.Minute))
			dec.Body = []byte(`{"error":"slow down"}`)
			dec.RLSHeaders = http.Header{"Content-Type": {"application/json"}}
			return dec
		}, 429, `{"error":"slow down"}`, map[string]string{"Retry-After": "60", "Content-Type": "application/json"}, 0},
		{"deny by Options.Deny", httplimit.Options{Deny: describe, Headers: client.HeadersNone}, func(d client.Descriptor) client.Decision {
			return client.NewDecision(perKey(d, true, 0, time.Minute))
		}, 429, "api_key=k per_key", map[string]string{"Retry-After": "60", "RateLimit": "", "RateLimit-Policy": ""}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next = 0
			p.asked = nil
			p.answer = func(_ context.Context, descs []client.Descriptor) (client.Decision, error) {
				return tc.answer(descs[0]), nil
			}
			h := httplimit.New(p.checker(), tc.opts).Handler(counted, key)
			w := record(h, "k")
			if w.Code != tc.code || w.Body.String() != tc.body || next != tc.next {
				t.Errorf("%d %q, next handler ran %d times; want %d %q, %d", w.Code, w.Body, next, tc.code, tc.body, tc.next)
			}
			for k, want := range tc.headers {
				if got := w.Header().Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if fmt.Sprint(p.asked) != "[[api_key=k]]" {
				t.Errorf("asked %v, want [[api_key=k]]", p.asked)
			}
			// Without the header the request yields no descriptor: not checked, admitted.
			if w := record(h, ""); w.Code != 200 || len(p.asked) != 1 {
				t.Errorf("without a key: %d, asked %v", w.Code, p.asked)
			}
		})
	}
}

type ctxKey struct{}

// TestHandlerFailure runs a handler against a Checker playing an outage of rls under each
// failure policy (fail open admits, fail closed answers 429 with Retry-After 1, FailError 503),
// invalid descriptors (500), and Options.Error choosing the answer itself, failing open or not.
// The request's context reaches the Checker.
func TestHandlerFailure(t *testing.T) {
	outage := errors.New("connection refused")
	for _, tc := range []struct {
		name       string
		answer     func() (client.Decision, error)
		onError    func(w http.ResponseWriter, r *http.Request, err error)
		code       int
		body       string
		retryAfter string
	}{
		{"fail open", func() (client.Decision, error) { return client.FailAllow.Answer(outage) }, nil, 200, "ok", ""},
		{"fail closed", func() (client.Decision, error) { return client.FailDeny.Answer(outage) }, nil, 429, "rate limit exceeded\n", "1"},
		{"fail error", func() (client.Decision, error) { return client.FailError.Answer(outage) }, nil, 503, "rate limit service unavailable\n", ""},
		{"invalid", func() (client.Decision, error) {
			return client.Decision{}, fmt.Errorf("%w: value too long", client.ErrInvalid)
		}, nil, 500, "rate limit check failed\n", ""},
		{"Options.Error opens", func() (client.Decision, error) { return client.FailError.Answer(outage) },
			func(w http.ResponseWriter, r *http.Request, err error) {
				if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, outage) {
					t.Errorf("Options.Error got %v", err)
				}
				ok.ServeHTTP(w, r)
			}, 200, "ok", ""},
		{"Options.Error closes", func() (client.Decision, error) { return client.FailError.Answer(outage) },
			func(w http.ResponseWriter, r *http.Request, err error) {
				http.Error(w, "try later", http.StatusTooManyRequests)
			}, 429, "try later\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &player{answer: func(ctx context.Context, _ []client.Descriptor) (client.Decision, error) {
				if ctx.Value(ctxKey{}) != "request" {
					t.Error("the Checker did not get the request's context")
				}
				return tc.answer()
			}}
			h := httplimit.New(p.checker(), httplimit.Options{Error: tc.onError}).
				Handler(ok, httplimit.By(httplimit.Header("X-API-Key", "api_key")))
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-API-Key", "k")
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, "request"))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.code || w.Body.String() != tc.body || w.Header().Get("Retry-After") != tc.retryAfter ||
				w.Header().Get("RateLimit") != "" || len(p.asked) != 1 {
				t.Errorf("%d %q Retry-After %q RateLimit %q (asked %d times), want %d %q %q, no RateLimit, asked once",
					w.Code, w.Body, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"), len(p.asked),
					tc.code, tc.body, tc.retryAfter)
			}
		})
	}
}

// A handler's test without a running rls: a CheckerFunc plays rls denying the key.
func ExampleNew_checkerFunc() {
	fake := client.CheckerFunc(func(ctx context.Context, descs ...client.Descriptor) (client.Decision, error) {
		return client.NewDecision(client.Status{Descriptor: descs[0], OverLimit: true, Wait: time.Minute,
			Limit: client.Limit{Name: "per_key", Requests: 2, Window: time.Hour}}), nil
	})
	h := httplimit.New(fake, httplimit.Options{}).Handler(ok, httplimit.By(httplimit.Header("X-API-Key", "api_key")))
	w := record(h, "k")
	fmt.Println(w.Code, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"))
	// Output: 429 60 "per_key";r=0;t=60
}
