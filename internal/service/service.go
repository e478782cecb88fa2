package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/statekey"
	"github.com/rls-project/rls/internal/top"
)

// maxCost caps a hits_addend; any cost above a limit's burst is denied anyway. The other bounds
// on a request are limit's: anything larger is answered InvalidArgument.
const maxCost = 1 << 40

// Options configures a Service.
type Options struct {
	Backend backend.Backend
	Logger  *slog.Logger // default slog.Default()
	Headers HeaderMode
	// FailureMode is the answer when Backend fails, for rules without their own failure_mode.
	FailureMode FailureMode
	// Local decides for FailLocal; it must be set when any rule or the default uses it.
	Local backend.Backend
	// Metrics, when set, records decisions, hits and backend latency.
	Metrics *Metrics
	// Tracer, when set, wraps each backend call in a span.
	Tracer trace.Tracer
	// Stats, when set with Metrics, is told each descriptor decision too (stats.go).
	Stats Stats
	// Global, when set, says for /debug/explain what this region holds of a global limit.
	Global GlobalExplainer
	// DetailedMetricValues caps the distinct label values that one detailed_metric or
	// value_to_metric rule may add to the metrics (0: DefaultDetailedMetricValues). Such labels
	// carry raw descriptor values (user ids, addresses) onto /metrics, and every value is a
	// series per outcome: keep it small. Values past the cap count under the rule's path with
	// "/_overflow_", and the first overflow of each rule logs a warning.
	DetailedMetricValues int
	// LegacyHeaderNames renames the headers of HeadersLegacy.
	LegacyHeaderNames LegacyHeaderNames
	// MaxInflightBytes bounds the memory that requests being decided may hold at once, as
	// requestWeight counts it; a request that would take the total past it is shed through the
	// failure mode, counted in rls_inflight_shed_total. 0: no bound.
	MaxInflightBytes int64
	// MaxJSONBytes bounds a POST /json body (0: DefaultMaxRequestBytes).
	MaxJSONBytes int64
	// Overrides says what a descriptor's limit override may do (the zero value: overrides
	// allowed, of any period).
	Overrides OverridePolicy
	// ShadowMode and QuotaMode put every rule in shadow mode or quota mode, as if each had
	// shadow_mode: true or quota_mode: true.
	ShadowMode, QuotaMode bool
	// Authorize, when set, is asked about every valid request (gRPC and POST /json) before it is
	// decided: an error, which should be a gRPC status (PermissionDenied), is the answer.
	Authorize func(ctx context.Context, req *rlsv3.RateLimitRequest) error
	// MaxNewKeysPerCaller bounds the keys one caller may make the backend create a second (keys
	// this process has not let through in the last 30–60 s): a request past it is answered
	// RESOURCE_EXHAUSTED and counted in rls_new_keys_refused_total. See newkeys.go. 0: no bound.
	MaxNewKeysPerCaller int64
	// DecisionLog, when set, is given the decisions it asks for (decisionlog.go).
	DecisionLog *decisionlog.Log
	// Warnings throttles the warnings a client can cause at will, here a request refused by
	// MaxNewKeysPerCaller (default: one line a minute per cause on Logger).
	Warnings *logthrottle.Throttle
	// Top, when set, is told every descriptor's decision (top.go): /debug/top's top talkers.
	Top *top.Top
}

// DefaultDetailedMetricValues is the default of Options.DetailedMetricValues.
const DefaultDetailedMetricValues = 100

