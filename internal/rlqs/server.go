package rlqs

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/logthrottle"
)

// DefaultLogEvery is how often, at most, each kind of warning a client can cause is logged.
const DefaultLogEvery = 10 * time.Second

// Defaults of Options.
const (
	DefaultTTL        = 3 * time.Second
	DefaultTick       = 250 * time.Millisecond
	DefaultMaxBuckets = 10000
	// DefaultMaxStreams bounds the RLQS streams open at once on a replica (Envoy's filter keeps
	// one per filter configuration).
	DefaultMaxStreams = 512
	// DefaultMaxTotalBuckets bounds the buckets of all streams together (a bucket reported by
	// two streams counts twice).
	DefaultMaxTotalBuckets = 20000
	// DefaultMaxBucketBytes bounds the bytes of the distinct bucket ids rls keeps for its
	// streams (each kept once however many streams report it).
	DefaultMaxBucketBytes = 8 << 20
	// DefaultMaxProxiesPerBucket bounds the proxies (streams, on every replica sharing the
	// store) that one bucket's limit is divided among.
	DefaultMaxProxiesPerBucket = 256
	// DefaultAssignTimeout bounds each decision in the store (Redis).
	DefaultAssignTimeout = time.Second
	// DefaultDebugBuckets is how many assignments /debug/rlqs lists unless asked for fewer.
	DefaultDebugBuckets = 1000
	// DefaultReportBudget bounds the bytes of the usage reports of all streams being decoded and
	// taken in at once (see reportBudget): twice the largest report gRPC accepts by default.
	DefaultReportBudget = 2 << 20
	// DefaultReportWait is how long a report waits for room in the budget before it is refused.
	DefaultReportWait = time.Second
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
	// MaxStreams bounds the streams open at once (default DefaultMaxStreams); one more is
	// refused with RESOURCE_EXHAUSTED.
	MaxStreams int
	// MaxTotalBuckets bounds the buckets of all streams together (default
	// DefaultMaxTotalBuckets); a report that would add one more ends its stream with
	// RESOURCE_EXHAUSTED.
	MaxTotalBuckets int
	// MaxBucketBytes bounds the bytes of the distinct bucket ids kept (default
	// DefaultMaxBucketBytes); a report that would pass it ends its stream with
	// RESOURCE_EXHAUSTED.
	MaxBucketBytes int64
	// MaxProxiesPerBucket bounds the proxies one bucket counts (default
	// DefaultMaxProxiesPerBucket); a stream that would be one more ends with RESOURCE_EXHAUSTED.
	MaxProxiesPerBucket int
	// Domains, when not empty, are the only domains served; a stream naming another ends with
	// PERMISSION_DENIED.
	Domains []string
	// AssignTimeout bounds each decision in the store (default DefaultAssignTimeout).
	AssignTimeout time.Duration
	// ReportBudget bounds the bytes of the usage reports of all streams being decoded and taken
	// in at once (default DefaultReportBudget); it should be at least the largest report gRPC
	// accepts, or such a report is always refused.
	ReportBudget int64
	// ReportWait is how long a report waits for room in ReportBudget before its stream ends with
	// RESOURCE_EXHAUSTED (default DefaultReportWait).
	ReportWait time.Duration
	// LogEvery is how often, at most, each kind of client-caused warning is logged (default
	// DefaultLogEvery); the line says how many were not.
	LogEvery time.Duration
	// Registerer receives the metrics (none when nil).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Server serves StreamRateLimitQuotas. It is safe for concurrent use.
type Server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	rules         func() *descriptors.RuleSet
	store         Store
	ttl           time.Duration
	tick          time.Duration
	maxBuckets    int
	maxStreams    int
	maxTotal      int
	maxBytes      int64
	maxProxies    int
	domains       map[string]bool // nil: all
	assignTimeout time.Duration
	budget        *reportBudget
	reportWait    time.Duration
	recheck       time.Duration // how often a tick decides a settled bucket again
	log           *slog.Logger
	warn          *logthrottle.Throttle
	now           func() time.Time
	replica       string
	seq           atomic.Uint64

	mu       sync.Mutex
	streams  map[*stream]struct{}
	byBucket map[string]*sharedBucket // every bucket of the open streams, by key
	subs     int                      // buckets of all streams (stream × bucket)
	idBytes  int64                    // bytes of the keys of byBucket

	aggMu sync.Mutex
	aggs  map[aggKey]*agg // the per-rule gauges, kept up to date as buckets change

	stopListen context.CancelFunc // ends the store's Listen, when it has one
	listening  chan struct{}      // closed when Listen returned

	requests  *prometheus.CounterVec // domain, rule, outcome
	rejected  *prometheus.CounterVec // reason
	refused   *prometheus.CounterVec // reason
	opened    prometheus.Counter
	decisions prometheus.Counter
	errs      prometheus.Counter
}

