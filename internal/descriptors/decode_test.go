package descriptors

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rls-project/rls/api"
)

// TestEveryAPIFieldDecoded sets each yaml key of package api's types, one at a time, in a rule
// file, and fails naming a key that the decoder of its mapping has no case for or that is not
// a known key at all: adding a field to api is the one edit the format needs, or this fails.
func TestEveryAPIFieldDecoded(t *testing.T) {
	types := []struct {
		typ  reflect.Type
		file func(key string) string // a rule file with key set to null in a mapping of typ
	}{
		{reflect.TypeFor[api.RuleFile](), func(k string) string {
			return "domain: d\n" + k + ": null\n"
		}},
		{reflect.TypeFor[api.Descriptor](), func(k string) string {
			return "domain: d\ndescriptors:\n  - key: k\n    " + k + ": null\n"
		}},
		{reflect.TypeFor[api.RateLimit](), func(k string) string {
			return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      " + k + ": null\n"
		}},
		{reflect.TypeFor[api.Concurrency](), func(k string) string {
			return "domain: d\ndescriptors:\n  - key: k\n    concurrency:\n      " + k + ": null\n"
		}},
		{reflect.TypeFor[api.Replace](), func(k string) string {
			return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - " + k + ": null\n"
		}},
	}
	for _, tc := range types {
		if tc.typ.NumField() > 64 {
			t.Errorf("api.%s has %d fields: a mapping tracks at most 64 keys", tc.typ.Name(), tc.typ.NumField())
		}
		for i := range tc.typ.NumField() {
			f := tc.typ.Field(i)
			key, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if key == "" || key == "-" {
				t.Errorf("api.%s.%s has no yaml key", tc.typ.Name(), f.Name)
				continue
			}
			if key == "domain" {
				continue // set in every file here
			}
			_, err := Parse(map[string][]byte{"f.yaml": []byte(tc.file(key))})
			for _, e := range unwrapAll(err) {
				if msg := e.Error(); strings.Contains(msg, "not decoded") || strings.Contains(msg, "unknown key") {
					t.Errorf("api.%s.%s (%s): %s", tc.typ.Name(), f.Name, key, msg)
				}
			}
		}
	}
}

// TestUndecodedKeyReported: a key of api that a decoder has no case for is an error naming it,
// not a value dropped in silence.
func TestUndecodedKeyReported(t *testing.T) {
	saved := descriptorFields
	descriptorFields = append(slices.Clip(descriptorFields), "new_field")
	defer func() { descriptorFields = saved }()
	_, err := Parse(map[string][]byte{"f.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    new_field: 1\n")})
	if err == nil || !strings.Contains(err.Error(), "f.yaml:4: key new_field in Descriptor is in package api but not decoded") {
		t.Errorf("got %v", err)
	}
}

func unwrapAll(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unwrapAll(e)...)
		}
		return out
	}
	return []error{err}
}
