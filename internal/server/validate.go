package server

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	redisbackend "github.com/rls-project/rls/internal/backend/redis"
	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/top"
)

// Validate checks every value of c and every combination of them: it returns the errors of
// every group of rules below, joined (each group names at least its first value wrong), or nil
// when New may be called. What it leaves to New needs the outside
// world: files that must be read (rules, certificates, the caller policy, the admin token), a
// Redis URL that must name addresses that can be dialed, and ports that must be free.
func (c Config) Validate() error {
	return errors.Join(
		c.validateService(),
		c.Rules.validate(c.fromXDS()),
		c.Log.validate(),
		c.GRPC.validate(),
		c.HTTP.validate(),
		c.HTTP.validateTLS(),
		c.Debug.validate(),
		c.Metrics.validate(),
		c.Reload.validate(),
		c.Bounds.validate(),
		c.RLQS.validate(),
		c.validateRedis(),
		c.XDS.validate(),
		c.validateRegions(),
		validateTracing(envMap(c.Env)),
		c.Stats.validate(),
		c.DecisionLog.validate(),
		validateMetricExport(envMap(c.Env)),
	)
}

// validateService checks the flags of every decision.
func (c Config) validateService() error {
	var errs []error
	if _, err := service.ParseHeaderMode(c.ResponseHeaders); err != nil {
		errs = append(errs, fmt.Errorf("--response-headers: %w", err))
	}
	if _, err := service.ParseFailureMode(c.FailureMode); err != nil {
		errs = append(errs, fmt.Errorf("--failure-mode: %w", err))
	}
	if !(c.NearLimitRatio >= 0 && c.NearLimitRatio <= 1) { // NaN too
		errs = append(errs, fmt.Errorf("--near-limit-ratio %v: want a value in [0, 1]", c.NearLimitRatio))
	}
	if t := c.Top; t.Keys < 0 || t.Keys > top.MaxKeys {
		errs = append(errs, fmt.Errorf("--top-keys %d: want 0 (off) to %d", t.Keys, top.MaxKeys))
	} else if t.Keys > 0 && t.MaxBytes < top.RuleBytes(t.Keys) {
		errs = append(errs, fmt.Errorf("--top-max-bytes %d: one rule's counters need %d with --top-keys %d", t.MaxBytes, top.RuleBytes(t.Keys), t.Keys))
	}
	if c.Backend != "memory" && c.Backend != "redis" {
		errs = append(errs, fmt.Errorf("--backend %q: want memory or redis", c.Backend))
	}
	return errors.Join(errs...)
}

func (r RulesConfig) validate(fromXDS bool) error {
	if fromXDS && r.Path != "" {
		return errors.New("--config and --xds-server both give the rules: keep one")
	}
	return nil
}

func (l LogConfig) validate() error {
	_, err := l.level()
	if l.Format != "text" && l.Format != "json" {
		err = errors.Join(err, fmt.Errorf("--log-format %q: want text or json", l.Format))
	}
	return err
}

func (l LogConfig) level() (slog.Level, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.Level)); err != nil {
		return lv, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.Level)
	}
	return lv, nil
}