var _ rlqspb.RateLimitQuotaServiceServer = (*Server)(nil)

// New returns a Server as opts says.
func New(opts Options) (*Server, error) {
	if opts.Rules == nil {
		return nil, errors.New("rlqs: no rules")
	}
	if opts.TTL < 0 || opts.Tick < 0 || opts.MaxBuckets < 0 || opts.MaxStreams < 0 || opts.MaxTotalBuckets < 0 ||
		opts.MaxBucketBytes < 0 || opts.MaxProxiesPerBucket < 0 || opts.AssignTimeout < 0 || opts.LogEvery < 0 ||
		opts.ReportBudget < 0 || opts.ReportWait < 0 {
		return nil, errors.New("rlqs: durations and bounds must not be negative")
	}
	if opts.TTL > 0 && opts.TTL < time.Millisecond {
		return nil, errors.New("rlqs: TTL must be at least 1ms")
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	s := &Server{
		rules: opts.Rules, store: opts.Store, ttl: opts.TTL, tick: opts.Tick, maxBuckets: opts.MaxBuckets,
		maxStreams: cmp.Or(opts.MaxStreams, DefaultMaxStreams), maxTotal: cmp.Or(opts.MaxTotalBuckets, DefaultMaxTotalBuckets),
		maxBytes: cmp.Or(opts.MaxBucketBytes, DefaultMaxBucketBytes), maxProxies: cmp.Or(opts.MaxProxiesPerBucket, DefaultMaxProxiesPerBucket),
		assignTimeout: cmp.Or(opts.AssignTimeout, DefaultAssignTimeout),
		budget:        newReportBudget(cmp.Or(opts.ReportBudget, DefaultReportBudget)),
		reportWait:    cmp.Or(opts.ReportWait, DefaultReportWait),
		log:           opts.Logger, now: opts.Now, replica: hex.EncodeToString(id[:]), streams: map[*stream]struct{}{},
		byBucket: map[string]*sharedBucket{}, aggs: map[aggKey]*agg{},
	}
	if len(opts.Domains) > 0 {
		s.domains = map[string]bool{}
		for _, d := range opts.Domains {
			s.domains[d] = true
		}
	}
	if s.store == nil {
		m := NewMemory()
		// What ended streams leave behind is bounded too (see Memory.maxKept).
		m.maxKept = 2 * cmp.Or(opts.MaxTotalBuckets, DefaultMaxTotalBuckets)
		s.store = m
	}
	if s.ttl == 0 {
		s.ttl = DefaultTTL
	}
	if s.tick == 0 {
		s.tick = DefaultTick
	}
	// A settled share changes only at a report or when another proxy's decision wakes it; a
	// tick decides it again now and then all the same, should the store have lost its state.
	s.recheck = max(s.tick, min(s.ttl/4, time.Second))
	if s.maxBuckets == 0 {
		s.maxBuckets = DefaultMaxBuckets
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.warn = logthrottle.New(s.log, cmp.Or(opts.LogEvery, DefaultLogEvery))
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_rlqs_requests_total",
		Help: "Requests proxies reported per bucket rule, by outcome at the proxy (allowed: admitted, denied).",
	}, []string{"domain", "rule", "outcome"})
	s.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_rlqs_reports_rejected_total",
		Help: "RLQS streams ended for a malformed report, by reason.",
	}, []string{"reason"})
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rls_rlqs_refused_total",
		Help: "RLQS streams refused or ended at a bound (RESOURCE_EXHAUSTED) or for a domain not served (PERMISSION_DENIED), by reason.",
	}, []string{"reason"})
	s.opened = prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_streams_opened_total", Help: "RLQS streams opened."})
	s.decisions = prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_rlqs_decisions_total",
		Help: "Shares decided in the store (at reports, and at ticks for the buckets whose shares may move)."})
	s.errs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rls_rlqs_store_errors_total",
		Help: "Share decisions that failed in the store (Redis); the proxy keeps its assignment until its TTL.",
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{s.requests, s.rejected, s.refused, s.opened, s.decisions, s.errs, collector{s}} {
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
	s.warn.Close() // what was suppressed since the last line
	return s.store.Close()
}

