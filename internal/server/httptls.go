package server

import (
	"context"
	"net/http"

	"github.com/rls-project/rls/internal/policy"
)

// httpCallerKey is the context key of the names of an HTTP caller's verified client
// certificate (see requireClientCert).
type httpCallerKey struct{}

// requireClientCert guards the HTTP endpoints that ask about limits (/json, /v1/keys) when the
// HTTP listener verifies client certificates (--http-tls-client-ca): a request whose connection
// presented no certificate verified against that CA is refused (401), and one that did carries
// the certificate's names to the caller policy, as a gRPC caller's do. The listener asks for a
// certificate without requiring one, so that probes and scrapes (/healthz, /readyz, /metrics),
// which kubelets and Prometheus send without one, still reach it.
func requireClientCert(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			http.Error(w, "a client certificate signed by --http-tls-client-ca is required", http.StatusUnauthorized)
			return
		}
		ids := policy.Identities(r.TLS.VerifiedChains[0][0])
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpCallerKey{}, ids)))
	})
}
