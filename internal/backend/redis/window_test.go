package redis

import (
	"testing"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
)

// TestClocked runs the cases of the window algorithms at instants the test sets (the script
// decides at the instant given instead of Redis TIME), on a single node, across Cluster slots,
// and with the local over-limit cache, whose denials must hold until their instant under every
// algorithm.
func TestClocked(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"cluster", clusterEnv, Options{}},
		{"single with local cache", singleEnv, Options{LocalCacheSize: 100}},
		{"cluster coalesced", clusterEnv, Options{Coalesce: 16}},
		{"single coalesced", singleEnv, Options{Coalesce: 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backendtest.RunClocked(t, func(t *testing.T, clock *backendtest.Clock) backend.Backend {
				opts := tc.opts
				opts.Now = clock.Now
				b := newTestBackend(t, tc.env, opts)
				b.scriptNow = clock.Micros
				return b
			})
		})
	}
}
