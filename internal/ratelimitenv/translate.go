package ratelimitenv

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	redisbackend "github.com/rls-project/rls/internal/backend/redis"
)

// Result is what envoyproxy/ratelimit's environment means to rls. The zero value is an
// environment that is not envoyproxy/ratelimit's: nothing to do.
type Result struct {
	// Present lists the envoyproxy/ratelimit variables set, sorted; empty when the environment
	// is not envoyproxy/ratelimit's.
	Present []string
	// Settings are rls flag values, in a stable order, at most one per flag.
	Settings []Setting
	// Notices name each variable rls cannot honour as given, once, with what rls does instead.
	Notices []Notice
}

// Setting is one rls flag value read from the environment.
type Setting struct {
	Flag  string // without dashes: "redis-url"
	Value string // as the flag takes it; may hold a password: show Display() instead
	From  string // the variables it came from, "REDIS_TYPE, REDIS_URL"; "default of X" when none was set
}

// Notice says what rls does instead of what a variable asks.
type Notice struct {
	Var  string
	Text string
}

// Distinctive are the variables that mark an environment as envoyproxy/ratelimit's: names no
// other program is likely to set. HOST, PORT, LOG_LEVEL, REDIS_URL and the like are not among
// them; they are read only when one of these is set.
var Distinctive = []string{
	"BACKEND_TYPE",
	"CONFIG_GRPC_XDS_NODE_ID",
	"CONFIG_GRPC_XDS_SERVER_URL",
	"CONFIG_TYPE",
	"FORCE_START_WITHOUT_INITIAL_CONFIG",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"LIMIT_RESPONSE_HEADERS_ENABLED",
	"LOCAL_CACHE_SIZE_IN_BYTES",
	"MEMCACHE_HOST_PORT",
	"MEMCACHE_SRV",
	"MERGE_DOMAIN_CONFIG",
	"REDIS_PERSECOND",
	"REDIS_PERSECOND_URL",
	"REDIS_SOCKET_TYPE",
	"REDIS_TYPE",
	"RUNTIME_APPDIRECTORY",
	"RUNTIME_IGNOREDOTFILES",
	"RUNTIME_ROOT",
	"RUNTIME_SUBDIRECTORY",
	"RUNTIME_WATCH_ROOT",
	"USE_DOG_STATSD",
	"USE_STATSD",
}

// LocalCacheBytesPerKey is the estimate that converts LOCAL_CACHE_SIZE_IN_BYTES into
// --redis-local-cache-size keys: envoyproxy/ratelimit's freecache spends a 24-byte header, the
// key (domain, descriptor entries and window start, typically 50 to 100 bytes) and an 8-byte
// count on each entry.
const LocalCacheBytesPerKey = 128

// extraVars are variables envoyproxy/ratelimit deployments set that its settings do not read.
var extraVars = []string{
	"GRPC_SERVER_TLS_CA_CERT", // set by Envoy Gateway; read as GRPC_CLIENT_TLS_CACERT is (see clientCA)
}

// debugHost is the debug listener's host when DEBUG_PORT is set without DEBUG_HOST: rls's
// loopback, not envoyproxy/ratelimit's 0.0.0.0.
const debugHost = "127.0.0.1"

// mogrifierPrefix starts the variables of a dogstatsd mogrifier (DOG_STATSD_MOGRIFIER_<name>_PATTERN).
const mogrifierPrefix = "DOG_STATSD_MOGRIFIER_"

// Translate reads envoyproxy/ratelimit's environment from env ("K=V" strings, as os.Environ
// returns them; the first of a repeated name counts). When none of Distinctive is set it reads
// nothing else and returns the zero Result. The error names each variable whose value is
// invalid, or whose ignoring would change decisions (BACKEND_TYPE=memcache), with what is
// wanted; it never shows a password. On error the Result holds only Present.
func Translate(env []string) (Result, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			continue
		}
		if _, dup := vars[k]; !dup {
			vars[k] = v
		}
	}
	if !slices.ContainsFunc(Distinctive, func(n string) bool { _, ok := vars[n]; return ok }) {
		return Result{}, nil
	}
	r := &reader{vars: vars, accounted: map[string]bool{}}
	for k := range vars {
		if known[k] || strings.HasPrefix(k, mogrifierPrefix) {
			r.present = append(r.present, k)
		}
	}
	slices.Sort(r.present)

	r.listeners()
	r.logging()
	r.rules()
	r.backend()
	r.modes()
	r.grpcTLS()
	r.metrics()
	r.headers()
	r.unsupported()
	// Every variable is translated or noticed above; this keeps one that a later change of the
	// code above forgets from being ignored in silence.
	for _, k := range r.present {
		r.notice(k, "not read by rls")
	}
	if err := errors.Join(r.errs...); err != nil {
		return Result{Present: r.present}, err
	}
	return Result{Present: r.present, Settings: r.settings, Notices: r.notices}, nil
}

// reader holds one translation's state.
type reader struct {
	vars      map[string]string
	present   []string
	accounted map[string]bool // translated or noticed
	settings  []Setting
	notices   []Notice
	errs      []error
}

func (r *reader) get(name string) (string, bool) {
	v, ok := r.vars[name]
	return v, ok
}

func (r *reader) has(name string) bool {
	_, ok := r.vars[name]
	return ok
}

