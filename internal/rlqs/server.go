package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/descriptors"
)

// Defaults of Options.
const (
	DefaultTTL        = 3 * time.Second
	DefaultTick       = 250 * time.Millisecond
	DefaultMaxBuckets = 10000
)

// Options configures a Server. Only Rules is required.
type Options struct {
	// Rules returns the rule set in force, read at every decision so that reloads apply.
	Rules func() *descriptors.RuleSet
	// Store keeps the shares (default: a Memory store, this replica only).
	Store Store
	// TTL is every assignment's time to live (default DefaultTTL): how long a proxy enforces a
	// share without hearing from rls, and so how long a vanished proxy's share stays held. It
	// should be a few of the proxies' reporting intervals.
	TTL time.Duration
	// Tick is how often each stream's shares are decided again without a report (default
	// DefaultTick), so that demand shifts reach every proxy and shares above their target are
	// given back. A share released wakes the proxies waiting at once (see wake).
	Tick time.Duration
	// MaxBuckets bounds the buckets of one stream (default DefaultMaxBuckets).
	MaxBuckets int
	// Registerer receives the metrics (none when nil).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Server serves StreamRateLimitQuotas. It is safe for concurrent use.
type Server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	rules      func() *descriptors.RuleSet
	store      Store
	ttl        time.Duration
	tick       time.Duration
	maxBuckets int
	log        *slog.Logger
	now        func() time.Time
	replica    string
	seq        atomic.Uint64

	mu       sync.Mutex
	streams  map[*stream]struct{}
	byBucket map[string]map[*stream]struct{} // the streams that reported each bucket

	stopListen context.CancelFunc // ends the store's Listen, when it has one
	listening  chan struct{}      // closed when Listen returned

	requests *prometheus.CounterVec // domain, rule, outcome
	rejected *prometheus.CounterVec // reason
	opened   prometheus.Counter
	errs     prometheus.Counter
}

var _ rlqspb.RateLimitQuotaServiceServer = (*Server)(nil)

// New returns a Server as opts says.
func New(opts Options) (*Server, error) {
	if opts.Rules == nil {
		return nil, errors.New("rlqs: no rules")
	}
	if opts.TTL < 0 || opts.Tick < 0 || opts.MaxBuckets < 0 {
		return nil, errors.New("rlqs: TTL, Tick and MaxBuckets must not be negative")
	}
	if opts.TTL > 0 && opts.TTL < time.Millisecond {
		return nil, errors.New("rlqs: TTL must be at least 1ms")
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &Server{
		rules: opts.Rules, store: opts.Store, ttl: opts.TTL, tick: opts.Tick, maxBuckets: opts.MaxBuckets,
		log: opts.Logger, now: opts.Now, replica: hex.EncodeToString(id[:]), streams: map[*stream]struct{}{},
		byBucket: map[string]map[*stream]struct{}{},
	}
	if s.store == nil {
		s.store = NewMemory()
	}
	if s.ttl == 0 {
		s.ttl = DefaultTTL
	}
	if s.tick == 0 {
		s.tick = DefaultTick
	}
	if s.maxBuckets == 0 {
		s.maxBuckets = DefaultMaxBuckets
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_rlqs_requests_total",
		Help: "Requests proxies reported per bucket rule, by outcome at the proxy (allowed: admitted, denied).",
	}, []string{"domain", "rule", "outcome"})
	s.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_rlqs_reports_rejected_total",
		Help: "RLQS streams ended for a malformed report, by reason.",
	}, []string{"reason"})
	s.opened = prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_streams_opened_total", Help: "RLQS streams opened."})
	s.errs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rls_rlqs_store_errors_total",
		Help: "Share decisions that failed in the store (Redis); the proxy keeps its assignment until its TTL.",
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.requests, s.rejected, s.opened, s.errs, collector{s}} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("rlqs: registering metrics: %w", err)
			}
		}
	}
	if a, ok := s.store.(Announcer); ok {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopListen, s.listening = cancel, make(chan struct{})
		subscribed := make(chan struct{})
		go func() {
			defer close(s.listening)
			a.Listen(ctx, func() { close(subscribed) }, func(from, bucket string, waiting []string) {
				if from != s.replica {
					s.wake(bucket, waiting)
				}
			})
		}()
		<-subscribed // bounded by Listen: serve once the other replicas' word can reach this one
	}
	return s, nil
}

// Close stops listening to other replicas and closes the store.
func (s *Server) Close() error {
	if s.stopListen != nil {
		s.stopListen()
		<-s.listening
	}
	return s.store.Close()
}

