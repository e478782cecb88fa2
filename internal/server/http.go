package server

import (
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rls-project/rls/internal/ratelimitenv"
	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/top"
)

// HTTPLimits bound what one HTTP connection may hold: a client that sends slowly, reads
// slowly or sits idle is cut off instead of keeping its file descriptor (and a goroutine)
// for ever, which with enough of them would starve new gRPC connections.
type HTTPLimits struct {
	ReadHeaderTimeout time.Duration // --http-read-header-timeout
	ReadTimeout       time.Duration // --http-read-timeout
	WriteTimeout      time.Duration // --http-write-timeout
	IdleTimeout       time.Duration // --http-idle-timeout
	MaxHeaderBytes    int           // --http-max-header-bytes
}

// The defaults leave room for every request rls serves: headers of a few hundred bytes, bodies
// (POST /json) of a few kilobytes, and /metrics, the largest answer, written within seconds.
const (
	defaultHTTPReadHeaderTimeout = 5 * time.Second
	defaultHTTPReadTimeout       = 10 * time.Second
	defaultHTTPWriteTimeout      = 30 * time.Second
	defaultHTTPIdleTimeout       = 60 * time.Second
	defaultHTTPMaxHeaderBytes    = 64 << 10
)

// server returns an http.Server for h under these limits.
func (l HTTPLimits) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// mainMux is the HTTP listener's (--http-addr): probes, metrics, POST /json and /v1/keys (a
// descriptor's state; its reset only with --admin-token-file). It shows no rules. guard wraps the
// endpoints that ask about limits (/json, /v1/keys): see requireClientCert.
func mainMux(svc *service.Service, ready *readiness, g prometheus.Gatherer, reg prometheus.Registerer, guard func(http.Handler) http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("GET /readyz", ready)
	mux.HandleFunc("GET /healthcheck", ready.healthcheck) // envoyproxy/ratelimit's readiness path
	mux.Handle("/json", guard(svc.JSONHandler()))
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// debugMux is the debug listener's (--debug-addr): the rules in force, any key's state, the
// top talkers (nil: off) and with --debug Go's profiler.
func debugMux(svc *service.Service, quotas *rlqs.Server, talkers *top.Top, pprofOn bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /debug/top", talkers.Handler())
	mux.Handle("GET /debug/top.html", top.PageHandler())
	mountRLQS(mux, quotas)
	mux.Handle("GET /debug/rules", svc.RulesHandler())
	mux.Handle("GET /rlconfig", svc.RLConfigHandler()) // envoyproxy/ratelimit's rule dump
	mux.Handle("/debug/explain", svc.ExplainHandler())
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// debugServer is the debug listener's server: the main listener's limits except the write
// timeout, since a CPU profile or an execution trace takes as long as it is asked to
// (/debug/pprof/profile?seconds=30). It is on loopback unless told otherwise.
func (l HTTPLimits) debugServer(h http.Handler) *http.Server {
	s := l.server(h)
	s.WriteTimeout = 0
	return s
}

// cmdline serves /debug/pprof/cmdline as net/http/pprof does (the arguments, NUL-separated), but
// with the values of flags that may hold secrets hidden as rls's logs hide them: the password
// of --redis-url, the values of --xds-header.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, strings.Join(redactArgs(os.Args), "\x00"))
}

// redactArgs returns args with the values of secret-bearing flags hidden, in either form
// (--flag value, --flag=value, with one dash or two).
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	hideNext := ""
	for i, a := range args {
		if hideNext != "" {
			out[i] = ratelimitenv.Setting{Flag: hideNext, Value: a}.Display()
			hideNext = ""
			continue
		}
		out[i] = a
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !secretFlags[name] {
			continue
		}
		if hasValue {
			out[i] = a[:len(a)-len(value)] + ratelimitenv.Setting{Flag: name, Value: value}.Display()
		} else {
			hideNext = name
		}
	}
	return out
}

// secretFlags are the flags whose values may hold a secret.
var secretFlags = map[string]bool{"redis-url": true, "xds-header": true}