// set records flag=value coming from the variables from (those set are named; when none is,
// the value is envoyproxy/ratelimit's default).
func (r *reader) set(flag, value string, from ...string) {
	var set []string
	for _, n := range from {
		if r.has(n) {
			set = append(set, n)
			r.accounted[n] = true
		}
	}
	f := strings.Join(set, ", ")
	if f == "" {
		f = "default of " + strings.Join(from, ", ")
	}
	r.settings = append(r.settings, Setting{Flag: flag, Value: value, From: f})
}

// notice records what rls does instead of name, when name is set and not already accounted for.
func (r *reader) notice(name, format string, args ...any) {
	if !r.has(name) || r.accounted[name] {
		return
	}
	r.accounted[name] = true
	r.notices = append(r.notices, Notice{Var: name, Text: fmt.Sprintf(format, args...)})
}

// note adds a caveat to a variable that was translated, once.
func (r *reader) note(name, format string, args ...any) {
	if slices.ContainsFunc(r.notices, func(n Notice) bool { return n.Var == name }) {
		return
	}
	r.accounted[name] = true
	r.notices = append(r.notices, Notice{Var: name, Text: fmt.Sprintf(format, args...)})
}

// noticeAll notices each of names that is set, with the same text.
func (r *reader) noticeAll(text string, names ...string) {
	for _, n := range names {
		r.notice(n, "%s", text)
	}
}

// fail records an invalid value; the value is shown unless secret.
func (r *reader) fail(name, want string) {
	v, ok := r.vars[name]
	switch {
	case !ok:
		r.errs = append(r.errs, fmt.Errorf("%s (not set: its default %q): %s", name, defaults[name], want))
		return
	case secret[name]:
		v = "xxx"
	case name == "REDIS_URL":
		v = redactURL(v)
	}
	r.errs = append(r.errs, fmt.Errorf("%s=%q: %s", name, v, want))
	r.accounted[name] = true
}

// defaults are envoyproxy/ratelimit's defaults that an error can be about.
var defaults = map[string]string{"REDIS_URL": "/var/run/nutcracker/ratelimit.sock"}

// secret are the variables whose values are never shown.
var secret = map[string]bool{
	"REDIS_AUTH": true, "REDIS_SENTINEL_AUTH": true, "REDIS_PERSECOND_AUTH": true,
	"REDIS_PERSECOND_SENTINEL_AUTH": true, "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": true,
}

// boolean reads name as envoyproxy/ratelimit does (strconv.ParseBool), def when unset.
func (r *reader) boolean(name string, def bool) bool {
	v, ok := r.get(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, "want true or false")
		return def
	}
	return b
}

