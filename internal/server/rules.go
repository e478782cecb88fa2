package server

import (
	_ "embed"
	"strings"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

//go:embed default_rules.yaml
var defaultRules []byte

const defaultRulesName = "embedded:default_rules.yaml"

// LoadRules loads rule files: path, or the embedded example rules when path is empty.
func LoadRules(path string, opts descriptors.Options) (*descriptors.RuleSet, error) {
	if path == "" {
		return descriptors.ParseWith(map[string][]byte{defaultRulesName: defaultRules}, opts)
	}
	return descriptors.LoadWith(path, opts)
}

// initialRules are the rules rls starts with: the files', or with --xds-server none yet (nil),
// or an empty set with --start-without-rules.
func (c Config) initialRules() (*descriptors.RuleSet, error) {
	if !c.fromXDS() {
		return LoadRules(c.Rules.Path, c.rulesOptions())
	}
	if c.Rules.StartWithoutRules {
		return descriptors.Parse(nil)
	}
	return nil, nil
}

func rulesSource(c Config) string {
	switch {
	case c.fromXDS():
		return "xds " + c.XDS.Server + " node " + c.XDS.NodeID
	case c.Rules.Path == "":
		return strings.TrimPrefix(defaultRulesName, "embedded:") + " (embedded)"
	}
	return c.Rules.Path
}

// applyRules loads the rule files again and swaps them in, whole or not at all.
func (s *Server) applyRules() error {
	return s.swapRules(LoadRules(s.cfg.Rules.Path, s.cfg.rulesOptions()))
}

// swapRules puts rs in force, or with err keeps the rules in force and returns err: the one
// end of every reload, from files or xDS.
func (s *Server) swapRules(rs *descriptors.RuleSet, err error) error {
	if err != nil {
		s.svc.RulesRejected()
		s.log.Error("rules rejected; the running rules stay in force", "rules", rulesSource(s.cfg), "err", err)
		return err
	}
	s.svc.SetRules(rs)
	// A cached denial was computed under the old limits; state itself is clamped per key.
	if p, ok := s.be.(backend.CachePurger); ok {
		p.PurgeCache()
	}
	if s.ready != nil {
		s.ready.rulesLoaded()
	}
	gen, _ := s.svc.Generation()
	s.log.Info("rules loaded", "rules", rulesSource(s.cfg), "generation", gen, "domains", len(rs.Domains), "files", len(rs.Files))
	return nil
}
