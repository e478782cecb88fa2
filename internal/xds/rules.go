package xds

import (
	"fmt"
	"strings"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/descriptors"
)

// Rules builds a rule set from a snapshot's RateLimitConfigs. Each becomes a rule file named
// "xds:<name>" in envoyproxy/ratelimit's YAML format, loaded by the same loader as files on
// disk, so that its checks and error messages (file:line, the descriptor's path) are the same.
func Rules(configs []*rlconfv3.RateLimitConfig, opts descriptors.Options) (*descriptors.RuleSet, error) {
	files := make(map[string][]byte, len(configs))
	for i, c := range configs {
		name := "xds:" + c.GetName()
		if c.GetName() == "" {
			name = fmt.Sprintf("xds:#%d", i+1)
		}
		if _, dup := files[name]; dup {
			return nil, fmt.Errorf("%s: two RateLimitConfigs have this name", name)
		}
		data, err := yaml.Marshal(ruleFile{Domain: c.GetDomain(), Descriptors: toDescriptors(c.GetDescriptors())})
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		files[name] = data
	}
	return descriptors.ParseWith(files, opts)
}

// The YAML rule format, as much of it as RateLimitConfig carries; empty fields are left out.
type ruleFile struct {
	Domain      string       `yaml:"domain"`
	Descriptors []descriptor `yaml:"descriptors"`
}

type descriptor struct {
	Key            string       `yaml:"key"`
	Value          string       `yaml:"value,omitempty"`
	RateLimit      *rateLimit   `yaml:"rate_limit,omitempty"`
	Descriptors    []descriptor `yaml:"descriptors,omitempty"`
	ShadowMode     bool         `yaml:"shadow_mode,omitempty"`
	DetailedMetric bool         `yaml:"detailed_metric,omitempty"`
}

type rateLimit struct {
	Unit            string    `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32   `yaml:"requests_per_unit,omitempty"`
	Unlimited       bool      `yaml:"unlimited,omitempty"`
	Name            string    `yaml:"name,omitempty"`
	Replaces        []replace `yaml:"replaces,omitempty"`
}

type replace struct {
	Name string `yaml:"name"`
}

func toDescriptors(ds []*rlconfv3.RateLimitDescriptor) []descriptor {
	out := make([]descriptor, 0, len(ds))
	for _, d := range ds {
		out = append(out, descriptor{
			Key: d.GetKey(), Value: d.GetValue(), RateLimit: toRateLimit(d.GetRateLimit()),
			Descriptors: toDescriptors(d.GetDescriptors()), ShadowMode: d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
		})
	}
	return out
}

func toRateLimit(p *rlconfv3.RateLimitPolicy) *rateLimit {
	if p == nil {
		return nil
	}
	rl := &rateLimit{Unlimited: p.GetUnlimited(), Name: p.GetName()}
	if !p.GetUnlimited() {
		// UNKNOWN stays "unknown", which the loader rejects with the descriptor's path.
		rl.Unit = strings.ToLower(p.GetUnit().String())
		n := p.GetRequestsPerUnit()
		rl.RequestsPerUnit = &n
	}
	for _, r := range p.GetReplaces() {
		rl.Replaces = append(rl.Replaces, replace{Name: r.GetName()})
	}
	return rl
}
