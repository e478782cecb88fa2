package service

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/http"
	"net/url"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/httpjson"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/logthrottle"
)

// KeysOptions configures KeysHandler.
type KeysOptions struct {
	// AdminToken, when not empty, enables resetting keys (POST and DELETE) for requests that
	// carry "Authorization: Bearer <AdminToken>". Empty: resetting answers 404.
	AdminToken []byte
	// Logger records every reset, with who asked (the remote address) and what was reset
	// (default: the service's logger).
	Logger *slog.Logger
	// Warnings throttles the warning of a refused reset, which any client can cause at will
	// (default: one line a minute, with how many were suppressed, on Logger).
	Warnings *logthrottle.Throttle
}

// DefaultWarningInterval is how often a warning that a client can cause is logged, per cause,
// when the caller gives no throttle.
const DefaultWarningInterval = time.Minute

// KeyLimit is the state of one limit of a descriptor, as /v1/keys reports it.
type KeyLimit struct {
	Name            string `json:"name,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier"`
	Burst           uint32 `json:"burst"`
	Overdraft       bool   `json:"overdraft,omitempty"`
	Algorithm       string `json:"algorithm"`
	// Remaining is what would be admitted now: 0 while in debt.
	Remaining int64 `json:"remaining"`
	// ResetAfter is the time until the key is back to a full burst, in seconds.
	ResetAfter float64 `json:"reset_after_seconds"`
	// InDebt says the key was charged past its limit (overdraft): every request is denied
	// until RepaidAfter (seconds) has passed; Debt is how far past, in hits (rounded up), under
	// gcra. Under fixed_window a debt ends with its window, whatever its size: Debt is omitted.
	InDebt      bool    `json:"in_debt"`
	Debt        int64   `json:"debt,omitempty"`
	RepaidAfter float64 `json:"repaid_after_seconds,omitempty"`
	// SlotsHeld is, under algorithm concurrency, the slots held now, of requests_per_unit
	// (max_in_flight); reset_after_seconds is then the time until the last frees itself unless
	// released.
	SlotsHeld int64 `json:"slots_held,omitempty"`
}

// KeyDescriptor is one descriptor of a /v1/keys query: the rule it matched and its limits.
type KeyDescriptor struct {
	Entries []descriptors.Entry `json:"entries"`
	Rule    string              `json:"rule,omitempty"` // the matched rule's path; empty: none
	Limits  []KeyLimit          `json:"limits"`
}

// KeysResult is the answer of /v1/keys.
type KeysResult struct {
	Domain      string          `json:"domain"`
	Reset       int             `json:"reset,omitempty"` // keys reset (POST, DELETE)
	Descriptors []KeyDescriptor `json:"descriptors"`
}

// KeysHandler serves /v1/keys?domain=D&descriptor=k=v,k2=v2 (descriptor may repeat; a key or
// value may be percent-encoded, %2C for a comma):
//
//   - GET reads the state of every limit the descriptors match, as the next request would see
//     it, and charges nothing.
//   - POST or DELETE resets those keys (a full burst, no debt) and answers their state after.
//     It answers 404 unless opts.AdminToken is set, and 403, changing nothing, unless the
//     request carries that token as a bearer token (compared in constant time).
func (s *Service) KeysHandler(opts KeysOptions) http.Handler {
	log := opts.Logger
	if log == nil {
		log = s.log
	}
	warn := opts.Warnings
	if warn == nil {
		warn = logthrottle.New(log, DefaultWarningInterval)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reset, ok := keysMethod(w, r, opts.AdminToken, warn)
		if !ok {
			return
		}
		req, err := keysQuery(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The caller policy decides what a caller may ask about, its state included.
		if s.authorize != nil {
			if err := s.authorize(r.Context(), req); err != nil {
				http.Error(w, status.Convert(err).Message(), http.StatusForbidden)
				return
			}
		}
		rs := s.Rules()
		if rs == nil {
			http.Error(w, "no rules loaded yet", http.StatusServiceUnavailable)
			return
		}
		var wk work
		s.translate(rs, req, &wk, true)
		res := keysMatched(req, &wk)
		if reset && !s.resetKeys(w, r, &wk, &res, log) {
			return
		}
		if err := s.checkKeys(r.Context(), &wk, &res); err != nil {
			http.Error(w, clientMessage(err), statusOf(err))
			return
		}
		httpjson.Write(w, http.StatusOK, res)
	})
}