// stream is one proxy's stream: the proxy, as far as rls can tell.
type stream struct {
	id      string // the proxy's id in the store: "identity/stream" with a client certificate
	started time.Time
	tallies map[aggKey]int // guarded by Server.aggMu: this stream's buckets per rule

	mu      sync.Mutex // guards what the metrics and debug pages read; the handler writes
	domain  string
	buckets map[string]*streamBucket
	failing bool // the store failed last time: logged once until it recovers

	// wake (capacity 1) tells the handler that another proxy released room in the buckets of
	// pending (guarded by mu), to be decided again now rather than at the next tick.
	wake    chan struct{}
	pending map[string]bool
}

// sharedBucket is a bucket of the open streams: the one copy of its id (its key, which the
// streams' maps, the stores and the answers all use) and the streams that report it.
type sharedBucket struct {
	key     string
	streams []*stream
}

// streamBucket is one bucket of a stream.
type streamBucket struct {
	key        string               // the sharedBucket's
	tallied    bool                 // counted in Server.aggs (see tally)
	rules      *descriptors.RuleSet // the set pol was matched in
	pol        policy
	demand     float64 // requests per second, as estimate measures it
	window     demandWindow
	lastReport time.Time
	sent       bool      // an assignment was sent
	settled    bool      // the last decision left the share at its target (see Decision.Settled)
	decided    time.Time // of the last decision
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
	seq := s.replica + "-" + strconv.FormatUint(s.seq.Add(1), 10)
	st := &stream{id: seq, started: s.now(), buckets: map[string]*streamBucket{},
		wake: make(chan struct{}, 1), pending: map[string]bool{}}
	if who := peerIdentity(ctx); who != "" {
		// One identity is one proxy of each bucket, however many streams it opens (targets).
		d := sha256.Sum256([]byte(who))
		st.id = "c" + hex.EncodeToString(d[:8]) + "/" + seq
	}
	s.mu.Lock()
	if len(s.streams) >= s.maxStreams {
		s.mu.Unlock()
		return s.refuse(st, "too_many_streams", codes.ResourceExhausted,
			"more than %d RLQS streams open on this replica (--rlqs-max-streams)", s.maxStreams)
	}
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	s.opened.Inc()
	defer s.leave(st)

	reports := make(chan budgeted)
	recvErr := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			m, err := s.recv(ctx, ss, st)
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reports <- m:
			case <-done:
				m.release()
				return
			}
		}
	}()
	tick := time.NewTicker(s.tick)
	defer tick.Stop()
	for {
		select {
		case m := <-reports:
			release := m.release // m itself is garbage once report has taken it in
			err := s.report(ctx, ss, st, m)
			release()
			if err != nil {
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

// peerIdentity is the identity of the verified client certificate of a stream's connection (mutual TLS):
// its first URI name (a SPIFFE id), else its first DNS name, else its subject; "" without one.
func peerIdentity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return "" // no certificate, or one nobody verified: any name could be claimed
	}
	c := info.State.PeerCertificates[0]
	switch {
	case len(c.URIs) > 0:
		return "uri:" + c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return "dns:" + c.DNSNames[0]
	}
	return "subject:" + c.Subject.String()
}

// leave forgets a stream that ended: its buckets and their ids are released at once, its demand
// stops counting in the store, and what it holds stays held there until it expires (the proxy
// may go on enforcing it).
func (s *Server) leave(st *stream) {
	// Only this goroutine writes st.buckets; st.mu keeps the metrics and debug pages out.
	st.mu.Lock()
	keys := make([]string, 0, len(st.buckets))
	for key, b := range st.buckets {
		s.untally(st, b)
		if !b.pol.allowAll {
			keys = append(keys, key)
		}
	}
	all := st.buckets
	st.buckets = map[string]*streamBucket{}
	st.mu.Unlock()
	s.mu.Lock()
	delete(s.streams, st)
	for key := range all {
		s.unshareLocked(st, key)
	}
	s.mu.Unlock()
	// Nothing else decides for this stream any more (only its own goroutine, this one, did), so
	// the store is called without st.mu, which the metrics and /debug/rlqs need meanwhile.
	// A stream may hold thousands of buckets, each a round trip to a shared store: up to
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
		s.warn.Warn("leave_failed", "rlqs: could not release shares of an ended stream; they expire with their TTL",
			"proxy", st.id, "failed", n, "buckets", len(keys), "err", *firstErr.Load())
	}
	s.log.Debug("rlqs stream ended", "proxy", st.id, "domain", st.domain, "buckets", len(keys))
}