// Service implements RateLimitServiceServer. It is safe for concurrent use; its rules can be
// swapped at any time with SetRules and each request sees one rule set from start to end.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	rules atomic.Pointer[descriptors.RuleSet]
	// someRuleAnswers: a rule of the set in force has failure_mode allow, deny or local
	// (AnswersWithoutBackend), found once per set rather than per readiness check.
	someRuleAnswers atomic.Bool
	backend         backend.Backend
	log             *slog.Logger
	headers         HeaderMode
	failure         FailureMode
	// localBackend decides when the backend fails and the failure mode is FailLocal.
	localBackend backend.Backend
	metrics      *Metrics
	tracer       trace.Tracer
	stats        Stats
	global       GlobalExplainer
	pool         sync.Pool // *work
	detailedMax  int
	headerNames  LegacyHeaderNames
	shadowAll    bool                  // every rule in shadow mode
	quotaAll     bool                  // every rule in quota mode
	errLog       *logthrottle.Throttle // backend errors other than unavailability
	maxInflight  int64
	inflight     atomic.Int64 // requestWeight of the requests being decided
	maxJSON      int64
	overrides    OverridePolicy
	authorize    func(context.Context, *rlsv3.RateLimitRequest) error
	newKeys      *newKeyGate           // nil: no bound on new keys
	warn         *logthrottle.Throttle // warnings a client can cause; nil without a new-key gate
	decisions    *decisionlog.Log      // nil: no decision log
	top          *top.Top              // nil: top talkers off

	mu         sync.Mutex // serializes SetRules
	generation atomic.Uint64
	loadedAt   atomic.Int64 // unix nanoseconds
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New returns a Service deciding with rules and opts.Backend. With rules nil there are no rules
// yet: ShouldRateLimit answers UNAVAILABLE until the first SetRules.
func New(rules *descriptors.RuleSet, opts Options) (*Service, error) {
	if opts.Backend == nil {
		return nil, errors.New("service: no backend")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.FailureMode == FailLocal && opts.Local == nil {
		return nil, errors.New("service: failure mode local needs a local backend")
	}
	if opts.DetailedMetricValues < 0 {
		return nil, errors.New("service: DetailedMetricValues must be ≥ 0")
	}
	s := &Service{backend: opts.Backend, log: opts.Logger, headers: opts.Headers, failure: opts.FailureMode,
		localBackend: opts.Local, metrics: opts.Metrics, tracer: opts.Tracer, stats: opts.Stats,
		global:      opts.Global,
		detailedMax: cmp.Or(opts.DetailedMetricValues, DefaultDetailedMetricValues),
		headerNames: opts.LegacyHeaderNames.withDefaults(), shadowAll: opts.ShadowMode, quotaAll: opts.QuotaMode,
		maxInflight: opts.MaxInflightBytes, maxJSON: cmp.Or(opts.MaxJSONBytes, DefaultMaxRequestBytes),
		overrides: opts.Overrides}
	if opts.MaxInflightBytes < 0 || opts.MaxJSONBytes < 0 || opts.MaxNewKeysPerCaller < 0 {
		return nil, errors.New("service: MaxInflightBytes, MaxJSONBytes and MaxNewKeysPerCaller must be ≥ 0")
	}
	s.newKeys = newNewKeyGate(opts.MaxNewKeysPerCaller, newKeyCallers)
	s.errLog = logthrottle.New(opts.Logger, backendErrorInterval)
	if s.warn = opts.Warnings; s.warn == nil && s.newKeys != nil {
		s.warn = logthrottle.New(opts.Logger, DefaultWarningInterval)
	}
	s.pool.New = func() any { return new(work) }
	s.authorize = opts.Authorize
	s.decisions = opts.DecisionLog
	s.top = opts.Top
	if rules != nil {
		s.SetRules(rules)
	}
	return s, nil
}

// SetRules swaps the rule set atomically: a request sees the old set or the new one, whole.
func (s *Service) SetRules(rs *descriptors.RuleSet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metrics.reset(rs)
	s.someRuleAnswers.Store(ruleAnswers(rs))
	s.rules.Store(rs)
	now := time.Now()
	gen := s.generation.Add(1)
	s.loadedAt.Store(now.UnixNano())
	s.metrics.ConfigLoad(true, gen, now)
}

// RulesRejected records a rule set that failed to load; the rules in force stay.
func (s *Service) RulesRejected() { s.metrics.ConfigLoad(false, 0, time.Time{}) }

// Generation returns the generation of the rules in force (1 for the first set) and when they
// were loaded.
func (s *Service) Generation() (uint64, time.Time) {
	return s.generation.Load(), time.Unix(0, s.loadedAt.Load())
}

// Rules returns the rule set in force.
func (s *Service) Rules() *descriptors.RuleSet { return s.rules.Load() }

// work is one request's scratch space, pooled.
type work struct {
	descs    []descState // per request descriptor
	items    []item      // per backend request, grouped by descriptor in request order
	entries  []descriptors.Entry
	keys     []byte
	replaced []string // names dropped by a matched limit's replaces
	// The backend's arguments, filled from items for the call.
	reqs []backend.Request
	out  []backend.Decision
	// For the local backend under FailLocal.
	localReqs []backend.Request
	localOut  []backend.Decision
	label     []byte   // a detailed_metric label being built
	hashes    []uint64 // the items' keys hashed for the new-key gate
}

// descState is what one request descriptor matched.
type descState struct {
	rule   *descriptors.Rule // nil: no rule, or an override
	limits []descriptors.Limit
	over   [1]descriptors.Limit // backs limits for a request's override
	// override: limits is the descriptor's own override, decided in a key of its own.
	override bool
	// slot and release are the descriptor's SlotEntry and ReleaseEntry (see slots.go); plain
	// is then its entries without them (nil when it has neither).
	slot    string
	release bool
	plain   []*ratelimitv3.RateLimitDescriptor_Entry
}

// item is one backend request of a request: one limit of one descriptor, with its decision and
// how that decision was reached.
type item struct {
	desc  int // index of its descriptor in the request
	limit *descriptors.Limit
	req   backend.Request
	dec   backend.Decision
	// fail is the failure mode that answers it when the backend is unavailable, resolved (never
	// FailureDefault).
	fail FailureMode
	// via is how dec was reached: FailureDefault by the backend, else the failure mode that
	// answered it; FailError when the request as a whole failed.
	via FailureMode
	// replaced: a matched limit's replaces drops this one; only translate(keepReplaced) keeps
	// such items, and they are never decided.
	replaced bool
	keyEnd   int // its key is work.keys[previous item's keyEnd:keyEnd]
}

// ShouldRateLimit implements RateLimitServiceServer.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if err := validate(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.authorize != nil {
		if err := s.authorize(ctx, req); err != nil {
			return nil, err
		}
	}
	if err := s.overrides.check(req); err != nil {
		return nil, err
	}
	rs := s.rules.Load()
	if rs == nil {
		return nil, status.Error(codes.Unavailable, "no rules loaded yet")
	}
	w := s.pool.Get().(*work)
	defer s.pool.Put(w)
	s.translate(rs, req, w, false)
	admitted := true
	if len(w.items) == 0 {
		markUnknownDomain(ctx, rs, req.GetDomain())
	}
	if len(w.items) > 0 {
		if s.newKeys != nil {
			if err := s.checkNewKeys(ctx, w); err != nil {
				return nil, err
			}
		}
		if s.maxInflight > 0 {
			weight := requestWeight(req)
			if s.inflight.Add(weight) > s.maxInflight {
				s.inflight.Add(-weight)
				return s.failed(ctx, req, w, errInflight)
			}
			defer s.inflight.Add(-weight)
		}
		var err error
		if admitted, err = s.decide(ctx, w); err != nil {
			return s.failed(ctx, req, w, err)
		}
		// The decisions' observers, each one call here: top talkers (top.go).
		if s.top != nil {
			s.observeTop(req, w)
		}
	}
	resp := s.response(req, w, admitted)
	s.debugDecision(ctx, req, resp)
	// Decision log (decisionlog.go): a line for each descriptor it asks for.
	if s.decisions != nil {
		s.logDecisions(ctx, req, w, resp)
	}
	return resp, nil
}