// keysMethod admits r's method: GET and HEAD read; POST and DELETE reset (reset true), only with
// an admin token set (404 without) and given (403 otherwise, warned of). It answers what it
// refuses and then reports ok false.
func keysMethod(w http.ResponseWriter, r *http.Request, token []byte, warn *logthrottle.Throttle) (reset, ok bool) {
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return false, true
	case http.MethodPost, http.MethodDelete:
		if len(token) == 0 {
			http.NotFound(w, r)
			return false, false
		}
		if !authorized(r, token) {
			warn.Warn("key reset refused", "key reset refused: wrong or missing admin token", "remote", r.RemoteAddr)
			http.Error(w, "forbidden", http.StatusForbidden)
			return false, false
		}
		return true, true
	}
	w.Header().Set("Allow", "GET, HEAD, POST, DELETE")
	http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	return false, false
}

// keysMatched is the result before any decision: each descriptor's entries and the rule it
// matched, with no limits yet.
func keysMatched(req *rlsv3.RateLimitRequest, wk *work) KeysResult {
	res := KeysResult{Domain: req.GetDomain(), Descriptors: make([]KeyDescriptor, len(req.Descriptors))}
	for i, d := range req.Descriptors {
		kd := &res.Descriptors[i]
		for _, e := range d.Entries {
			kd.Entries = append(kd.Entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		kd.Limits = []KeyLimit{}
		if ru := wk.descs[i].rule; ru != nil {
			kd.Rule = ru.Path
		}
	}
	return res
}

// resetKeys resets the keys of wk's items and logs it; it answers a backend that cannot (501)
// or fails and then reports false.
func (s *Service) resetKeys(w http.ResponseWriter, r *http.Request, wk *work, res *KeysResult, log *slog.Logger) bool {
	rb, ok := s.backend.(backend.Resetter)
	if !ok {
		http.Error(w, "this backend cannot reset keys", http.StatusNotImplemented)
		return false
	}
	keys := make([]string, 0, len(wk.items))
	for k := range wk.items {
		keys = append(keys, wk.items[k].req.Key)
	}
	if err := rb.Reset(r.Context(), keys); err != nil {
		http.Error(w, clientMessage(err), statusOf(err))
		return false
	}
	res.Reset = len(keys)
	// An audit record of an operator's write, rare by nature: it names what was reset so that
	// support can tell, and never the token.
	log.Info("keys reset", "remote", r.RemoteAddr, "domain", res.Domain, "descriptors", describe(res.Descriptors), "keys", len(keys))
	return true
}

// checkKeys decides each of wk's items in shadow mode (a check that charges nothing) and adds
// each limit's state to its descriptor in res.
func (s *Service) checkKeys(ctx context.Context, wk *work, res *KeysResult) error {
	if len(wk.items) == 0 {
		return nil
	}
	reqs := make([]backend.Request, len(wk.items))
	for k := range wk.items {
		reqs[k] = backend.Request{Key: wk.items[k].req.Key, Limit: wk.items[k].req.Limit, Mode: backend.Shadow}
	}
	decs := make([]backend.Decision, len(reqs))
	if _, err := s.backend.Decide(ctx, reqs, decs); err != nil {
		return err
	}
	for k := range wk.items {
		it := &wk.items[k]
		kd := &res.Descriptors[it.desc]
		kd.Limits = append(kd.Limits, keyLimit(it.limit, decs[k]))
	}
	return nil
}

// keyLimit reports limit l from a check (cost 0) of its key.
func keyLimit(l *descriptors.Limit, d backend.Decision) KeyLimit {
	kl := KeyLimit{
		Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit.String(), UnitMultiplier: l.UnitMultiplier,
		Burst: l.Burst, Overdraft: l.Spec.Overdraft, Algorithm: l.Spec.Algorithm.String(), Remaining: d.Remaining, ResetAfter: d.ResetAfter.Seconds(),
	}
	if l.Spec.Algorithm == limit.Concurrency {
		// A check is denied when every slot is held.
		kl.SlotsHeld = l.Spec.Rate - d.Remaining
		return kl
	}
	// A check is denied only in debt (or under a rate of 0, which holds no state).
	if !d.Allowed && l.Spec.Rate > 0 {
		kl.InDebt, kl.Remaining = true, 0
		kl.RepaidAfter = d.RetryAfter.Seconds()
		if l.Spec.Algorithm == limit.GCRA {
			kl.Debt = debtHits(d.RetryAfter, l.Spec)
		}
	}
	return kl
}

// debtHits is the number of hits a debt of span d holds under l, rounded up.
func debtHits(d time.Duration, l limit.Limit) int64 {
	us := uint64(d / time.Microsecond)
	hi, lo := bits.Mul64(us, uint64(l.Rate))
	p := uint64(l.Period / time.Microsecond)
	if hi >= p {
		return 1<<63 - 1
	}
	q, r := bits.Div64(hi, lo, p)
	if r > 0 {
		q++
	}
	return int64(q)
}

func describe(ds []KeyDescriptor) string {
	var b strings.Builder
	for i, d := range ds {
		if i > 0 {
			b.WriteString("; ")
		}
		for j, e := range d.Entries {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(e.Key + "=" + e.Value)
		}
	}
	return b.String()
}

// authorized reports whether r carries token as its bearer token, compared in constant time.
func authorized(r *http.Request, token []byte) bool {
	h := r.Header.Get("Authorization")
	got, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), token) == 1
}