// unshareLocked removes st from the streams of bucket key, forgetting the bucket after its last.
// s.mu must be held.
func (s *Server) unshareLocked(st *stream, key string) {
	sb := s.byBucket[key]
	if sb == nil {
		return
	}
	s.subs--
	if i := slices.Index(sb.streams, st); i >= 0 {
		last := len(sb.streams) - 1
		sb.streams[i] = sb.streams[last]
		sb.streams[last] = nil
		sb.streams = sb.streams[:last]
	}
	if len(sb.streams) == 0 {
		delete(s.byBucket, key)
		s.idBytes -= int64(len(key))
	}
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
	s.warn.Warn(reason, "rlqs: malformed report; ending the stream", "proxy", st.id, "reason", msg)
	return status.Error(codes.InvalidArgument, msg)
}

// refuse counts and returns the error (RESOURCE_EXHAUSTED, PERMISSION_DENIED) refusing or ending
// a stream at a bound.
func (s *Server) refuse(st *stream, reason string, code codes.Code, format string, args ...any) error {
	s.refused.WithLabelValues(reason).Inc()
	msg := fmt.Sprintf(format, args...)
	s.warn.Warn(reason, "rlqs: stream refused", "proxy", st.id, "reason", msg)
	return status.Error(code, msg)
}