// translate turns a validated request into its backend requests, one item per limit of each
// descriptor in order, matched against rs: each with its key, limit, cost, mode and failure
// mode. Limits dropped by another's replaces are left out, or with keepReplaced kept and marked.
// It is the one translation of a request, shared by ShouldRateLimit and /debug/explain.
func (s *Service) translate(rs *descriptors.RuleSet, req *rlsv3.RateLimitRequest, w *work, keepReplaced bool) {
	n := len(req.Descriptors)
	w.descs = slices.Grow(w.descs[:0], n)[:n]
	clear(w.descs)
	w.items = w.items[:0]
	w.keys = w.keys[:0]
	w.replaced = w.replaced[:0]
	domain := req.GetDomain()
	for i, d := range req.Descriptors {
		ds := &w.descs[i]
		if o := d.GetLimit(); o != nil && !s.overrides.Ignore {
			// As envoyproxy/ratelimit does, an override applies in a domain the rules
			// define, whether or not a rule matches its entries; elsewhere it is not applied.
			if rs.HasDomain(domain) {
				ds.over[0] = overrideLimit(o)
				ds.limits = ds.over[:]
				ds.override = true
			}
			continue
		}
		w.entries = w.entries[:0]
		for _, e := range d.Entries {
			w.entries = append(w.entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		w.entries = ds.takeSlotEntries(d.Entries, w.entries)
		if r := rs.Match(domain, w.entries); r != nil {
			ds.rule = r
			ds.limits = r.Limits
		}
	}

	// A matched limit's replaces drop the named limits from the whole request.
	for i := range w.descs {
		for j := range w.descs[i].limits {
			w.replaced = append(w.replaced, w.descs[i].limits[j].Replaces...)
		}
	}

	hits := int64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1
	}
	for i, d := range req.Descriptors {
		ds := &w.descs[i]
		cost := hits
		if h := d.GetHitsAddend(); h != nil {
			cost = int64(min(h.GetValue(), maxCost))
		}
		mode := backend.Enforce
		var share []string
		if r := ds.rule; r != nil {
			share = r.Share
			switch {
			case r.ShadowMode || s.shadowAll:
				mode = backend.Shadow
			case r.QuotaMode || s.quotaAll:
				mode = backend.Quota
			}
		}
		fail := s.failureModeOf(ds.rule)
		entries := d.Entries
		if ds.plain != nil {
			entries = ds.plain
		}
		for j := range ds.limits {
			l := &ds.limits[j]
			replaced := l.Name != "" && slices.Contains(w.replaced, l.Name)
			if replaced && !keepReplaced {
				continue
			}
			req := backend.Request{Limit: l.Spec, Cost: cost, Refund: d.GetIsNegativeHits(), Mode: mode}
			if !ds.slotRequest(&req) {
				continue
			}
			if ds.override {
				w.appendOverrideKey(domain, entries, d.GetLimit())
			} else {
				w.appendKey(domain, entries, share, l.KeyTag)
			}
			w.items = append(w.items, item{
				desc: i, limit: l, fail: fail, replaced: replaced, keyEnd: len(w.keys), req: req,
			})
		}
	}
	if len(w.items) > 0 {
		keys := string(w.keys) // one allocation for every key of the request
		start := 0
		for k := range w.items {
			w.items[k].req.Key = keys[start:w.items[k].keyEnd]
			start = w.items[k].keyEnd
		}
	}
}

// appendKey appends the backend key of one limit of a descriptor: the domain, every entry's key
// and value (or, under share_threshold, the wildcard pattern), each length-prefixed so that no
// two descriptors can encode alike ("a_b"+"c" vs "a"+"b_c"), then '#' and the limit's tag
// (descriptors.Limit.KeyTag, computed at load): "0" for a rule's singular rate_limit, the name
// or the period and algorithm of a limit of a rate_limits list, never its place in the list.
func (w *work) appendKey(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, share []string, tag string) {
	w.keys = statekey.AppendField(w.keys, domain)
	for i, e := range entries {
		w.keys = statekey.AppendField(w.keys, e.GetKey())
		if i < len(share) && share[i] != "" {
			w.keys = append(w.keys, '*')
			w.keys = statekey.AppendField(w.keys, share[i])
		} else {
			w.keys = statekey.AppendField(w.keys, e.GetValue())
		}
	}
	w.keys = append(w.keys, '#')
	w.keys = append(w.keys, tag...)
}

// appendOverrideKey appends the backend key of a descriptor's override: the domain and entries
// as appendKey encodes them, then "#o" and the override's rate and period. No rule's key ends
// so (no limit's tag begins with 'o'), so an override never reads or writes a rule's state, and two
// overrides of the same entries share state only when they ask for the same limit: a request
// can neither reset a rule's window with an override nor re-express another override's state.
func (w *work) appendOverrideKey(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) {
	w.keys = statekey.AppendField(w.keys, domain)
	for _, e := range entries {
		w.keys = statekey.AppendField(w.keys, e.GetKey())
		w.keys = statekey.AppendField(w.keys, e.GetValue())
	}
	w.keys = append(w.keys, "#o"...)
	w.keys = strconv.AppendUint(w.keys, uint64(o.GetRequestsPerUnit()), 10)
	w.keys = append(w.keys, '/')
	w.keys = strconv.AppendInt(w.keys, int64(overridePeriod(o)/time.Second), 10)
}

// decide calls the backend, timed and traced.
func (s *Service) decide(ctx context.Context, w *work) (bool, error) {
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.tracer.Start(ctx, "rls.backend.Decide", trace.WithAttributes(attribute.Int("rls.keys", len(w.items))))
		defer span.End()
		admitted, err := s.timedDecide(ctx, w)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(otelcodes.Error, "backend failed")
		}
		span.SetAttributes(attribute.Bool("rls.admitted", admitted))
		return admitted, err
	}
	return s.timedDecide(ctx, w)
}

