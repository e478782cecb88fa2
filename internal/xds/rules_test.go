package xds

import (
	"reflect"
	"strings"
	"testing"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/api"
	"github.com/rls-project/rls/internal/descriptors"
)

// TestRuleFieldsMatchAPI holds the rule format Rules writes to package api's: each field of
// these structs is a field of api's struct of the same name whose yaml key is its JSON name, of
// the same kind, so that the loader reads what xDS sends under the key api names.
func TestRuleFieldsMatchAPI(t *testing.T) {
	pairs := []struct{ xds, api reflect.Type }{
		{reflect.TypeFor[ruleFile](), reflect.TypeFor[api.RuleFile]()},
		{reflect.TypeFor[descriptor](), reflect.TypeFor[api.Descriptor]()},
		{reflect.TypeFor[rateLimit](), reflect.TypeFor[api.RateLimit]()},
		{reflect.TypeFor[replace](), reflect.TypeFor[api.Replace]()},
	}
	for _, p := range pairs {
		for i := range p.xds.NumField() {
			f := p.xds.Field(i)
			jsonKey, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			af, ok := p.api.FieldByName(f.Name)
			if !ok {
				t.Errorf("xds %s.%s: api.%s has no field %s", p.xds.Name(), f.Name, p.api.Name(), f.Name)
				continue
			}
			if yamlKey, _, _ := strings.Cut(af.Tag.Get("yaml"), ","); yamlKey != jsonKey {
				t.Errorf("xds %s.%s: JSON key %q, api.%s.%s's yaml key %q", p.xds.Name(), f.Name, jsonKey, p.api.Name(), f.Name, yamlKey)
			}
			if kind(f.Type) != kind(af.Type) {
				t.Errorf("xds %s.%s: a %s, api.%s.%s a %s", p.xds.Name(), f.Name, kind(f.Type), p.api.Name(), f.Name, kind(af.Type))
			}
		}
	}
}

// kind is t's kind through pointers, so that *uint32 (set or not) matches uint32.
func kind(t reflect.Type) reflect.Kind {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind()
}

// TestQuotaModeAndMetadataCarried: a RateLimitConfig's quota_mode and metadata, which Envoy AI
// Gateway and envoyproxy/ratelimit's xDS server set, reach the rule as a rule file's would.
func TestQuotaModeAndMetadataCarried(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"service_with_quota": map[string]any{"name": "service_1"}, "weight": 2.5})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Rules([]*rlconfv3.RateLimitConfig{{Name: "q", Domain: "ai-gateway-quota", Descriptors: []*rlconfv3.RateLimitDescriptor{{
		Key: "backend_name", Value: "default/openai",
		Descriptors: []*rlconfv3.RateLimitDescriptor{{
			Key: "model_name_override", Value: "gpt-4", QuotaMode: true, Metadata: meta,
			RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1000},
		}, {
			Key: "model_name_override", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 10},
		}},
	}}}}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Match("ai-gateway-quota", []descriptors.Entry{{Key: "backend_name", Value: "default/openai"}, {Key: "model_name_override", Value: "gpt-4"}})
	if r == nil || !r.QuotaMode || !reflect.DeepEqual(r.Metadata, meta.AsMap()) {
		t.Fatalf("gpt-4: %+v, want quota mode and metadata %v", r, meta.AsMap())
	}
	r = rs.Match("ai-gateway-quota", []descriptors.Entry{{Key: "backend_name", Value: "default/openai"}, {Key: "model_name_override", Value: "other"}})
	if r == nil || r.QuotaMode || r.Metadata != nil {
		t.Fatalf("other model: %+v, want neither", r)
	}
}
