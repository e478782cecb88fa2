package main

import (
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// decisionLogFlags registers the decision log's flags (server.DecisionLogConfig).
func decisionLogFlags(fs *flag.FlagSet, c *server.DecisionLogConfig) {
	fs.StringVar(&c.Path, "decision-log", c.Path, "write the decision log, a JSON line per denied descriptor (throttled per key), to this file, appended to, or - for stdout (empty: none); rls replay reads it")
	fs.StringVar(&c.Rules, "decision-log-rules", c.Rules, "--decision-log: also log the admitted decisions of these rules, comma-separated: DOMAIN/PATH (a rule's path as /debug/rules shows it), DOMAIN (its every rule) or *")
	fs.Int64Var(&c.Sample, "decision-log-sample", c.Sample, "--decision-log-rules: log one in this many admitted decisions (0 or 1: every one); denials are never sampled")
	fs.DurationVar(&c.Interval, "decision-log-interval", c.Interval, "--decision-log: one line per key (domain, rule, descriptor, code) per interval, and one with how many followed it (0: every decision)")
	fs.IntVar(&c.MaxKeys, "decision-log-max-keys", c.MaxKeys, "--decision-log: keys the per-key throttle holds; a new key past it ends the interval early, writing the counts held (0: 10000)")
}