func (s *Service) timedDecide(ctx context.Context, w *work) (bool, error) {
	w.reqs = w.reqs[:0]
	for k := range w.items {
		w.reqs = append(w.reqs, w.items[k].req)
	}
	w.out = slices.Grow(w.out[:0], len(w.reqs))[:len(w.reqs)]
	clear(w.out)
	var start time.Time
	if s.metrics != nil {
		start = time.Now()
	}
	admitted, err := s.backend.Decide(ctx, w.reqs, w.out)
	if s.metrics != nil {
		s.metrics.latency.Observe(time.Since(start).Seconds())
	}
	if err == nil {
		for k := range w.items {
			w.items[k].dec = w.out[k]
		}
	}
	return admitted, err
}

// response builds the answer: one status per request descriptor, in order, each from the
// limit that answers for it (limiting), then the dynamic metadata and the headers.
func (s *Service) response(req *rlsv3.RateLimitRequest, w *work, admitted bool) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors)),
	}
	if !admitted {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	s.metrics.countSlots(w, admitted)
	var md responseMetadata
	k := 0
	for i := range req.Descriptors {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		r := w.descs[i].rule
		if r != nil && r.Unlimited {
			st.LimitRemaining = math.MaxUint32
		}
		var best int
		if best, k = limiting(w.items, i, k); best < 0 {
			continue
		}
		it := &w.items[best]
		if s.metrics != nil {
			s.record(req.Domain, w.descs[i].counted(req.Descriptors[i]), r, w, it)
		}
		if it.via == FailAllow && it.dec.Allowed {
			// Admitted without a decision: no limit or remaining to report, so that Envoy's
			// headers don't promise what nothing counted.
			continue
		}
		setStatus(st, it)
		md.add(i, r, it.dec.Allowed, s.quotaAll)
	}
	resp.DynamicMetadata = md.build(s.log)
	if s.headers != HeadersNone {
		resp.ResponseHeadersToAdd = s.headers.build(resp.Statuses, s.headerNames)
	}
	return resp
}