// integer reads name as envoyproxy/ratelimit does (any base Go accepts), def when unset.
func (r *reader) integer(name string, def, lo, hi int64) int64 {
	v, ok := r.get(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(v, 0, 64)
	if err != nil || n < lo || n > hi {
		r.fail(name, fmt.Sprintf("want a whole number from %d to %d", lo, hi))
		return def
	}
	return n
}

// duration reads name as a Go duration ("10s", "1m30s"), def when unset; negative is invalid.
func (r *reader) duration(name string, def time.Duration) time.Duration {
	v, ok := r.get(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		r.fail(name, `want a duration such as "500ms", "10s" or "1h", not negative`)
		return def
	}
	return d
}

// str reads name, def when unset.
func (r *reader) str(name, def string) string {
	if v, ok := r.get(name); ok {
		return v
	}
	return def
}

// listeners translates the listen addresses. The gRPC and HTTP ones always, since rls's
// defaults differ from envoyproxy/ratelimit's. The debug listener shows every rule and any
// key's state, so it stays on loopback unless DEBUG_HOST names another host:
// envoyproxy/ratelimit's default, 0.0.0.0, is not followed.
func (r *reader) listeners() {
	for _, l := range []struct{ flag, host, port, defHost, defPort string }{
		{"grpc-addr", "GRPC_HOST", "GRPC_PORT", "0.0.0.0", "8081"},
		{"http-addr", "HOST", "PORT", "0.0.0.0", "8080"},
		{"debug-addr", "DEBUG_HOST", "DEBUG_PORT", debugHost, "6070"},
	} {
		if l.flag == "debug-addr" && !r.has(l.host) && !r.has(l.port) {
			continue // rls's own default, 127.0.0.1:6070
		}
		host := strings.TrimSuffix(strings.TrimPrefix(r.str(l.host, l.defHost), "["), "]")
		def, _ := strconv.ParseInt(l.defPort, 10, 64)
		port := r.integer(l.port, def, 0, 65535)
		r.set(l.flag, net.JoinHostPort(host, strconv.FormatInt(port, 10)), l.host, l.port)
	}
	if r.has("DEBUG_PORT") && !r.has("DEBUG_HOST") {
		r.note("DEBUG_PORT", "DEBUG_HOST is not set: the debug listener (every rule, any key's state) stays on %s, "+
			"where envoyproxy/ratelimit's default is 0.0.0.0; set DEBUG_HOST to serve it elsewhere", debugHost)
	}
	r.notice("GRPC_UDS", "rls serves gRPC on TCP only, at --grpc-addr from GRPC_HOST and GRPC_PORT (default 0.0.0.0:8081): point clients there instead of the unix socket")
}

func (r *reader) logging() {
	// Only when set: envoyproxy/ratelimit's default, WARN, quietens its own chatty logs; rls's
	// info lines are few (start, rules loaded, availability changes) and worth keeping.
	if v, ok := r.get("LOG_LEVEL"); ok {
		switch strings.ToLower(v) {
		case "trace", "debug":
			r.set("log-level", "debug", "LOG_LEVEL")
		case "info":
			r.set("log-level", "info", "LOG_LEVEL")
		case "warn", "warning":
			r.set("log-level", "warn", "LOG_LEVEL")
		case "error", "fatal", "panic":
			r.set("log-level", "error", "LOG_LEVEL")
		default:
			r.fail("LOG_LEVEL", "want trace, debug, info, warn, error, fatal or panic")
		}
	}
	if v, ok := r.get("LOG_FORMAT"); ok {
		// envoyproxy/ratelimit logs JSON for "json" in any case, text for anything else.
		if strings.EqualFold(v, "json") {
			r.set("log-format", "json", "LOG_FORMAT")
		} else {
			r.set("log-format", "text", "LOG_FORMAT")
			if !strings.EqualFold(v, "text") {
				r.note("LOG_FORMAT", "%q is not json: rls logs text, as envoyproxy/ratelimit does", v)
			}
		}
	}
}

var (
	runtimeVars = []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT"}
	xdsVars     = []string{
		"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
		"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	}
)

// rules translates where the rules come from: the runtime directory or an xDS server.
func (r *reader) rules() {
	typ := r.str("CONFIG_TYPE", "FILE")
	switch strings.ToUpper(typ) {
	case "FILE":
		r.fileRules()
		r.noticeAll("CONFIG_TYPE is FILE: rules come from the runtime directory and no xDS client runs, as in envoyproxy/ratelimit", xdsVars...)
	case "GRPC_XDS_SOTW":
		r.xdsRules()
		r.noticeAll("CONFIG_TYPE is GRPC_XDS_SOTW: rules come over xDS and the runtime directory is not read, as in envoyproxy/ratelimit", runtimeVars...)
	default:
		r.fail("CONFIG_TYPE", "want FILE or GRPC_XDS_SOTW")
	}
	if r.has("FORCE_START_WITHOUT_INITIAL_CONFIG") {
		r.set("start-without-rules", strconv.FormatBool(r.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false)), "FORCE_START_WITHOUT_INITIAL_CONFIG")
	}
	if r.has("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED") {
		r.set("ready-with-rules", strconv.FormatBool(r.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)), "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	}
	if r.has("MERGE_DOMAIN_CONFIG") {
		r.set("merge-domains", strconv.FormatBool(r.boolean("MERGE_DOMAIN_CONFIG", false)), "MERGE_DOMAIN_CONFIG")
	}
}

// fileRules: envoyproxy/ratelimit's runtime reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY
// in both RUNTIME_WATCH_ROOT modes (watching the root, it loads everything under the
// subdirectory and keeps the keys under the app directory), every file of it and of its
// subdirectories whatever the extension.
func (r *reader) fileRules() {
	root := r.str("RUNTIME_ROOT", "/srv/runtime_data/current")
	dir := path.Join(root, r.str("RUNTIME_SUBDIRECTORY", ""), r.str("RUNTIME_APPDIRECTORY", "config"))
	r.set("config", dir, "CONFIG_TYPE", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY")
	r.set("config-all-files", "true", "CONFIG_TYPE")
	r.set("config-dot-files", strconv.FormatBool(!r.boolean("RUNTIME_IGNOREDOTFILES", false)), "RUNTIME_IGNOREDOTFILES")
	if r.has("RUNTIME_WATCH_ROOT") {
		r.boolean("RUNTIME_WATCH_ROOT", true)
		r.notice("RUNTIME_WATCH_ROOT", "rls watches the rule directory %s and its parent, whatever this says: it reloads on changes to its files "+
			"(edits, renames, files added or removed, a Kubernetes ConfigMap's ..data symlink swap) and on SIGHUP; "+
			"a symlink swapped higher up (RUNTIME_ROOT itself, when RUNTIME_SUBDIRECTORY is set) is not seen: send SIGHUP after it", dir)
	}
}

func (r *reader) xdsRules() {
	server := r.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")
	r.set("xds-server", server, "CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL")
	r.set("xds-node-id", r.str("CONFIG_GRPC_XDS_NODE_ID", "default"), "CONFIG_GRPC_XDS_NODE_ID")
	if v, ok := r.get("CONFIG_GRPC_XDS_NODE_METADATA"); ok {
		// envoyproxy/ratelimit keeps the key=value entries and drops the others.
		var kept, dropped []string
		for _, e := range strings.Split(v, ",") {
			if k, _, ok := strings.Cut(e, "="); ok && k != "" {
				kept = append(kept, e)
			} else {
				dropped = append(dropped, strconv.Quote(e))
			}
		}
		if len(kept) > 0 {
			r.set("xds-node-metadata", strings.Join(kept, ","), "CONFIG_GRPC_XDS_NODE_METADATA")
		}
		if len(dropped) > 0 {
			r.note("CONFIG_GRPC_XDS_NODE_METADATA", "entries %s are not key=value: dropped, as envoyproxy/ratelimit drops them", strings.Join(dropped, ", "))
		}
	}
	if v, ok := r.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"); ok {
		// envconfig's map syntax: name:value,name:value. Values may be credentials: never shown.
		var hs []string
		for i, item := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(item, ":")
			if !ok || k == "" || strings.Contains(k, "=") {
				r.fail("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", fmt.Sprintf("item %d is not name:value: want name:value,name:value", i+1))
				hs = nil
				break
			}
			hs = append(hs, k+"="+val)
		}
		if hs != nil {
			r.set("xds-header", strings.Join(hs, ","), "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
		}
	}
	if r.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false) {
		r.set("xds-tls", "true", "CONFIG_GRPC_XDS_SERVER_USE_TLS")
		r.pair("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds-tls-cert", "xds-tls-key")
		if v, ok := r.get("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"); ok {
			r.set("xds-tls-ca", v, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")
		}
		if v, ok := r.get("CONFIG_GRPC_XDS_SERVER_TLS_SAN"); ok {
			r.set("xds-tls-server-name", v, "CONFIG_GRPC_XDS_SERVER_TLS_SAN")
		}
	} else {
		r.accounted["CONFIG_GRPC_XDS_SERVER_USE_TLS"] = true
		r.noticeAll("CONFIG_GRPC_XDS_SERVER_USE_TLS is not true: the xDS connection is plaintext and this is not used, as in envoyproxy/ratelimit",
			"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN")
	}
	initial := r.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 0)
	maxi := r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 0)
	if initial > 0 && maxi > 0 && maxi < initial {
		r.fail("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "want at least XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
	}
	if initial > 0 {
		r.set("xds-backoff-initial", initial.String(), "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")
	}
	if maxi > 0 {
		r.set("xds-backoff-max", maxi.String(), "XDS_CLIENT_BACKOFF_MAX_INTERVAL")
	}
	if r.has("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
		if n := r.integer("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0, 0, 1<<31-1); n > 0 {
			r.set("xds-max-msg-size", strconv.FormatInt(n, 10), "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
		} else {
			r.notice("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0 means gRPC's default, which rls keeps")
		}
	}
	r.noticeAll("rls retries the xDS server with jittered exponential backoff between --xds-backoff-initial and --xds-backoff-max (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and _MAX_INTERVAL)",
		"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "XDS_CLIENT_BACKOFF_JITTER")
}

// pair translates a certificate and key given together.
func (r *reader) pair(certVar, keyVar, certFlag, keyFlag string) {
	cert, okc := r.get(certVar)
	key, okk := r.get(keyVar)
	switch {
	case okc && okk:
		r.set(certFlag, cert, certVar)
		r.set(keyFlag, key, keyVar)
	case okc:
		r.fail(certVar, "needs "+keyVar+" as well")
	case okk:
		r.fail(keyVar, "needs "+certVar+" as well")
	}
}

var (
	memcacheVars = []string{
		"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
		"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	}
	perSecondVars = []string{
		"REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
		"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH",
		"REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
		"REDIS_PERSECOND_TIMEOUT", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
	}
	redisTLSVars = []string{"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"}
)

func (r *reader) backend() {
	switch v := r.str("BACKEND_TYPE", "redis"); strings.ToLower(v) {
	case "redis":
		r.set("backend", "redis", "BACKEND_TYPE")
	case "memcache":
		r.errs = append(r.errs, errors.New(`BACKEND_TYPE="memcache": rls has no memcache backend, and deciding elsewhere would change every answer: `+
			`set BACKEND_TYPE=redis with REDIS_URL (every replica shares one Redis), or give rls --backend memory for a single replica`))
		r.accounted["BACKEND_TYPE"] = true
		return
	default:
		r.fail("BACKEND_TYPE", "want redis or memcache, envoyproxy/ratelimit's values (for rls's memory backend give --backend memory or RLS_BACKEND=memory, which win over this)")
		return
	}
	r.noticeAll("BACKEND_TYPE is redis: memcache settings are not used (rls has no memcache backend)", memcacheVars...)
	r.redis()
}

// redis translates the Redis connection into one --redis-url and its companions.
func (r *reader) redis() {
	useTLS := r.boolean("REDIS_TLS", false)
	u, tlsURL, from, ok := r.redisURL(useTLS)
	if ok {
		r.set("redis-url", u, from...)
	}
	if useTLS || tlsURL {
		r.pair("REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "redis-tls-cert", "redis-tls-key")
		if v, ok := r.get("REDIS_TLS_CACERT"); ok {
			r.set("redis-tls-ca", v, "REDIS_TLS_CACERT")
		}
		if r.has("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION") {
			r.set("redis-tls-skip-hostname-verify", strconv.FormatBool(r.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)), "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
		}
	} else {
		r.noticeAll("REDIS_TLS is not true: the Redis connection is plaintext and this is not used, as in envoyproxy/ratelimit", redisTLSVars...)
	}
	if r.has("REDIS_POOL_SIZE") {
		r.set("redis-pool-size", strconv.FormatInt(r.integer("REDIS_POOL_SIZE", 0, 0, 1<<20), 10), "REDIS_POOL_SIZE")
	}
	if r.has("REDIS_TIMEOUT") {
		if d := r.duration("REDIS_TIMEOUT", 0); d > 0 {
			r.set("redis-dial-timeout", d.String(), "REDIS_TIMEOUT")
			r.set("redis-read-timeout", d.String(), "REDIS_TIMEOUT")
			r.note("REDIS_TIMEOUT", "bounds connecting and each socket read or write, as in envoyproxy/ratelimit; "+
				"a decision's own budget is --redis-timeout (default 50ms), shortened by the caller's deadline, after which the failure mode answers")
		} else {
			r.notice("REDIS_TIMEOUT", "0 (no timeout): rls keeps its 1s timeouts for connecting and for each socket read or write")
		}
	}
	if v, ok := r.get("CACHE_KEY_PREFIX"); ok {
		r.set("redis-key-prefix", v, "CACHE_KEY_PREFIX")
		r.note("CACHE_KEY_PREFIX", "rls lays out and encodes its keys differently: counters kept by envoyproxy/ratelimit do not carry over, every key starts fresh")
	}
	if r.has("LOCAL_CACHE_SIZE_IN_BYTES") {
		n := r.integer("LOCAL_CACHE_SIZE_IN_BYTES", 0, 0, 1<<40)
		keys := n / LocalCacheBytesPerKey
		if n > 0 && keys == 0 {
			keys = 1
		}
		r.set("redis-local-cache-size", strconv.FormatInt(keys, 10), "LOCAL_CACHE_SIZE_IN_BYTES")
		if n > 0 {
			r.note("LOCAL_CACHE_SIZE_IN_BYTES", "rls sizes its over-limit cache in keys: %d bytes at about %d bytes per key is %d keys", n, LocalCacheBytesPerKey, keys)
		}
	}
	r.noticeAll("rls keeps every limit, per-second ones included, in the one Redis of --redis-url", perSecondVars...)
	r.noticeAll("rls gathers concurrent decisions into pipelines itself (--redis-coalesce, default 64 per pipeline)", "REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT")
	r.notice("REDIS_CLUSTER_PIPELINE_PARALLELISM", "rls sends a Cluster's calls as one pipelined round trip per node, all nodes at once")
	r.notice("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "rls's readiness always follows Redis: a circuit breaker marks Redis down after failed round trips or an unanswered probe; "+
		"then /readyz and gRPC health report not ready with --failure-mode error, and ready but degraded with the other failure modes")
	r.notice("REDIS_POOL_ON_EMPTY_BEHAVIOR", "rls waits for a free connection only within a decision's budget (--redis-timeout); --redis-pool-size sets the pool")
	r.noticeAll("rls starts without waiting for Redis: decisions get the failure mode until Redis answers, probed every 500ms",
		"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME")
	r.notice("EXPIRATION_JITTER_MAX_SECONDS", "rls adds no jitter: a GCRA key (the default algorithm) expires when it is back to a full burst, so keys do not expire together; algorithm: fixed_window keys expire together at their window's end")
	r.notice("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "rls never charges a denied request, from any of its descriptors, "+
		"but where a limit has overdraft (a rule's overdraft: true, or RLS_OVERDRAFT=true for every rule): then hits reported past it are charged, into debt")
}

// redisURL builds rls's --redis-url from envoyproxy/ratelimit's variables. tlsURL says the URL
// given already asks for TLS (rediss://); from names the variables that apply to the topology.
func (r *reader) redisURL(useTLS bool) (u string, tlsURL bool, from []string, ok bool) {
	typ := strings.ToLower(r.str("REDIS_TYPE", "single"))
	if typ != "single" && typ != "sentinel" && typ != "cluster" {
		r.fail("REDIS_TYPE", "want single, sentinel or cluster")
		return "", false, nil, false
	}
	socket := strings.ToLower(r.str("REDIS_SOCKET_TYPE", "unix"))
	switch socket {
	case "tcp", "tcp4", "tcp6":
		socket = "tcp"
	case "unix":
	default:
		r.fail("REDIS_SOCKET_TYPE", "want tcp or unix")
		return "", false, nil, false
	}
	raw := r.str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	var user *url.Userinfo
	if a, ok := r.get("REDIS_AUTH"); ok {
		user = userinfo(a)
	}
	scheme := "redis"
	if useTLS {
		scheme = "rediss"
	}
	if typ != "sentinel" {
		r.notice("REDIS_SENTINEL_AUTH", "REDIS_TYPE is not sentinel: not used, as in envoyproxy/ratelimit")
	}
	if typ != "single" {
		r.notice("REDIS_SOCKET_TYPE", "REDIS_TYPE is %s: sentinels and cluster nodes are reached over TCP whatever this says, as in envoyproxy/ratelimit", typ)
	}
	single := []string{"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_TLS"}
	switch typ {
	case "single":
		if s, _, ok := strings.Cut(raw, "://"); ok {
			p, err := url.Parse(raw)
			switch {
			case err != nil:
				r.fail("REDIS_URL", "not a valid URL")
				return "", false, nil, false
			case s != "redis" && s != "rediss" && s != "unix":
				r.fail("REDIS_URL", "want host:port, a unix socket path, or a redis://, rediss:// or unix:// URL")
				return "", false, nil, false
			case s == "unix" && useTLS:
				r.fail("REDIS_TLS", "rls uses no TLS on a unix socket: set REDIS_URL to host:port (or rediss://host:port), or drop REDIS_TLS")
				return "", false, nil, false
			}
			if user != nil {
				p.User = user
			}
			if useTLS {
				p.Scheme = "rediss"
			}
			return p.String(), p.Scheme == "rediss", single, true
		}
		if socket == "unix" {
			if !strings.HasPrefix(raw, "/") {
				r.fail("REDIS_URL", "REDIS_SOCKET_TYPE is unix (its default): want an absolute socket path, or set REDIS_SOCKET_TYPE=tcp for host:port")
				return "", false, nil, false
			}
			if useTLS {
				r.fail("REDIS_TLS", "rls uses no TLS on a unix socket: set REDIS_SOCKET_TYPE=tcp with REDIS_URL=host:port, or drop REDIS_TLS")
				return "", false, nil, false
			}
			return (&url.URL{Scheme: "unix", User: user, Path: raw}).String(), false, single, true
		}
		if !hostPort(raw) {
			r.fail("REDIS_URL", "REDIS_SOCKET_TYPE is tcp: want host:port")
			return "", false, nil, false
		}
		return (&url.URL{Scheme: scheme, User: user, Host: raw}).String(), false, single, true
	case "sentinel":
		parts := strings.Split(raw, ",")
		if len(parts) < 2 || parts[0] == "" || strings.ContainsAny(parts[0], "/?#@: ") || !allHostPorts(parts[1:]) {
			r.fail("REDIS_URL", "REDIS_TYPE is sentinel: want the master name then the sentinels, master,host:port[,host:port...]")
			return "", false, nil, false
		}
		q := url.Values{}
		if a, ok := r.get("REDIS_SENTINEL_AUTH"); ok {
			if su, sp, hasUser := strings.Cut(a, ":"); hasUser {
				q.Set("sentinel_username", su)
				q.Set("sentinel_password", sp)
			} else {
				q.Set("sentinel_password", a)
			}
		}
		s := scheme + "-sentinel://" + userString(user) + strings.Join(parts[1:], ",") + "/" + parts[0]
		if len(q) > 0 {
			s += "?" + q.Encode()
		}
		return s, false, []string{"REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_SENTINEL_AUTH", "REDIS_TLS"}, true
	default: // cluster
		parts := strings.Split(raw, ",")
		if !allHostPorts(parts) {
			r.fail("REDIS_URL", "REDIS_TYPE is cluster: want the seed nodes, host:port[,host:port...]")
			return "", false, nil, false
		}
		return scheme + "-cluster://" + userString(user) + strings.Join(parts, ","), false, []string{"REDIS_TYPE", "REDIS_URL", "REDIS_AUTH", "REDIS_TLS"}, true
	}
}

// userinfo reads REDIS_AUTH's "password" or "user:password".
func userinfo(auth string) *url.Userinfo {
	if u, p, ok := strings.Cut(auth, ":"); ok {
		return url.UserPassword(u, p)
	}
	return url.UserPassword("", auth)
}

func userString(u *url.Userinfo) string {
	if u == nil {
		return ""
	}
	return u.String() + "@"
}

func hostPort(s string) bool {
	h, p, err := net.SplitHostPort(s)
	if err != nil || h == "" {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n <= 65535
}

func allHostPorts(ss []string) bool {
	if len(ss) == 0 {
		return false
	}
	for _, s := range ss {
		if !hostPort(s) {
			return false
		}
	}
	return true
}

// modes translates the service-wide settings.
func (r *reader) modes() {
	if r.has("NEAR_LIMIT_RATIO") {
		v := r.vars["NEAR_LIMIT_RATIO"]
		f, err := strconv.ParseFloat(v, 32)
		if err != nil || !(f >= 0 && f <= 1) { // NaN too
			r.fail("NEAR_LIMIT_RATIO", "want a number from 0 to 1")
		} else {
			r.set("near-limit-ratio", strconv.FormatFloat(f, 'g', -1, 32), "NEAR_LIMIT_RATIO")
		}
	}
	for _, m := range []struct{ name, flag string }{{"SHADOW_MODE", "shadow-mode"}, {"QUOTA_MODE", "quota-mode"}} {
		if r.has(m.name) {
			r.set(m.flag, strconv.FormatBool(r.boolean(m.name, false)), m.name)
		}
	}
}

// clientCA sets --grpc-tls-client-ca, the CA that client certificates must be signed by
// (clients without one are refused), from GRPC_CLIENT_TLS_CACERT, envoyproxy/ratelimit's name,
// or GRPC_SERVER_TLS_CA_CERT, the name Envoy Gateway sets (envoyproxy/ratelimit does not read
// it, and so verifies no client certificate there). When both are set to different files,
// GRPC_CLIENT_TLS_CACERT wins: it is the one envoyproxy/ratelimit itself reads, so an
// environment written for it keeps verifying against the CA it named.
func (r *reader) clientCA() {
	own, haveOwn := r.get("GRPC_CLIENT_TLS_CACERT")
	eg, haveEG := r.get("GRPC_SERVER_TLS_CA_CERT")
	switch {
	case haveOwn && haveEG && own != eg:
		r.set("grpc-tls-client-ca", own, "GRPC_CLIENT_TLS_CACERT")
		r.notice("GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_CACERT is set too, to another file, and wins: client certificates are verified against %s, not this", own)
	case haveOwn || haveEG:
		r.set("grpc-tls-client-ca", cmp.Or(own, eg), "GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT")
	}
}

func (r *reader) grpcTLS() {
	if r.boolean("GRPC_SERVER_USE_TLS", false) {
		r.accounted["GRPC_SERVER_USE_TLS"] = true
		if !r.has("GRPC_SERVER_TLS_CERT") || !r.has("GRPC_SERVER_TLS_KEY") {
			r.fail("GRPC_SERVER_USE_TLS", "needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
			return
		}
		r.set("grpc-tls-cert", r.vars["GRPC_SERVER_TLS_CERT"], "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT")
		r.set("grpc-tls-key", r.vars["GRPC_SERVER_TLS_KEY"], "GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_KEY")
		r.clientCA()
		if v, ok := r.get("GRPC_CLIENT_TLS_SAN"); ok {
			if !r.has("GRPC_CLIENT_TLS_CACERT") && !r.has("GRPC_SERVER_TLS_CA_CERT") {
				r.notice("GRPC_CLIENT_TLS_SAN", "neither GRPC_CLIENT_TLS_CACERT nor GRPC_SERVER_TLS_CA_CERT is set, so client certificates are not asked for and this is not used, as in envoyproxy/ratelimit")
			} else {
				r.set("grpc-tls-client-san", v, "GRPC_CLIENT_TLS_SAN")
			}
		}
	} else {
		r.accounted["GRPC_SERVER_USE_TLS"] = true
		r.noticeAll("GRPC_SERVER_USE_TLS is not true: gRPC is served in plaintext and this is not used, as in envoyproxy/ratelimit",
			"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN", "GRPC_SERVER_TLS_CA_CERT")
	}
	age := r.duration("GRPC_MAX_CONNECTION_AGE", 24*time.Hour)
	grace := r.duration("GRPC_MAX_CONNECTION_AGE_GRACE", time.Hour)
	r.set("grpc-max-connection-age", age.String(), "GRPC_MAX_CONNECTION_AGE")
	r.set("grpc-max-connection-age-grace", grace.String(), "GRPC_MAX_CONNECTION_AGE_GRACE")
}

var statsdVars = []string{
	"USE_STATSD", "STATSD_HOST", "STATSD_PORT", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS",
	"EXTRA_TAGS", "STATS_FLUSH_INTERVAL",
}

// metrics translates where envoyproxy/ratelimit's counters go: its Prometheus listener with
// USE_PROMETHEUS (rls's own metrics there too, and its series as the default mapper names them),
// statsd with USE_STATSD (its default, but beside USE_PROMETHEUS, which envoyproxy/ratelimit
// refuses to start with) or DogStatsD with USE_DOG_STATSD; none with DISABLE_STATS.
func (r *reader) metrics() {
	disabled := r.boolean("DISABLE_STATS", false)
	if !disabled {
		r.notice("DISABLE_STATS", "false: envoyproxy/ratelimit's counters go where USE_STATSD, USE_DOG_STATSD and USE_PROMETHEUS say, as in envoyproxy/ratelimit")
	}
	prom := r.boolean("USE_PROMETHEUS", false)
	if prom {
		addr := r.str("PROMETHEUS_ADDR", ":9090")
		if _, _, err := net.SplitHostPort(addr); err != nil {
			r.fail("PROMETHEUS_ADDR", "want [host]:port")
		} else {
			r.set("metrics-addr", addr, "USE_PROMETHEUS", "PROMETHEUS_ADDR")
		}
		p := r.str("PROMETHEUS_PATH", "/metrics")
		if !strings.HasPrefix(p, "/") {
			r.fail("PROMETHEUS_PATH", "want a path starting with /")
		} else {
			r.set("metrics-path", p, "PROMETHEUS_PATH")
		}
		if !disabled {
			r.set("ratelimit-metrics", "true", "USE_PROMETHEUS")
		}
	} else {
		r.accounted["USE_PROMETHEUS"] = true
		r.noticeAll("USE_PROMETHEUS is not true: no separate metrics listener; rls serves Prometheus metrics on --http-addr at /metrics anyway",
			"PROMETHEUS_ADDR", "PROMETHEUS_PATH")
	}
	plain := r.boolean("USE_STATSD", !prom)
	dog := r.boolean("USE_DOG_STATSD", false)
	switch {
	case disabled:
		r.note("DISABLE_STATS", "rls sends no statsd and serves none of envoyproxy/ratelimit's series; its own metrics stay on --http-addr at /metrics")
		r.noticeAll("DISABLE_STATS is true: not used", statsdVars...)
	case plain || dog:
		host := r.str("STATSD_HOST", "localhost")
		port := r.integer("STATSD_PORT", 8125, 1, 65535)
		r.set("statsd-addr", net.JoinHostPort(strings.Trim(host, "[]"), strconv.FormatInt(port, 10)), "USE_STATSD", "USE_DOG_STATSD", "STATSD_HOST", "STATSD_PORT")
		if r.has("USE_STATSD") && plain && !dog {
			r.note("USE_STATSD", "rls sends statsd over UDP, where envoyproxy/ratelimit's statsd sink uses TCP: statsd_exporter and most statsd servers take both on the same port")
		}
		if d := r.duration("STATS_FLUSH_INTERVAL", 10*time.Second); d > 0 {
			r.set("statsd-flush-interval", d.String(), "STATS_FLUSH_INTERVAL")
		} else {
			r.fail("STATS_FLUSH_INTERVAL", "want a duration above 0")
		}
		if v, ok := r.get("EXTRA_TAGS"); ok {
			if tags, ok := envconfigMap(v); ok {
				r.set("statsd-tags", tags, "EXTRA_TAGS")
			} else {
				r.fail("EXTRA_TAGS", "want name:value,name:value")
			}
		}
		if dog {
			r.set("statsd-dogstatsd", "true", "USE_DOG_STATSD")
			r.mogrifiers()
		} else {
			r.noticeAll("USE_DOG_STATSD is not true: not used, as in envoyproxy/ratelimit", "USE_DOG_STATSD_MOGRIFIERS")
		}
	default:
		r.noticeAll("USE_STATSD and USE_DOG_STATSD are not true: rls sends no statsd, as envoyproxy/ratelimit", statsdVars...)
	}
	for _, k := range r.present {
		if strings.HasPrefix(k, mogrifierPrefix) {
			r.notice(k, "not a mogrifier USE_DOG_STATSD_MOGRIFIERS names with USE_DOG_STATSD=true: not used, as in envoyproxy/ratelimit")
		}
	}
	r.notice("PROMETHEUS_MAPPER_YAML", "rls serves envoyproxy/ratelimit's series as its default mapper names them "+
		"(ratelimit_service_rate_limit_total_hits{domain,key1,key2}, ...); this file is not read")
	r.notice("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "rls's durations are histograms in seconds, as Prometheus names them (rls_backend_request_duration_seconds)")
}

// mogrifiers translates USE_DOG_STATSD_MOGRIFIERS and each named mogrifier's
// DOG_STATSD_MOGRIFIER_<NAME>_PATTERN, _NAME and _TAGS into --statsd-mogrifiers' JSON.
func (r *reader) mogrifiers() {
	v, ok := r.get("USE_DOG_STATSD_MOGRIFIERS")
	if !ok {
		return
	}
	type mog struct {
		Pattern string            `json:"pattern"`
		Name    string            `json:"name"`
		Tags    map[string]string `json:"tags,omitempty"`
	}
	var ms []mog
	from := []string{"USE_DOG_STATSD_MOGRIFIERS"}
	for _, name := range strings.Split(v, ",") {
		name = strings.ToUpper(strings.TrimSpace(name))
		if name == "" {
			continue
		}
		pre := mogrifierPrefix + name + "_"
		m := mog{Pattern: r.str(pre+"PATTERN", ""), Name: r.str(pre+"NAME", "")}
		if m.Pattern == "" || m.Name == "" {
			r.fail("USE_DOG_STATSD_MOGRIFIERS", fmt.Sprintf("mogrifier %s needs %sPATTERN and %sNAME", name, pre, pre))
			continue
		}
		if _, err := regexp.Compile(m.Pattern); err != nil {
			r.fail(pre+"PATTERN", "want a regular expression: "+err.Error())
			continue
		}
		if t, ok := r.get(pre + "TAGS"); ok {
			m.Tags = map[string]string{}
			for _, item := range strings.Split(t, ",") {
				k, val, ok := strings.Cut(item, ":")
				if !ok || k == "" || val == "" {
					r.fail(pre+"TAGS", "want name:value,name:value")
					break
				}
				m.Tags[k] = val
			}
		}
		ms = append(ms, m)
		from = append(from, pre+"PATTERN", pre+"NAME", pre+"TAGS")
	}
	if len(ms) == 0 {
		return
	}
	b, _ := json.Marshal(ms)
	r.set("statsd-mogrifiers", string(b), from...)
}

// envconfigMap checks envconfig's map syntax, name:value,name:value, and returns it as given.
func envconfigMap(v string) (string, bool) {
	for _, item := range strings.Split(v, ",") {
		if k, _, ok := strings.Cut(item, ":"); !ok || k == "" {
			return "", false
		}
	}
	return v, true
}

func (r *reader) headers() {
	names := []struct{ name, flag string }{
		{"LIMIT_LIMIT_HEADER", "response-header-limit"},
		{"LIMIT_REMAINING_HEADER", "response-header-remaining"},
		{"LIMIT_RESET_HEADER", "response-header-reset"},
	}
	if !r.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		r.accounted["LIMIT_RESPONSE_HEADERS_ENABLED"] = true
		for _, n := range names {
			r.notice(n.name, "LIMIT_RESPONSE_HEADERS_ENABLED is not true: rls adds no headers and this is not used, as in envoyproxy/ratelimit")
		}
		return
	}
	r.set("response-headers", "legacy", "LIMIT_RESPONSE_HEADERS_ENABLED")
	for _, n := range names {
		if v, ok := r.get(n.name); ok {
			if !token(v) {
				r.fail(n.name, "want an HTTP header name")
				continue
			}
			r.set(n.flag, v, n.name)
		}
	}
}

// token says whether s is an HTTP header name (RFC 9110's token).
func token(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// unsupported notices the settings rls has nothing for.
func (r *reader) unsupported() {
	r.notice("RESPONSE_DYNAMIC_METADATA", "rls does not copy the request into the response's dynamic_metadata; "+
		"it sets a rule's metadata there, under metadata, when its descriptor passes, and quotaModeEnabled and quotaModeViolations")
	r.noticeAll("rls reads the standard OpenTelemetry variables instead: tracing is on with OTEL_EXPORTER_OTLP_ENDPOINT set "+
		"(OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf or grpc, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER=traceidratio with OTEL_TRACES_SAMPLER_ARG)",
		"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
		"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE")
}

// Display is s.Value with passwords and header values replaced by xxx, for logs.
func (s Setting) Display() string {
	switch s.Flag {
	case "redis-url":
		return redactURL(s.Value)
	case "xds-header":
		items := strings.Split(s.Value, ",")
		for i, it := range items {
			if k, _, ok := strings.Cut(it, "="); ok {
				items[i] = k + "=xxx"
			}
		}
		return strings.Join(items, ",")
	}
	return s.Value
}

// redactURL hides the passwords of a Redis URL, or of a host list with user info.
func redactURL(s string) string { return redisbackend.RedactURL(s) }