func (g GRPCConfig) validate() error {
	var errs []error
	if g.MaxConcurrentStreams == 0 {
		errs = append(errs, errors.New("--grpc-max-concurrent-streams 0: want at least 1"))
	}
	if g.StreamWorkers > maxStreamWorkers {
		errs = append(errs, fmt.Errorf("--grpc-stream-workers %d: want at most %d (calls beyond the workers run on goroutines of their own)", g.StreamWorkers, maxStreamWorkers))
	}
	if g.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("--grpc-max-connections %d: want 0 (no bound) or more", g.MaxConnections))
	}
	if g.MaxConnsPerSource < 0 {
		errs = append(errs, fmt.Errorf("--grpc-max-connections-per-source %d: want 0 (no bound) or more", g.MaxConnsPerSource))
	}
	if g.HandshakeTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--grpc-handshake-timeout %v: must be > 0", g.HandshakeTimeout))
	}
	if g.MessageTimeout < 0 {
		errs = append(errs, fmt.Errorf("--grpc-message-timeout %v: want 0 (none) or more", g.MessageTimeout))
	}
	if g.MaxConnectionIdle < 0 {
		errs = append(errs, fmt.Errorf("--grpc-max-connection-idle %v: want 0 (never) or more", g.MaxConnectionIdle))
	}
	switch {
	case g.TLSCert == "" && g.TLSKey == "" && g.TLSClientCA != "":
		errs = append(errs, errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key"))
	case g.TLSCert == "" && g.TLSKey == "" && g.TLSClientSAN != "":
		errs = append(errs, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca, --grpc-tls-cert and --grpc-tls-key"))
	case g.TLSClientCA == "" && g.TLSClientSAN != "":
		errs = append(errs, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca"))
	}
	return errors.Join(errs...)
}

// validateTLS checks the HTTP listener's TLS flags: a certificate and its key together, and a
// client CA only with them.
func (h HTTPConfig) validateTLS() error {
	switch {
	case (h.TLSCert == "") != (h.TLSKey == ""):
		return errors.New("--http-tls-cert and --http-tls-key go together")
	case h.TLSCert == "" && h.TLSClientCA != "":
		return errors.New("--http-tls-client-ca needs --http-tls-cert and --http-tls-key")
	}
	return nil
}

func (l HTTPLimits) validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"--http-read-header-timeout", l.ReadHeaderTimeout},
		{"--http-read-timeout", l.ReadTimeout},
		{"--http-write-timeout", l.WriteTimeout},
		{"--http-idle-timeout", l.IdleTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("%s %v: must be > 0", d.name, d.v)
		}
	}
	if l.MaxHeaderBytes <= 0 {
		return fmt.Errorf("--http-max-header-bytes %d: must be > 0", l.MaxHeaderBytes)
	}
	return nil
}

func (d DebugConfig) validate() error {
	if d.Pprof && d.Addr == "" {
		return errors.New("--debug serves pprof on the debug listener: it needs --debug-addr")
	}
	return nil
}

func (m MetricsConfig) validate() error {
	if m.Addr != "" && !strings.HasPrefix(m.Path, "/") {
		return fmt.Errorf("--metrics-path %q: want a path starting with /", m.Path)
	}
	return nil
}

func (r ReloadConfig) validate() error {
	if r.Debounce <= 0 {
		return fmt.Errorf("--reload-debounce %v: must be > 0", r.Debounce)
	}
	return nil
}

func (b BoundsConfig) validate() error {
	switch {
	case b.MaxRequestBytes < 1024:
		return fmt.Errorf("--max-request-bytes %d: want at least 1024", b.MaxRequestBytes)
	case b.MaxInflightBytes < 0:
		return fmt.Errorf("--max-inflight-bytes %d: want ≥ 0", b.MaxInflightBytes)
	case b.OverrideMaxPeriod < 0:
		return fmt.Errorf("--override-max-period %v: want ≥ 0", b.OverrideMaxPeriod)
	case b.MaxCalls < 0:
		return fmt.Errorf("--grpc-max-calls %d: want 0 (no bound) or more", b.MaxCalls)
	case b.MaxNewKeysPerCaller < 0:
		return fmt.Errorf("--max-new-keys-per-caller %d: want 0 (no bound) or more", b.MaxNewKeysPerCaller)
	}
	_, err := b.overridePolicy()
	return err
}

