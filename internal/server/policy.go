package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/policy"
)

// callerPolicy is the caller policy in force, reloaded from its file, and its metrics.
type callerPolicy struct {
	path   string
	cur    atomic.Pointer[policy.Policy]
	log    *slog.Logger
	denied *prometheus.CounterVec
	loads  *prometheus.CounterVec
	last   prometheus.Gauge
}

// newCallerPolicy loads the policy file c names and registers its metrics on reg; it returns
// nil without a file. A file that does not load fails the start.
func newCallerPolicy(c Config, reg prometheus.Registerer, log *slog.Logger) (*callerPolicy, error) {
	if c.CallerPolicy == "" {
		return nil, nil
	}
	p, err := policy.Load(c.CallerPolicy)
	if err != nil {
		return nil, fmt.Errorf("--caller-policy: %w", err)
	}
	cp := &callerPolicy{
		path: c.CallerPolicy, log: log,
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_policy_denied_total",
			Help: "Requests (gRPC ShouldRateLimit and POST /json) the caller policy refused, by reason: caller (no entry and no default), domain, refund, override, hits.",
		}, []string{"reason"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_policy_loads_total",
			Help: "Caller policy loads, at start and on change, by result: success, or failure (the policy in force stays).",
		}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_policy_last_success_timestamp_seconds",
			Help: "When the caller policy in force was loaded.",
		}),
	}
	for _, r := range policy.Reasons {
		cp.denied.WithLabelValues(string(r))
	}
	cp.loads.WithLabelValues("failure")
	for _, m := range []prometheus.Collector{cp.denied, cp.loads, cp.last} {
		if err := reg.Register(m); err != nil {
			return nil, err
		}
	}
	cp.set(p)
	if c.GRPC.TLSClientCA == "" {
		log.Warn("--caller-policy without --grpc-tls-client-ca: no caller has a certificate, so every caller gets the default entry", "policy", cp.path)
	}
	return cp, nil
}

func (cp *callerPolicy) set(p *policy.Policy) {
	cp.cur.Store(p)
	cp.loads.WithLabelValues("success").Inc()
	cp.last.Set(float64(time.Now().UnixNano()) / 1e9)
	def := "none (unlisted callers are refused)"
	if p.Default != nil {
		def = fmt.Sprintf("domains %q", p.Default.Domains)
	}
	cp.log.Info("caller policy loaded", "policy", cp.path, "callers", len(p.Callers), "default", def)
}

// reload loads the file again and puts it in force, or keeps the policy in force and returns
// why not.
func (cp *callerPolicy) reload() error {
	p, err := policy.Load(cp.path)
	if err != nil {
		cp.loads.WithLabelValues("failure").Inc()
		cp.log.Error("caller policy rejected; the policy in force stays", "policy", cp.path, "err", err)
		return err
	}
	cp.set(p)
	return nil
}

// watch reloads the policy when its file changes and on SIGHUP, as the rules are, until ctx ends;
// hup reloads it as a SIGHUP does (nil without a policy).
func (cp *callerPolicy) watch(ctx context.Context, rc ReloadConfig) (hup func(), err error) {
	if cp == nil {
		return nil, nil
	}
	// The watcher's own lines speak of rules: say which file they are about.
	return startReload(ctx, rc, cp.path, cp.reload, cp.log.With("file", "caller policy"))
}

// authorizer is the service's Authorize: nil without a policy, so that nothing is asked.
func (cp *callerPolicy) authorizer() func(context.Context, *rlsv3.RateLimitRequest) error {
	if cp == nil {
		return nil
	}
	return cp.authorize
}

// authorize checks req against the policy for the caller of ctx: the names of the client
// certificate rls verified (over gRPC, or over HTTP with --http-tls-client-ca); without one,
// none (the default entry).
func (cp *callerPolicy) authorize(ctx context.Context, req *rlsv3.RateLimitRequest) error {
	err := cp.cur.Load().Check(callerIdentities(ctx), req)
	if err == nil {
		return nil
	}
	var d *policy.Denial
	if errors.As(err, &d) {
		cp.denied.WithLabelValues(string(d.Reason)).Inc()
	}
	return status.Error(codes.PermissionDenied, err.Error())
}

// callerIdentities are the names of the verified client certificate of ctx's caller, over gRPC
// or over HTTP with --http-tls-client-ca (see requireClientCert); none without one.
func callerIdentities(ctx context.Context) []string {
	if ids, ok := ctx.Value(httpCallerKey{}).([]string); ok {
		return ids
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return policy.Identities(info.State.VerifiedChains[0][0])
}
