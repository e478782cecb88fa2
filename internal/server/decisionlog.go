package server

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rls-project/rls/internal/decisionlog"
)

// DecisionLogConfig is the decision log (--decision-log*; docs/replay.md).
type DecisionLogConfig struct {
	Path     string        // --decision-log: a file appended to, "-" for stdout; "": no log
	Rules    string        // --decision-log-rules: rules whose every decision is logged, comma-separated
	Sample   int64         // --decision-log-sample: one in this many of those rules' admitted decisions
	Interval time.Duration // --decision-log-interval: per key
	MaxKeys  int           // --decision-log-max-keys: keys the throttle holds
}

func (d DecisionLogConfig) validate() error {
	var err error
	if d.Sample < 0 || d.Interval < 0 || d.MaxKeys < 0 {
		err = errors.New("--decision-log-sample, --decision-log-interval and --decision-log-max-keys must be ≥ 0")
	}
	if e := decisionlog.ParseRules(d.rules()); e != nil {
		err = errors.Join(err, fmt.Errorf("--decision-log-rules: %w", e))
	}
	if d.Path == "" && (d.Rules != "" || d.Sample > 1) {
		err = errors.Join(err, errors.New("--decision-log-rules and --decision-log-sample need --decision-log"))
	}
	return err
}

// rules are the names of --decision-log-rules.
func (d DecisionLogConfig) rules() []string {
	var names []string
	for _, n := range strings.Split(d.Rules, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	return names
}

// openDecisionLog opens the decision log when --decision-log names one; nil otherwise.
func (s *Server) openDecisionLog() error {
	d := s.cfg.DecisionLog
	if d.Path == "" {
		return nil
	}
	var w io.Writer = os.Stdout
	if d.Path != "-" {
		f, err := os.OpenFile(d.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return fmt.Errorf("--decision-log: %w", err)
		}
		s.decisionFile = f
		w = f
	}
	var err error
	s.decisions, err = decisionlog.New(w, decisionlog.Options{
		Interval: d.Interval, MaxKeys: d.MaxKeys, Rules: d.rules(), Sample: d.Sample,
	})
	return err
}

// closeDecisionLog writes what the decision log holds and closes its file.
func (s *Server) closeDecisionLog() {
	if s.decisions != nil {
		if err := s.decisions.Close(); err != nil {
			s.log.Warn("decision log: writing failed", "error", err)
		}
	}
	if s.decisionFile != nil {
		s.decisionFile.Close()
	}
}
