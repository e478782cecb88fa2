package xds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/internal/descriptors"
)

// Rules builds a rule set from a snapshot's RateLimitConfigs. Each becomes a rule file named
// "xds:<name>" in envoyproxy/ratelimit's format, loaded by the same loader as files on disk, so
// that its checks and error messages (file:line, the descriptor's path) are the same. The file
// is written as indented JSON, which is YAML too: encoding/json writes it several times faster
// than a YAML encoder, with one field per line for the loader's line numbers.
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
		data, err := json.MarshalIndent(ruleFile{Domain: c.GetDomain(), Descriptors: toDescriptors(c.GetDescriptors())}, "", " ")
		if err != nil {
			return nil, fmt.Errorf("%s: %v", name, err)
		}
		files[name] = yamlSafe(data)
	}
	return descriptors.ParseWith(files, opts)
}

// yamlSafe escapes, in JSON text, the characters JSON writes as they are but YAML does not
// allow unescaped: DEL, the C1 controls (U+0085 among them, which YAML may read as a line
// break) and U+FFFE, U+FFFF. Outside strings JSON is printable ASCII, so they are in strings,
// where \uXXXX means the same to both.
func yamlSafe(data []byte) []byte {
	if !bytes.ContainsFunc(data, notYAMLPrintable) {
		return data
	}
	out := make([]byte, 0, len(data)+16)
	for _, r := range string(data) {
		if notYAMLPrintable(r) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out
}

func notYAMLPrintable(r rune) bool {
	return (r >= 0x7f && r <= 0x9f) || r == 0xfffe || r == 0xffff
}

// The rule format, as much of it as RateLimitConfig carries; empty fields are left out. Each
// field is package api's field of the same name, its JSON name api's yaml key
// (TestRuleFieldsMatchAPI holds them equal).
type ruleFile struct {
	Domain      string       `json:"domain"`
	Descriptors []descriptor `json:"descriptors"`
}

type descriptor struct {
	Key            string         `json:"key"`
	Value          string         `json:"value,omitempty"`
	RateLimit      *rateLimit     `json:"rate_limit,omitempty"`
	Descriptors    []descriptor   `json:"descriptors,omitempty"`
	ShadowMode     bool           `json:"shadow_mode,omitempty"`
	QuotaMode      bool           `json:"quota_mode,omitempty"`
	DetailedMetric bool           `json:"detailed_metric,omitempty"`
	Metadata       map[string]any `json:"metadata,omitempty"`
}

type rateLimit struct {
	Unit            string    `json:"unit,omitempty"`
	RequestsPerUnit *uint32   `json:"requests_per_unit,omitempty"`
	Unlimited       bool      `json:"unlimited,omitempty"`
	Name            string    `json:"name,omitempty"`
	Replaces        []replace `json:"replaces,omitempty"`
}

type replace struct {
	Name string `json:"name"`
}

func toDescriptors(ds []*rlconfv3.RateLimitDescriptor) []descriptor {
	out := make([]descriptor, 0, len(ds))
	for _, d := range ds {
		out = append(out, descriptor{
			Key: d.GetKey(), Value: d.GetValue(), RateLimit: toRateLimit(d.GetRateLimit()),
			Descriptors: toDescriptors(d.GetDescriptors()), ShadowMode: d.GetShadowMode(),
			QuotaMode: d.GetQuotaMode(), DetailedMetric: d.GetDetailedMetric(),
			Metadata: toMetadata(d.GetMetadata()),
		})
	}
	return out
}

// toMetadata is a descriptor's metadata as the rule format holds it (nil when it has none):
// the Struct's JSON form, which the loader reads back into the same values.
func toMetadata(m *structpb.Struct) map[string]any {
	if len(m.GetFields()) == 0 {
		return nil
	}
	return m.AsMap()
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