func statusOf(err error) int {
	if errors.Is(err, backend.ErrUnavailable) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// keysQuery reads a /v1/keys query into a request with one descriptor per descriptor parameter.
func keysQuery(q url.Values) (*rlsv3.RateLimitRequest, error) {
	req := &rlsv3.RateLimitRequest{Domain: q.Get("domain")}
	for _, p := range q["descriptor"] {
		d, err := ParseDescriptor(p)
		if err != nil {
			return nil, err
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if len(req.Descriptors) == 0 {
		return nil, errors.New("give at least one descriptor=key=value,key2=value2")
	}
	if err := validate(req); err != nil {
		return nil, err
	}
	return req, nil
}

// DescriptorFormat says how a descriptor is written on a command line or in a /v1/keys query,
// for usage and error messages.
const DescriptorFormat = "key=value[,key=value...], with a ',', '=' or '%' in a key or value written %2C, %3D or %25"

// ParseDescriptor reads "key=value,key2=value2" into a descriptor: the one reader of that
// format, for rls check, rls inspect and rls reset and for /v1/keys. The text is split at every
// ',' and then at each pair's first '='; each key and value is then percent-decoded, so that
// %2C is a comma, %3D an '=' and %25 a '%' in it. A key must not be empty; a '%' not followed by
// two hex digits is an error.
func ParseDescriptor(s string) (*ratelimitv3.RateLimitDescriptor, error) {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor %q: want %s", s, DescriptorFormat)
		}
		var err error
		if k, err = url.PathUnescape(k); err == nil {
			v, err = url.PathUnescape(v)
		}
		if err != nil {
			return nil, fmt.Errorf("descriptor %q: %v (write a '%%' in a key or value as %%25)", s, err)
		}
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}