// stream is one proxy's stream: the proxy, as far as rls can tell.
type stream struct {
	id      string
	started time.Time

	mu      sync.Mutex // guards what the metrics and debug pages read; the handler writes
	domain  string
	buckets map[string]*streamBucket
	failing bool // the store failed last time: logged once until it recovers

	// wake (capacity 1) tells the handler that another proxy released room in the buckets of
	// pending (guarded by mu), to be decided again now rather than at the next tick.
	wake    chan struct{}
	pending map[string]bool
}

// streamBucket is one bucket of a stream.
type streamBucket struct {
	id         bucketID
	proto      *rlqspb.BucketId
	rules      *descriptors.RuleSet // the set pol was matched in
	pol        policy
	demand     float64 // requests per second, last report
	lastReport time.Time
	sent       bool // an assignment was sent
	share      Share
	allowAll   bool // the last assignment sent was ALLOW_ALL
	sentAt     time.Time
}

// StreamRateLimitQuotas implements the RLQS stream: every report is answered with an assignment
// for each bucket it names, and every Tick the stream's shares are decided again and those that
// changed are sent.
// A panic in it is the gRPC server's to recover (cmd/rls installs the recovery interceptor for
// streams).
func (s *Server) StreamRateLimitQuotas(ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	ctx := ss.Context()
	st := &stream{id: s.replica + "-" + strconv.FormatUint(s.seq.Add(1), 10), started: s.now(), buckets: map[string]*streamBucket{},
		wake: make(chan struct{}, 1), pending: map[string]bool{}}
	s.opened.Inc()
	s.mu.Lock()
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	defer s.leave(st)

	reports := make(chan *rlqspb.RateLimitQuotaUsageReports)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			m, err := ss.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- m:
			case <-done:
				return
			}
		}
	}()
	tick := time.NewTicker(s.tick)
	defer tick.Stop()
	for {
		select {
		case m := <-reports:
			if err := s.report(ctx, ss, st, m); err != nil {
				return err
			}
		case <-tick.C:
			if err := s.refresh(ctx, ss, st, nil); err != nil {
				return err
			}
		case <-st.wake:
			st.mu.Lock()
			keys := make([]string, 0, len(st.pending))
			for k := range st.pending {
				keys = append(keys, k)
			}
			clear(st.pending)
			st.mu.Unlock()
			if err := s.refresh(ctx, ss, st, keys); err != nil {
				return err
			}
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// leave forgets a stream that ended: its demand stops counting, what it holds stays held until
// it expires (the proxy may go on enforcing it).
func (s *Server) leave(st *stream) {
	s.mu.Lock()
	delete(s.streams, st)
	for key := range st.buckets { // only this goroutine writes st.buckets
		if set := s.byBucket[key]; set != nil {
			delete(set, st)
			if len(set) == 0 {
				delete(s.byBucket, key)
			}
		}
	}
	s.mu.Unlock()
	// Nothing else decides for this stream any more (only its own goroutine, this one, did), so
	// the store is called without st.mu, which the metrics and /debug/rlqs need meanwhile.
	st.mu.Lock()
	keys := make([]string, 0, len(st.buckets))
	for key, b := range st.buckets {
		if !b.pol.allowAll {
			keys = append(keys, key)
		}
	}
	st.mu.Unlock()
	// A stream may hold thousands of buckets, each a round trip or two to a shared store: up to
	// leaveParallel at once, within leaveTimeout in all; what is not released by then expires
	// with its TTL. One line says how many failed, not one per bucket.
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	now := s.now().UnixMilli()
	var (
		wg       sync.WaitGroup
		failed   atomic.Int64
		firstErr atomic.Pointer[error]
	)
	sem := make(chan struct{}, leaveParallel)
	for _, key := range keys {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := s.store.Leave(ctx, key, st.id, now); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		s.log.Warn("rlqs: could not release shares of an ended stream; they expire with their TTL",
			"proxy", st.id, "failed", n, "buckets", len(keys), "err", *firstErr.Load())
	}
	s.log.Debug("rlqs stream ended", "proxy", st.id, "domain", st.domain, "buckets", len(keys))
}

// How an ended stream's buckets are released: so many at once, within so long in all.
const (
	leaveParallel = 32
	leaveTimeout  = 2 * time.Second
)

// invalid counts and returns an InvalidArgument ending the stream.
func (s *Server) invalid(st *stream, reason, format string, args ...any) error {
	s.rejected.WithLabelValues(reason).Inc()
	msg := fmt.Sprintf(format, args...)
	s.log.Warn("rlqs: malformed report; ending the stream", "proxy", st.id, "reason", msg)
	return status.Error(codes.InvalidArgument, msg)
}

// report handles one usage report and answers it.
func (s *Server) report(ctx context.Context, ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *stream, m *rlqspb.RateLimitQuotaUsageReports) error {
	now := s.now()
	st.mu.Lock()
	domain := st.domain
	st.mu.Unlock()
	switch {
	case domain == "" && m.GetDomain() == "":
		return s.invalid(st, "no_domain", "the first report must name the domain")
	case domain != "" && m.GetDomain() != "" && m.GetDomain() != domain:
		return s.invalid(st, "domain_changed", "domain %q differs from the stream's %q: open a new stream for another domain", m.GetDomain(), domain)
	case len(m.GetDomain()) > maxDomainLength:
		return s.invalid(st, "bad_domain", "domain longer than %d bytes", maxDomainLength)
	case domain == "" && !utf8.ValidString(m.GetDomain()):
		return s.invalid(st, "bad_domain", "domain is not valid UTF-8")
	}
	if domain == "" {
		domain = m.GetDomain()
		st.mu.Lock()
		st.domain = domain
		st.mu.Unlock()
	}
	type upd struct {
		key    string
		id     bucketID
		proto  *rlqspb.BucketId
		demand float64
		u      *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
	}
	upds := make([]upd, 0, len(m.GetBucketQuotaUsages()))
	for i, u := range m.GetBucketQuotaUsages() {
		id, err := parseBucketID(u.GetBucketId().GetBucket())
		if err != nil {
			return s.invalid(st, "bad_bucket_id", "bucket_quota_usages[%d]: %v", i, err)
		}
		var elapsed time.Duration
		if te := u.GetTimeElapsed(); te != nil {
			if err := te.CheckValid(); err != nil || te.AsDuration() < 0 {
				return s.invalid(st, "bad_time_elapsed", "bucket_quota_usages[%d]: time_elapsed %v: want a valid duration ≥ 0", i, te)
			}
			elapsed = te.AsDuration()
		}
		key := id.key(domain)
		if elapsed <= 0 {
			since := st.started
			if b := st.buckets[key]; b != nil {
				since = b.lastReport
			}
			elapsed = now.Sub(since)
		}
		elapsed = max(elapsed, time.Millisecond)
		n := float64(u.GetNumRequestsAllowed()) + float64(u.GetNumRequestsDenied())
		upds = append(upds, upd{key: key, id: id, proto: u.GetBucketId(), demand: n / elapsed.Seconds(), u: u})
	}
	rs := s.rules()
	var added []string
	st.mu.Lock()
	for _, up := range upds {
		b := st.buckets[up.key]
		if b == nil {
			if len(st.buckets) >= s.maxBuckets {
				st.mu.Unlock()
				s.subscribe(st, added)
				s.rejected.WithLabelValues("too_many_buckets").Inc()
				return status.Errorf(codes.ResourceExhausted, "more than %d buckets on one stream", s.maxBuckets)
			}
			b = &streamBucket{id: up.id, proto: up.proto}
			st.buckets[up.key] = b
			added = append(added, up.key)
		}
		b.demand, b.lastReport = up.demand, now
		s.rematch(b, rs, domain)
		dl, rule := domainLabel(rs, domain), ruleName(b.pol.rule)
		s.requests.WithLabelValues(dl, rule, "allowed").Add(float64(up.u.GetNumRequestsAllowed()))
		s.requests.WithLabelValues(dl, rule, "denied").Add(float64(up.u.GetNumRequestsDenied()))
	}
	st.mu.Unlock()
	// Before deciding: a share released while this one is decided must wake it.
	s.subscribe(st, added)
	keys := make([]string, 0, len(upds))
	seen := map[string]bool{}
	for _, up := range upds {
		if !seen[up.key] {
			seen[up.key] = true
			keys = append(keys, up.key)
		}
	}
	return s.decideAll(ctx, ss, st, keys, true, now)
}

// refresh decides the shares of keys (nil: all the stream's buckets) again and sends those that
// changed.
func (s *Server) refresh(ctx context.Context, ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *stream, keys []string) error {
	now := s.now()
	rs := s.rules()
	st.mu.Lock()
	if keys == nil {
		keys = make([]string, 0, len(st.buckets))
		for k := range st.buckets {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		s.rematch(st.buckets[k], rs, st.domain)
	}
	st.mu.Unlock()
	return s.decideAll(ctx, ss, st, keys, false, now)
}

// decideAll decides the shares of keys, sends those to send in one response, and then tells the
// other proxies of the buckets where this one released room.
func (s *Server) decideAll(ctx context.Context, ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *stream, keys []string, force bool, now time.Time) error {
	var actions []*rlqspb.RateLimitQuotaResponse_BucketAction
	type release struct {
		key     string
		waiting []string
	}
	var released []release
	for _, k := range keys {
		a, waiting := s.decide(ctx, st, k, force, now)
		if a != nil {
			actions = append(actions, a)
		}
		if len(waiting) > 0 {
			released = append(released, release{k, waiting})
		}
	}
	if len(actions) > 0 {
		if err := ss.Send(&rlqspb.RateLimitQuotaResponse{BucketAction: actions}); err != nil {
			return err
		}
	}
	for _, r := range released {
		if s.wake(r.key, r.waiting) == len(r.waiting) {
			continue // all on this replica
		}
		if a, ok := s.store.(Announcer); ok {
			if err := a.Announce(ctx, s.replica, r.key, r.waiting); err != nil {
				s.log.Debug("rlqs: could not tell the other replicas of a share released; their proxies get it at their next tick", "err", err)
			}
		}
	}
	return nil
}

// subscribe records that st reports the buckets keys, for wake.
func (s *Server) subscribe(st *stream, keys []string) {
	if len(keys) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, open := s.streams[st]; !open {
		return
	}
	for _, k := range keys {
		set := s.byBucket[k]
		if set == nil {
			set = map[*stream]struct{}{}
			s.byBucket[k] = set
		}
		set[st] = struct{}{}
	}
}

// wake has the streams of this replica among waiting (proxy ids, sorted) decide their shares of bucket
// again now: a proxy released room that they wait for. Without it they would take the room at
// their next tick. It returns how many of them are on this replica.
func (s *Server) wake(bucket string, waiting []string) int {
	s.mu.Lock()
	var sts []*stream
	for st := range s.byBucket[bucket] {
		if _, ok := slices.BinarySearch(waiting, st.id); ok {
			sts = append(sts, st)
		}
	}
	s.mu.Unlock()
	for _, st := range sts {
		st.mu.Lock()
		st.pending[bucket] = true
		st.mu.Unlock()
		select {
		case st.wake <- struct{}{}:
		default: // already woken: it takes pending whole
		}
	}
	return len(sts)
}

// rematch matches b's rule again when the rule set changed. st.mu must be held.
func (s *Server) rematch(b *streamBucket, rs *descriptors.RuleSet, domain string) {
	if b.rules == rs && b.rules != nil {
		return
	}
	r, _ := match(rs, domain, b.id)
	b.rules, b.pol = rs, policyOf(r)
}

// decide returns the action for one bucket of st, or nil when there is nothing to send, and,
// when the proxy's share shrank, the proxies waiting for the room it released.
// force: the bucket was just reported and gets an answer.
func (s *Server) decide(ctx context.Context, st *stream, key string, force bool, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, []string) {
	st.mu.Lock()
	b := st.buckets[key] // a stream's buckets are never removed
	pol, demand, reported, wasAllowAll, sent := b.pol, b.demand, b.lastReport, b.allowAll, b.sent
	st.mu.Unlock()
	ttlMs := s.ttl.Milliseconds()
	if pol.allowAll {
		if !force && sent && wasAllowAll {
			return nil, nil
		}
		if sent && !wasAllowAll {
			// It had a share under a rule that no longer limits it.
			_ = s.store.Leave(ctx, key, st.id, now.UnixMilli())
		}
		st.mu.Lock()
		b.sent, b.allowAll, b.share, b.sentAt = true, true, Share{}, now
		st.mu.Unlock()
		return s.action(b.proto, blanket(typev3.RateLimitStrategy_ALLOW_ALL)), nil
	}
	seen := Seen{Demand: demand, Until: reported.UnixMilli() + ttlMs, Report: force}
	d, err := s.store.Assign(ctx, key, st.id, pol.lim, seen, now.UnixMilli(), ttlMs)
	share := d.Share
	st.mu.Lock()
	defer st.mu.Unlock()
	if err != nil {
		s.errs.Inc()
		if !st.failing {
			s.log.Warn("rlqs: deciding shares failed; proxies keep their assignments until they expire", "err", err)
		}
		st.failing = true
		return nil, nil
	}
	if st.failing {
		s.log.Info("rlqs: deciding shares again")
		st.failing = false
	}
	if !d.Send && !(sent && wasAllowAll) {
		return nil, nil
	}
	b.sent, b.allowAll, b.share, b.sentAt = true, false, share, now
	return s.action(b.proto, strategyFor(share, pol.lim)), d.Waiting
}

func (s *Server) action(id *rlqspb.BucketId, strat *typev3.RateLimitStrategy) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(s.ttl),
				RateLimitStrategy:    strat,
			},
		},
	}
}

func blanket(r typev3.RateLimitStrategy_BlanketRule) *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: r}}
}

// strategyFor is a share as Envoy enforces it: a token bucket filling share.Rate tokens per the
// limit's period, holding up to share.Burst (at least 1, or it would admit nothing), or DENY_ALL
// for a zero share.
func strategyFor(share Share, lim Limit) *typev3.RateLimitStrategy {
	if share.Rate <= 0 {
		return blanket(typev3.RateLimitStrategy_DENY_ALL)
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(max(share.Burst, 1), math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(share.Rate, math.MaxUint32))),
		FillInterval:  durationpb.New(ttlDuration(lim.PeriodMs)),
	}}}
}