// limiting returns the index of the item that answers for descriptor i, among the items from k
// on (those of descriptor i come first), and the index of the next descriptor's first item:
// the limit that denies or, when all admit, the one with least remaining; -1 when i has none.
func limiting(items []item, i, k int) (best, next int) {
	best = -1
	for ; k < len(items) && items[k].desc == i; k++ {
		if best < 0 {
			best = k
			continue
		}
		if backend.Tighter(&items[best].dec, &items[k].dec) {
			best = k
		}
	}
	return best, k
}

// setStatus fills st from the item that answers for its descriptor: the limit, what remains,
// the wait and, when denied outside shadow mode, OVER_LIMIT.
func setStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, it *item) {
	d := it.dec
	lim := it.limit
	st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
		Name:            lim.Name,
		RequestsPerUnit: lim.RequestsPerUnit,
		Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(lim.Unit),
	}
	if lim.UnitMultiplier > 1 {
		// Absent means 1: the answer Envoy decodes on every request stays smaller.
		st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(lim.UnitMultiplier)
	}
	st.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	wait := d.ResetAfter
	if !d.Allowed {
		wait = d.RetryAfter
		if it.req.Mode != backend.Shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if it.req.Unadmittable() {
			// A cost above the burst is never admitted, however long it waits: the status
			// says no time (neither "retry now" nor a wait that would not help).
			st.DurationUntilReset = nil
			return
		}
	}
	st.DurationUntilReset = durationpb.New(wait)
}

// responseMetadata gathers a response's dynamic metadata: quota mode's enabled flag and
// violations, and, nested under "metadata", the metadata of the rules whose descriptor passed.
// The nesting and which descriptors count are envoyproxy/ratelimit's, so that a proxy reading
// %DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:<key>:...)% finds the same values.
type responseMetadata struct {
	quotaSeen       bool
	quotaViolations []any
	meta            map[string]any // the rules' metadata, merged
	owned           bool           // meta is this response's own, not the first rule's map
}

