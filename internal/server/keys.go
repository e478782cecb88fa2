package server

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/service"
)

// loadAdminToken reads the admin token of the key endpoints (/v1/keys on --http-addr) from
// path, when one is given: one line, surrounding white space dropped. Without one, resetting
// keys is off (nil).
func loadAdminToken(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	token := bytes.TrimSpace(b)
	if len(token) < 16 {
		return nil, fmt.Errorf("--admin-token-file %s: the token must be at least 16 bytes", path)
	}
	return token, nil
}

// mountKeys adds /v1/keys, wrapped by guard, to mux and returns it; token nil turns resetting off.
func mountKeys(mux *http.ServeMux, svc *service.Service, token []byte, log *slog.Logger, warn *logthrottle.Throttle, guard func(http.Handler) http.Handler) *http.ServeMux {
	mux.Handle("/v1/keys", guard(svc.KeysHandler(service.KeysOptions{AdminToken: token, Logger: log, Warnings: warn})))
	return mux
}