// report handles one usage report and answers it.
// Its bytes are given back to the budget (m.release) once it is taken in, before the shares
// are decided: what a report costs decoded is garbage from then on.
func (s *Server) report(ctx context.Context, ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *stream, m budgeted) error {
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
	case domain == "" && s.domains != nil && !s.domains[m.GetDomain()]:
		return s.refuse(st, "domain_not_served", codes.PermissionDenied, "domain %q is not served over RLQS here (--rlqs-domains)", m.GetDomain())
	}
	if domain == "" {
		domain = m.GetDomain()
		st.mu.Lock()
		st.domain = domain
		st.mu.Unlock()
	}
	type upd struct {
		key        string
		n, elapsed float64 // requests reported, over so many seconds
		u          *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
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
		upds = append(upds, upd{key: key, n: n, elapsed: elapsed.Seconds(), u: u})
	}
	// The buckets new to the stream, admitted within the bounds; the first that is not ends the
	// stream (those admitted before it are released with the stream).
	var refusal error
	added := map[string]*streamBucket{}
	s.mu.Lock()
	for i := range upds {
		up := &upds[i]
		if b := st.buckets[up.key]; b != nil { // only this goroutine writes st.buckets
			up.key = b.key
			continue
		}
		if b := added[up.key]; b != nil {
			up.key = b.key
			continue
		}
		if err := s.admitLocked(st, len(st.buckets)+len(added)); err != nil {
			refusal = err
			break
		}
		sb := s.byBucket[up.key]
		if sb == nil {
			if s.idBytes+int64(len(up.key)) > s.maxBytes {
				refusal = s.refuse(st, "bucket_id_bytes", codes.ResourceExhausted,
					"the bucket ids of this replica's RLQS streams would pass %d bytes (--rlqs-max-bucket-bytes)", s.maxBytes)
				break
			}
			sb = &sharedBucket{key: up.key}
			s.byBucket[up.key] = sb
			s.idBytes += int64(len(up.key))
		}
		sb.streams = append(sb.streams, st)
		s.subs++
		up.key = sb.key // the one copy
		added[sb.key] = &streamBucket{key: sb.key}
	}
	s.mu.Unlock()
	rs := s.rules()
	st.mu.Lock()
	for k, b := range added {
		st.buckets[k] = b
	}
	if refusal != nil {
		st.mu.Unlock()
		return refusal
	}
	for _, up := range upds {
		b := st.buckets[up.key]
		s.untally(st, b)
		b.demand, b.lastReport = b.window.estimate(up.n, up.elapsed), now
		s.rematch(b, rs, domain)
		s.tally(st, b)
		dl, rule := domainLabel(rs, domain), ruleName(b.pol.rule)
		s.requests.WithLabelValues(dl, rule, "allowed").Add(float64(up.u.GetNumRequestsAllowed()))
		s.requests.WithLabelValues(dl, rule, "denied").Add(float64(up.u.GetNumRequestsDenied()))
	}
	st.mu.Unlock()
	keys := make([]string, 0, len(upds))
	seen := make(map[string]bool, len(upds))
	for _, up := range upds {
		if !seen[up.key] {
			seen[up.key] = true
			keys = append(keys, up.key)
		}
	}
	upds, seen = nil, nil // the report's
	m.release()
	return s.decideAll(ctx, ss, st, keys, true, now)
}

// demandWindow is what a stream's reports of a bucket say of its demand: the requests and
// seconds of the recent reports that agree with one another. changed: the window holds only
// the report that began a change of demand, not yet confirmed by the next.
type demandWindow struct {
	n, secs float64
	changed bool
}

// maxWindow is the most seconds of reports a demand estimate averages.
const maxWindow = 5.0

// estimate folds a report of n requests over secs seconds into w and returns the demand, in
// requests per second. A report within the counting noise of what w expects (3·√expected + 3
// requests) is averaged with the last maxWindow seconds of reports, so that a small proxy
// whose reports count 1 or 2 requests is seen wanting its steady rate, not half or twice it
// by turns; one beyond it is a change of demand and is taken whole at once, as shares must
// follow a shift within a report or two. The report that shows a change mostly straddles it
// (part old demand, part new), so the one after it is averaged with it only if it is within
// one standard deviation (√expected, at least 1 request); else it too is taken whole: a
// proxy whose demand fell from 270/s to 20/s is seen at 20/s by its second report, where
// averaging the straddling report in decayed over several.
func (w *demandWindow) estimate(n, secs float64) float64 {
	if w.secs > 0 {
		expected := w.n / w.secs * secs
		dev := math.Abs(n - expected)
		if dev <= 3*math.Sqrt(expected)+3 && (!w.changed || dev <= max(math.Sqrt(expected), 1)) {
			w.n, w.secs, w.changed = w.n+n, w.secs+secs, false
			if w.secs > maxWindow {
				w.n, w.secs = w.n*maxWindow/w.secs, maxWindow
			}
			return w.n / w.secs
		}
	}
	w.n, w.secs, w.changed = n, secs, w.secs > 0
	return n / secs
}