// add takes descriptor i's share: r its rule (nil for none), allowed its limit's decision;
// quotaAll is --quota-mode.
//
// A rule's metadata counts when its descriptor passed: its limit allowed it, or the rule is in
// shadow mode (its status is OK). Whether the request as a whole was admitted does not matter,
// nor does --shadow-mode, which answers OK overall but leaves a denied descriptor denied here,
// as envoyproxy/ratelimit does. Descriptors count in request order and the first to set a key
// wins; where two rules set a key to objects, the objects are merged the same way, key by key.
func (m *responseMetadata) add(i int, r *descriptors.Rule, allowed, quotaAll bool) {
	if r == nil {
		return
	}
	if r.QuotaMode || quotaAll {
		m.quotaSeen = true
		if !allowed {
			m.quotaViolations = append(m.quotaViolations, float64(i))
		}
	}
	if r.Metadata != nil && (allowed || r.ShadowMode) {
		switch {
		case m.meta == nil:
			// The common case, one rule with metadata: its map as it is, never written.
			m.meta = r.Metadata
		default:
			if !m.owned {
				own := make(map[string]any, len(m.meta))
				mergeFirst(own, m.meta)
				m.meta, m.owned = own, true
			}
			mergeFirst(m.meta, r.Metadata)
		}
	}
}

// mergeFirst adds to dst the keys of src that dst lacks, and merges into dst's objects those
// of src under the same key; a value dst holds is never replaced. It copies every object it
// adds, so that merging into one later never changes a rule's metadata.
func mergeFirst(dst, src map[string]any) {
	for k, v := range src {
		sv, srcObj := v.(map[string]any)
		if have, ok := dst[k]; ok {
			if dv, dstObj := have.(map[string]any); dstObj && srcObj {
				mergeFirst(dv, sv)
			}
			continue
		}
		if srcObj {
			obj := make(map[string]any, len(sv))
			mergeFirst(obj, sv)
			v = obj
		}
		dst[k] = v
	}
}

// build returns the metadata as the response carries it, nil when there is none. Metadata that
// a Struct cannot hold is dropped with a warning.
func (m *responseMetadata) build(log *slog.Logger) *structpb.Struct {
	if !m.quotaSeen && m.meta == nil {
		return nil
	}
	top := map[string]any{}
	if m.meta != nil {
		top["metadata"] = m.meta
	}
	if m.quotaSeen {
		top["quotaModeEnabled"] = true
		top["quotaModeViolations"] = m.quotaViolations
	}
	md, err := structpb.NewStruct(top)
	if err != nil {
		log.Warn("dropping dynamic metadata", slog.Any("err", err))
		return nil
	}
	return md
}

// overrideLimit is the limit a descriptor's override asks for: its burst is its rate, its
// multiplier 1 when unset.
func overrideLimit(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) descriptors.Limit {
	return descriptors.NewLimit("", o.GetRequestsPerUnit(), limit.Unit(o.GetUnit()), o.GetUnitMultiplier().GetValue(), 0)
}

// DefaultMaxRequestBytes is the default bound on a request's encoding, a gRPC message or a
// POST /json body: 64 descriptors each with a value of 1 KiB fit, where Envoy's requests
// take a few hundred bytes.
const DefaultMaxRequestBytes = 64 << 10

// DefaultMaxInflightBytes is the default of Options.MaxInflightBytes as the command sets it.
const DefaultMaxInflightBytes = 64 << 20

// errInflight is the failure of a request shed because those in flight hold MaxInflightBytes.
var errInflight = fmt.Errorf("%w: too many requests in flight", backend.ErrUnavailable)

// requestWeight is what a validated request is taken to hold while it is decided: its decoded
// strings, its descriptors' structures, their backend requests, keys and statuses, and the
// response. It errs high: a typical Envoy request of three entries weighs about 1.5 KiB.
func requestWeight(req *rlsv3.RateLimitRequest) int64 {
	w := int64(1024 + len(req.GetDomain()))
	for _, d := range req.Descriptors {
		w += 384 + int64(len(req.GetDomain()))
		for _, e := range d.Entries {
			w += 64 + 2*int64(len(e.GetKey())+len(e.GetValue()))
		}
	}
	return w
}

// The reasons a request crossing a bound is refused, given alike by validate and, before the
// request is decoded whole, by UnmarshalRequest.
var domainTooLong = fmt.Sprintf("domain longer than %d bytes", limit.MaxValueBytes)

func tooManyDescriptors(n int) string {
	return fmt.Sprintf("%d descriptors: at most %d", n, limit.MaxDescriptors)
}

func tooManyEntries(i, n int) string {
	return fmt.Sprintf("descriptors[%d]: %d entries: at most %d", i, n, limit.MaxEntries)
}

