package xds

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rls-project/rls/api"
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