// admitLocked checks that st, holding n buckets, may hold one more. s.mu must be held.
func (s *Server) admitLocked(st *stream, n int) error {
	switch {
	case n >= s.maxBuckets:
		return s.refuse(st, "too_many_buckets", codes.ResourceExhausted, "more than %d buckets on one stream", s.maxBuckets)
	case s.subs >= s.maxTotal:
		return s.refuse(st, "too_many_buckets_total", codes.ResourceExhausted,
			"more than %d buckets on this replica's RLQS streams together (--rlqs-max-total-buckets)", s.maxTotal)
	}
	return nil
}

// refresh decides the shares of keys (nil: all the stream's buckets) again and sends those that
// changed.
func (s *Server) refresh(ctx context.Context, ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *stream, keys []string) error {
	now := s.now()
	rs := s.rules()
	st.mu.Lock()
	if keys == nil {
		// A tick: the buckets whose shares may move, and the settled ones once a recheck.
		keys = make([]string, 0, len(st.buckets))
		for k, b := range st.buckets {
			if !b.settled || b.rules != rs || now.Sub(b.decided) >= s.recheck {
				keys = append(keys, k)
			}
		}
	}
	n := 0
	for _, k := range keys {
		b := st.buckets[k]
		if b == nil {
			continue // woken for a bucket it no longer has
		}
		keys[n] = b.key
		n++
		if b.rules != rs {
			s.untally(st, b)
			s.rematch(b, rs, st.domain)
			s.tally(st, b)
		}
	}
	keys = keys[:n]
	st.mu.Unlock()
	return s.decideAll(ctx, ss, st, keys, false, now)
}