func keyTooLong(i, j int) string {
	return fmt.Sprintf("descriptors[%d].entries[%d]: key longer than %d bytes", i, j, limit.MaxKeyBytes)
}

func valueTooLong(i, j int) string {
	return fmt.Sprintf("descriptors[%d].entries[%d]: value longer than %d bytes", i, j, limit.MaxValueBytes)
}

// overridePeriod is the period of an override: its unit times its multiplier (1 when unset).
func overridePeriod(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) time.Duration {
	m := int64(max(o.GetUnitMultiplier().GetValue(), 1))
	return time.Duration(limit.Unit(o.GetUnit()).Seconds()*m) * time.Second
}

// OverridePolicy is what a descriptor's limit override (RateLimitDescriptor.limit) may do.
type OverridePolicy struct {
	// Refuse answers a request carrying an override PERMISSION_DENIED.
	Refuse bool
	// Ignore decides a descriptor carrying an override by the rules, as if it carried none.
	Ignore bool
	// MaxPeriod, when > 0, refuses (INVALID_ARGUMENT) an override whose period, its unit times
	// its multiplier, is longer: an override's state lives as long as its period.
	MaxPeriod time.Duration
}

// check refuses a validated request whose overrides p does not allow.
func (p OverridePolicy) check(req *rlsv3.RateLimitRequest) error {
	if p.Ignore || (!p.Refuse && p.MaxPeriod <= 0) {
		return nil
	}
	for i, d := range req.Descriptors {
		o := d.GetLimit()
		switch {
		case o == nil:
		case p.Refuse:
			return status.Errorf(codes.PermissionDenied, "descriptors[%d].limit: limit overrides are refused here (--overrides=refuse)", i)
		case overridePeriod(o) > p.MaxPeriod:
			return status.Errorf(codes.InvalidArgument, "descriptors[%d].limit: a period of %v is longer than --override-max-period %v", i, overridePeriod(o), p.MaxPeriod)
		}
	}
	return nil
}

// validate checks a request's shape; the error says what is wrong.
func validate(req *rlsv3.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return errors.New("domain must not be empty")
	}
	if len(req.GetDomain()) > limit.MaxValueBytes {
		return errors.New(domainTooLong)
	}
	if !utf8.ValidString(req.GetDomain()) {
		return errors.New("domain is not valid UTF-8")
	}
	n := len(req.GetDescriptors())
	if n == 0 {
		return errors.New("descriptors must not be empty")
	}
	if n > limit.MaxDescriptors {
		return errors.New(tooManyDescriptors(n))
	}
	for i, d := range req.Descriptors {
		if d == nil {
			return fmt.Errorf("descriptors[%d] is null", i)
		}
		if len(d.Entries) > limit.MaxEntries {
			return errors.New(tooManyEntries(i, len(d.Entries)))
		}
		for j, e := range d.Entries {
			switch {
			case e == nil:
				return fmt.Errorf("descriptors[%d].entries[%d] is null", i, j)
			case e.GetKey() == "":
				return fmt.Errorf("descriptors[%d].entries[%d]: key must not be empty", i, j)
			case len(e.GetKey()) > limit.MaxKeyBytes:
				return errors.New(keyTooLong(i, j))
			case len(e.GetValue()) > limit.MaxValueBytes:
				return errors.New(valueTooLong(i, j))
			case !utf8.ValidString(e.GetKey()):
				return fmt.Errorf("descriptors[%d].entries[%d]: key is not valid UTF-8", i, j)
			case !utf8.ValidString(e.GetValue()):
				return fmt.Errorf("descriptors[%d].entries[%d]: value is not valid UTF-8", i, j)
			}
		}
		if o := d.GetLimit(); o != nil {
			u := o.GetUnit()
			if u == typev3.RateLimitUnit_UNKNOWN || limit.Unit(u).Seconds() == 0 || u > typev3.RateLimitUnit_YEAR {
				return fmt.Errorf("descriptors[%d].limit: unit %v: want SECOND, MINUTE, HOUR, DAY, MONTH or YEAR", i, u)
			}
			if m := o.GetUnitMultiplier(); m != nil && m.GetValue() == 0 {
				return fmt.Errorf("descriptors[%d].limit: unit_multiplier must be > 0", i)
			}
			if err := overrideLimit(o).Spec.Validate(); err != nil {
				return fmt.Errorf("descriptors[%d].limit: %v", i, err)
			}
		}
	}
	return nil
}
