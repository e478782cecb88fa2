package server

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Log says, once at start, what envoyproxy/ratelimit's environment changed and
// what of it rls does not do as asked.
func (r RatelimitEnv) Log(log *slog.Logger) {
	if len(r.Result.Present) == 0 {
		return
	}
	log.Info("envoyproxy/ratelimit environment found; reading it (--ratelimit-env=false ignores it)", "variables", strings.Join(r.Result.Present, ","))
	for _, st := range r.Applied {
		log.Info("envoyproxy/ratelimit setting", "flag", "--"+st.Flag, "value", st.Display(), "from", st.From)
	}
	for _, st := range r.Overridden {
		log.Info("envoyproxy/ratelimit setting overridden by rls's own", "flag", "--"+st.Flag, "from", st.From)
	}
	for _, n := range r.Result.Notices {
		log.Warn("envoyproxy/ratelimit setting not applied as given", "variable", n.Var, "instead", n.Text)
	}
}

// newLogger is the logger of lc, writing to w.
func newLogger(lc LogConfig, w io.Writer) (*slog.Logger, error) {
	l, err := lc.level()
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: l}
	switch lc.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", lc.Format)
}
