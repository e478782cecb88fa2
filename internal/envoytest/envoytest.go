// Package envoytest reads the Envoy bootstraps under deploy/envoy as Envoy would, for the tests
// that check them (deploy) and the tests that play Envoy against the real rls (integration).
package envoytest

import (
	"errors"
	"fmt"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	// Every typed_config the bootstraps use must resolve, as in Envoy.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	localrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/local_ratelimit/v3"
	netrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// Parse decodes an Envoy bootstrap as Envoy would: unknown fields are errors, every "@type"
// must resolve, and every message, including those packed in Any, must pass its validation
// rules. It returns how many Any values it checked.
func Parse(data []byte) (*bootstrapv3.Bootstrap, int, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, 0, err
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, bs); err != nil {
		return nil, 0, err
	}
	var errs []error
	if err := bs.ValidateAll(); err != nil {
		errs = append(errs, err)
	}
	w := &anyWalker{}
	w.message(bs.ProtoReflect(), "bootstrap")
	return bs, w.anys, errors.Join(append(errs, w.errs...)...)
}

// anyWalker visits every message reachable from a root. The generated ValidateAll methods stop
// at google.protobuf.Any, which is where every typed_config lives, so the walker unpacks each
// Any, validates its content and carries on inside it.
type anyWalker struct {
	anys int
	errs []error
}

func (w *anyWalker) message(m protoreflect.Message, at string) {
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		w.anys++
		a := m.Interface().(*anypb.Any)
		inner, err := a.UnmarshalNew()
		if err != nil {
			w.errs = append(w.errs, fmt.Errorf("%s: %s: %w", at, a.GetTypeUrl(), err))
			return
		}
		v, ok := inner.(interface{ ValidateAll() error })
		if !ok {
			w.errs = append(w.errs, fmt.Errorf("%s: %s has no validation rules to check", at, a.GetTypeUrl()))
			return
		}
		if err := v.ValidateAll(); err != nil {
			w.errs = append(w.errs, fmt.Errorf("%s: %s: %w", at, a.GetTypeUrl(), err))
		}
		m = inner.ProtoReflect()
		at += "(" + string(m.Descriptor().FullName()) + ")"
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		at := at + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				w.message(mv.Message(), fmt.Sprintf("%s[%q]", at, k.String()))
				return true
			})
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				w.message(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", at, i))
			}
		default:
			w.message(v.Message(), at)
		}
		return true
	})
}

// Load reads and parses the bootstrap at path, failing the test on any problem.
func Load(t testing.TB, path string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bs, _, err := Parse(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return bs
}

// Unpack returns a's content as a T, or the zero T when a holds another type.
func Unpack[T proto.Message](t testing.TB, a *anypb.Any) T {
	t.Helper()
	var zero T
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.(T); ok {
		return v
	}
	return zero
}

// Edge is what an edge proxy bootstrap (deploy/envoy/envoy.yaml and its TLS copy) tells Envoy
// about rate limiting: one HTTP connection manager with a local and a global rate-limit filter,
// and a TCP listener with the network rate-limit filter.
type Edge struct {
	Bootstrap *bootstrapv3.Bootstrap
	HCM       *hcmv3.HttpConnectionManager
	Filters   []string // HTTP filter names, in order
	Local     *localrlv3.LocalRateLimit
	Global    *httprlv3.RateLimit
	TCP       *netrlv3.RateLimit
	Clusters  map[string]*clusterv3.Cluster
}

// LoadEdge loads the edge bootstrap at path, failing the test when a part is missing or doubled.
func LoadEdge(t testing.TB, path string) *Edge {
	t.Helper()
	e := &Edge{Bootstrap: Load(t, path), Clusters: map[string]*clusterv3.Cluster{}}
	for _, c := range e.Bootstrap.GetStaticResources().GetClusters() {
		e.Clusters[c.GetName()] = c
	}
	for _, l := range e.Bootstrap.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if h := Unpack[*hcmv3.HttpConnectionManager](t, f.GetTypedConfig()); h != nil {
					e.HCM = h
				}
				if r := Unpack[*netrlv3.RateLimit](t, f.GetTypedConfig()); r != nil {
					e.TCP = r
				}
			}
		}
	}
	if e.HCM == nil || e.TCP == nil {
		t.Fatalf("%s: want an HTTP connection manager and a network ratelimit filter", path)
	}
	for _, f := range e.HCM.GetHttpFilters() {
		e.Filters = append(e.Filters, f.GetName())
		if l := Unpack[*localrlv3.LocalRateLimit](t, f.GetTypedConfig()); l != nil {
			e.Local = l
		}
		if g := Unpack[*httprlv3.RateLimit](t, f.GetTypedConfig()); g != nil {
			if e.Global != nil {
				t.Fatalf("%s: two ratelimit HTTP filters", path)
			}
			e.Global = g
		}
	}
	if e.Local == nil || e.Global == nil {
		t.Fatalf("%s: want local_ratelimit and ratelimit HTTP filters", path)
	}
	return e
}