// validate checks the RLQS flags, with --rlqs. Envoy's filter reads an assignment's time to
// live in whole seconds (the nanos are dropped), so a TTL under a second would expire every
// assignment as it arrives and a fractional one would expire it before rls stops counting it
// held: both are refused unless --rlqs-testing-subsecond-ttl.
func (rc RLQSConfig) validate() error {
	if !rc.Enabled {
		return nil
	}
	switch {
	case rc.MaxReportBytes < 1024:
		return fmt.Errorf("--rlqs-max-report-bytes %d: want at least 1024", rc.MaxReportBytes)
	case rc.TTL <= 0:
		return fmt.Errorf("--rlqs-assignment-ttl %v: want a positive whole number of seconds", rc.TTL)
	case !rc.SubsecondTTLs && (rc.TTL < time.Second || rc.TTL%time.Second != 0):
		return fmt.Errorf("--rlqs-assignment-ttl %v: want a whole number of seconds ≥ 1s (Envoy reads the assignment's time to live in whole seconds)", rc.TTL)
	case rc.TTL < time.Millisecond:
		return fmt.Errorf("--rlqs-assignment-ttl %v: want at least 1ms", rc.TTL)
	case rc.Tick <= 0:
		return fmt.Errorf("--rlqs-tick %v: want a positive duration", rc.Tick)
	case rc.MaxBuckets <= 0:
		return fmt.Errorf("--rlqs-max-buckets %d: want at least 1", rc.MaxBuckets)
	case rc.MaxStreams <= 0:
		return fmt.Errorf("--rlqs-max-streams %d: want at least 1", rc.MaxStreams)
	case rc.MaxTotalBuckets <= 0:
		return fmt.Errorf("--rlqs-max-total-buckets %d: want at least 1", rc.MaxTotalBuckets)
	case rc.MaxBucketBytes <= 0:
		return fmt.Errorf("--rlqs-max-bucket-bytes %d: want at least 1", rc.MaxBucketBytes)
	case rc.MaxProxies <= 0:
		return fmt.Errorf("--rlqs-max-proxies-per-bucket %d: want at least 1", rc.MaxProxies)
	case rc.ReportBudget < 0:
		return fmt.Errorf("--rlqs-report-budget-bytes %d: want at least --rlqs-max-report-bytes (%d), or 0 for the default", rc.ReportBudget, rc.MaxReportBytes)
	case cmp.Or(rc.ReportBudget, rlqs.DefaultReportBudget) < int64(rc.MaxReportBytes):
		return fmt.Errorf("--rlqs-report-budget-bytes %d: want at least --rlqs-max-report-bytes (%d), or the largest reports are always refused",
			cmp.Or(rc.ReportBudget, rlqs.DefaultReportBudget), rc.MaxReportBytes)
	}
	for _, d := range strings.Split(rc.Domains, ",") {
		if rc.Domains != "" && strings.TrimSpace(d) == "" {
			return fmt.Errorf("--rlqs-domains %q: an empty domain", rc.Domains)
		}
	}
	return nil
}

// validateRedis checks the Redis flags, with --backend redis. A --redis-url that does not
// parse is New's to report (with its password hidden), as one that names no address rls can
// dial.
func (c Config) validateRedis() error {
	rc := c.Redis
	if c.Backend != "redis" {
		return nil
	}
	var errs []error
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--redis-dial-timeout", rc.DialTimeout}, {"--redis-read-timeout", rc.ReadTimeout}, {"--redis-timeout", rc.Timeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a duration ≥ 0 (0: the default)", d.flag, d.v))
		}
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"--redis-pool-size", rc.PoolSize}, {"--redis-local-cache-size", rc.LocalCacheSize}, {"--redis-coalesce", rc.Coalesce}} {
		if n.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d: want a number ≥ 0", n.flag, n.v))
		}
	}
	if rc.Leases && (rc.LeaseLifetime < time.Millisecond || rc.LeaseLifetime > 10*time.Second) {
		errs = append(errs, fmt.Errorf("--redis-lease-lifetime %v: want 1ms to 10s (50ms by default; --redis-leases=false turns leases off)", rc.LeaseLifetime))
	}
	if rc.HealthInterval <= 0 {
		errs = append(errs, fmt.Errorf("--redis-health-interval %v: want a positive duration (1s by default)", rc.HealthInterval))
	}
	if rc.TLSCert != "" || rc.TLSKey != "" || rc.TLSCA != "" || rc.TLSSkipVerify {
		if t, err := redisbackend.ParseURL(rc.URL); err == nil && !t.TLS {
			errs = append(errs, errors.New("--redis-tls-* need TLS: a rediss://, rediss-sentinel:// or rediss-cluster:// --redis-url"))
		}
	}
	return errors.Join(errs...)
}

// validate checks the xDS flags, with --xds-server.
func (x XDSConfig) validate() error {
	if x.Server == "" {
		return nil
	}
	_, errMD := parsePairs("xds-node-metadata", x.NodeMetadata)
	_, errHdr := parsePairs("xds-header", x.Headers)
	var errTLS error
	if !x.TLS && (x.TLSCert != "" || x.TLSKey != "" || x.TLSCA != "" || x.TLSServerName != "") {
		errTLS = errors.New("--xds-tls-cert, --xds-tls-key, --xds-tls-ca and --xds-tls-server-name need --xds-tls")
	}
	return errors.Join(errMD, errHdr, errTLS)
}