// decideAll decides the shares of keys, sends those to send in one response, and then tells the
// other proxies of the buckets where this one released room. Each decision in the store is
// bounded by the assign timeout: one not made by then fails as the store failing does (the proxy
// keeps what it holds) and is made again at the next tick.
func (s *Server) decideAll(ctx context.Context, ss rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer, st *stream, keys []string, force bool, now time.Time) error {
	var actions []*rlqspb.RateLimitQuotaResponse_BucketAction
	type release struct {
		key     string
		waiting []string
	}
	var released []release
	for _, k := range keys {
		a, waiting, err := s.decide(ctx, st, k, force, now)
		if err != nil {
			return err
		}
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

// wake has the streams of this replica among waiting (proxy ids, sorted) decide their shares of bucket
// again now: a proxy released room that they wait for. Without it they would take the room at
// their next tick. It returns how many of them are on this replica.
func (s *Server) wake(bucket string, waiting []string) int {
	s.mu.Lock()
	var sts []*stream
	if sb := s.byBucket[bucket]; sb != nil {
		for _, st := range sb.streams {
			if _, ok := slices.BinarySearch(waiting, st.id); ok {
				sts = append(sts, st)
			}
		}
	}
	s.mu.Unlock()
	for _, st := range sts {
		st.mu.Lock()
		if b := st.buckets[bucket]; b != nil {
			st.pending[b.key] = true
		}
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
	_, id, _ := entries(b.key)
	r, _ := match(rs, domain, id)
	b.rules, b.pol = rs, policyOf(r)
}

// decide returns the action for one bucket of st, or nil when there is nothing to send, and,
// when the proxy's share shrank, the proxies waiting for the room it released; or the error
// ending the stream when the bucket has as many proxies as it may.
// force: the bucket was just reported and gets an answer.
func (s *Server) decide(ctx context.Context, st *stream, key string, force bool, now time.Time) (*rlqspb.RateLimitQuotaResponse_BucketAction, []string, error) {
	st.mu.Lock()
	b := st.buckets[key] // a stream's buckets are removed only when it ends
	pol, demand, reported, wasAllowAll, sent := b.pol, b.demand, b.lastReport, b.allowAll, b.sent
	st.mu.Unlock()
	ttlMs := s.ttl.Milliseconds()
	if pol.allowAll {
		if !force && sent && wasAllowAll {
			return nil, nil, nil
		}
		if sent && !wasAllowAll {
			// It had a share under a rule that no longer limits it.
			_ = s.store.Leave(ctx, key, st.id, now.UnixMilli())
		}
		st.mu.Lock()
		s.untally(st, b)
		b.sent, b.allowAll, b.share, b.sentAt = true, true, Share{}, now
		b.settled, b.decided = true, now
		s.tally(st, b)
		st.mu.Unlock()
		return s.action(key, blanket(typev3.RateLimitStrategy_ALLOW_ALL)), nil, nil
	}
	seen := Seen{Demand: demand, Until: reported.UnixMilli() + ttlMs, Report: force}
	lim := pol.lim
	lim.MaxProxies = s.maxProxies
	s.decisions.Inc()
	actx, cancel := context.WithTimeout(ctx, s.assignTimeout)
	d, err := s.store.Assign(actx, key, st.id, lim, seen, now.UnixMilli(), ttlMs)
	cancel()
	share := d.Share
	st.mu.Lock()
	defer st.mu.Unlock()
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			// The stream ended (its proxy went away, or rls is stopping) while the store
			// decided: not the store's failure, and nothing to log above debug.
			s.log.Debug("rlqs: stream ended while its share was decided", "proxy", st.id, "err", err)
			return nil, nil, status.FromContextError(cerr).Err()
		}
		s.errs.Inc()
		if !st.failing {
			// Once per stream until it recovers, and once per interval of all streams together.
			s.warn.Warn("store_failed", "rlqs: deciding shares failed; proxies keep their assignments until they expire", "err", err)
		}
		st.failing = true
		return nil, nil, nil
	}
	if st.failing {
		s.warn.Log(slog.LevelInfo, "store_recovered", "rlqs: deciding shares again")
		st.failing = false
	}
	b.settled, b.decided = d.Settled, now
	if d.Refused {
		_, id, _ := entries(key)
		return nil, nil, s.refuse(st, "too_many_proxies", codes.ResourceExhausted,
			"bucket %.64q has %d proxies already (--rlqs-max-proxies-per-bucket)", id.String(), s.maxProxies)
	}
	// Those to wake: the proxies waiting for the room this one released, or, when this one is
	// left waiting, those holding more than their targets.
	wake := append(slices.Clip(d.Waiting), d.Over...)
	slices.Sort(wake) // as wake searches it
	if !d.Send && !(sent && wasAllowAll) {
		return nil, wake, nil
	}
	s.untally(st, b)
	b.sent, b.allowAll, b.share, b.sentAt = true, false, share, now
	s.tally(st, b)
	return s.action(key, strategyFor(share, pol.lim)), wake, nil
}

func (s *Server) action(key string, strat *typev3.RateLimitStrategy) *rlqspb.RateLimitQuotaResponse_BucketAction {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: bucketProto(key),
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
func strategyFor(share Share, lim Budget) *typev3.RateLimitStrategy {
	if share.Rate <= 0 {
		return blanket(typev3.RateLimitStrategy_DENY_ALL)
	}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(max(share.Burst, 1), math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(share.Rate, math.MaxUint32))),
		FillInterval:  durationpb.New(ttlDuration(lim.PeriodMs)),
	}}}
}
