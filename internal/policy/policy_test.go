package policy

import (
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const sample = `# the mesh's proxies and a batch job
callers:
  - identities: [spiffe://cluster.local/ns/mesh/sa/envoy, envoy.mesh.svc]
    domains: [checkout, "team-*"]
    refund: true
    max_hits: 10
  - identities: ["spiffe://cluster.local/ns/batch/*"]
    domains: ["*"]
    override: true
  - identities: ["spiffe://cluster.local/ns/batch/sa/special*"]
    domains: [special]
  - identities: [ops@example.com, 10.0.0.7]
    domains: []
default:
  domains: [public]
  max_hits: 1
`

func mustParse(t *testing.T, src string) *Policy {
	t.Helper()
	p, err := Parse("policy.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func req(domain string, hits uint32, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	if len(descs) == 0 {
		descs = []*ratelimitv3.RateLimitDescriptor{desc()}
	}
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: descs}
}

func desc() *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}
}

func refund() *ratelimitv3.RateLimitDescriptor {
	d := desc()
	d.IsNegativeHits = true
	return d
}

func override() *ratelimitv3.RateLimitDescriptor {
	d := desc()
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_SECOND}
	return d
}

func hits(n uint64) *ratelimitv3.RateLimitDescriptor {
	d := desc()
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func TestParseSample(t *testing.T) {
	p := mustParse(t, sample)
	if len(p.Callers) != 4 || p.Default == nil {
		t.Fatalf("callers %d, default %v", len(p.Callers), p.Default)
	}
	e := p.Callers[0]
	if !slices.Equal(e.Identities, []string{"spiffe://cluster.local/ns/mesh/sa/envoy", "envoy.mesh.svc"}) ||
		!slices.Equal(e.Domains, []string{"checkout", "team-*"}) || !e.Refund || e.Override || e.MaxHits != 10 || e.Line != 3 {
		t.Errorf("callers #1: %+v", e)
	}
	if d := p.Default; !slices.Equal(d.Domains, []string{"public"}) || d.Refund || d.Override || d.MaxHits != 1 || d.Line != 15 {
		t.Errorf("default: %+v", d)
	}
	if e := p.Callers[3]; e.Domains == nil || len(e.Domains) != 0 {
		t.Errorf("domains: [] should be an empty list, got %#v", e.Domains)
	}
}

func TestCaller(t *testing.T) {
	p := mustParse(t, sample)
	tests := []struct {
		name   string
		ids    []string
		line   int // 0: nil entry
		chosen string
	}{
		{"exact uri", []string{"spiffe://cluster.local/ns/mesh/sa/envoy"}, 3, "spiffe://cluster.local/ns/mesh/sa/envoy"},
		{"exact dns among others", []string{"spiffe://elsewhere/x", "envoy.mesh.svc"}, 3, "envoy.mesh.svc"},
		{"exact beats prefix", []string{"spiffe://cluster.local/ns/batch/sa/a", "ops@example.com"}, 12, "ops@example.com"},
		{"prefix", []string{"spiffe://cluster.local/ns/batch/sa/a"}, 7, "spiffe://cluster.local/ns/batch/sa/a"},
		{"longest prefix", []string{"spiffe://cluster.local/ns/batch/sa/special-1"}, 10, "spiffe://cluster.local/ns/batch/sa/special-1"},
		{"ip", []string{"10.0.0.7"}, 12, "10.0.0.7"},
		{"not a prefix of the pattern", []string{"spiffe://cluster.local/ns/batch"}, 15, ""},
		{"unlisted", []string{"spiffe://other"}, 15, ""},
		{"no certificate", nil, 15, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, id := p.Caller(tc.ids)
			if e == nil || e.Line != tc.line || id != tc.chosen {
				t.Fatalf("entry %+v by %q; want line %d by %q", e, id, tc.line, tc.chosen)
			}
		})
	}
	// Of two exact entries, the first in the file wins, whatever the certificate's order.
	p = mustParse(t, "callers:\n  - identities: [b]\n    domains: [x]\n  - identities: [a]\n    domains: [y]\n")
	if e, id := p.Caller([]string{"a", "b"}); e == nil || e.Line != 2 || id != "b" {
		t.Fatalf("entry %+v by %q; want line 2 by b", e, id)
	}
}

func TestCheck(t *testing.T) {
	p := mustParse(t, sample)
	mesh := []string{"spiffe://cluster.local/ns/mesh/sa/envoy"}
	batch := []string{"spiffe://cluster.local/ns/batch/sa/job"}
	ops := []string{"ops@example.com"}
	tests := []struct {
		name string
		ids  []string
		req  *rlsv3.RateLimitRequest
		want Reason // "": allowed
		msg  string
	}{
		{"mesh own domain", mesh, req("checkout", 0), "", ""},
		{"mesh prefix domain", mesh, req("team-a", 3), "", ""},
		{"mesh other domain", mesh, req("billing", 0), ReasonDomain, `"spiffe://cluster.local/ns/mesh/sa/envoy" may not ask about domain "billing"`},
		{"prefix is not any", mesh, req("team", 0), ReasonDomain, "domain"},
		{"mesh refund", mesh, req("checkout", 0, desc(), refund()), "", ""},
		{"mesh override", mesh, req("checkout", 0, desc(), override()), ReasonOverride, "descriptor #2 carries a limit override"},
		{"mesh request hits at max", mesh, req("checkout", 10), "", ""},
		{"mesh request hits over", mesh, req("checkout", 11), ReasonHits, "hits_addend 11 is over 10"},
		{"mesh descriptor hits over", mesh, req("checkout", 0, hits(2), hits(11)), ReasonHits, "descriptor #2 hits_addend 11 is over 10"},
		{"mesh descriptor hits zero", mesh, req("checkout", 0, hits(0)), "", ""},
		{"batch any domain, override", batch, req("anything", 1000, override()), "", ""},
		{"batch refund", batch, req("anything", 0, refund()), ReasonRefund, "descriptor #1 refunds (is_negative_hits)"},
		{"no domains", ops, req("checkout", 0), ReasonDomain, `"ops@example.com" may not ask`},
		{"default domain", nil, req("public", 0), "", ""},
		{"default other domain", nil, req("checkout", 0), ReasonDomain, "callers without a listed identity (the default entry) may not ask about domain \"checkout\""},
		{"default hits", []string{"spiffe://unlisted"}, req("public", 2), ReasonHits, "hits_addend 2 is over 1"},
		{"default refund", nil, req("public", 0, refund()), ReasonRefund, "refunds"},
		{"default override", nil, req("public", 0, override()), ReasonOverride, "override"},
		{"domain checked first", nil, req("checkout", 5, override(), refund()), ReasonDomain, "domain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Check(tc.ids, tc.req)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var d *Denial
			if !errors.As(err, &d) || d.Reason != tc.want || !strings.Contains(d.Error(), tc.msg) {
				t.Fatalf("got %v (%#v), want reason %s with %q", err, d, tc.want, tc.msg)
			}
		})
	}
}

func TestNoDefaultRefusesAll(t *testing.T) {
	p := mustParse(t, "callers:\n  - identities: [a]\n    domains: ['*']\n")
	if err := p.Check([]string{"a"}, req("x", 0)); err != nil {
		t.Fatal(err)
	}
	for _, ids := range [][]string{nil, {"b"}} {
		var d *Denial
		if err := p.Check(ids, req("x", 0)); !errors.As(err, &d) || d.Reason != ReasonCaller {
			t.Fatalf("%v: got %v, want reason caller", ids, err)
		}
	}
	if err := p.Check([]string{"b", "c"}, req("x", 0)); err == nil || !strings.Contains(err.Error(), `no entry names "b", "c"`) {
		t.Fatalf("got %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"empty", "", []string{"policy.yaml:1: empty caller policy"}},
		{"comment only", "# nothing\n", []string{"policy.yaml:1: empty caller policy"}},
		{"not a mapping", "- a\n", []string{"policy.yaml:1: a caller policy must be a mapping"}},
		{"syntax", "callers: [\n", []string{"policy.yaml:1: did not find expected node content"}},
		{"tab", "default:\n\tdomains: [a]\n", []string{"policy.yaml:2: found character that cannot start any token"}},
		{"unknown top key", "callers: []\nallow: all\n", []string{"policy.yaml:2: unknown key allow in the caller policy"}},
		{"unknown entry key", "default:\n  domains: [a]\n  refunds: true\n", []string{"policy.yaml:3: unknown key refunds in default"}},
		{"domains missing", "callers:\n  - identities: [a]\n    refund: true\n", []string{"policy.yaml:2: callers #1: domains is missing"}},
		{"identities missing", "callers:\n  - domains: [a]\n", []string{"policy.yaml:2: callers #1: identities is missing"}},
		{"identities empty", "callers:\n  - domains: [a]\n    identities: []\n", []string{"policy.yaml:2: callers #1: identities is empty"}},
		{"identities in default", "default:\n  identities: [a]\n  domains: [a]\n", []string{"policy.yaml:2: default: identities has no place"}},
		{"duplicate identity", "callers:\n  - identities: [a]\n    domains: [x]\n  - identities:\n      - b\n      - a\n    domains: [y]\n",
			[]string{`policy.yaml:6: identity "a" is listed twice (first at line 2)`}},
		{"duplicate pattern", "callers:\n  - identities: [a*]\n    domains: [x]\n  - identities: [a*]\n    domains: [y]\n",
			[]string{`policy.yaml:4: identity "a*" is listed twice`}},
		{"bad pattern", "callers:\n  - identities: ['a*b']\n    domains: ['x*y']\n",
			[]string{`policy.yaml:2: callers #1: identities: "a*b": * may only end a pattern`, `policy.yaml:3: callers #1: domains: "x*y": * may only end`}},
		{"empty string", "default:\n  domains: ['']\n", []string{`policy.yaml:2: default: domains: "": empty`}},
		{"domains not a list", "default:\n  domains: checkout\n", []string{`policy.yaml:2: default: domains must be a list, not "checkout"`}},
		{"domain not a string", "default:\n  domains: [1]\n", []string{"policy.yaml:2: default: domains: each must be a string, not 1"}},
		{"refund not a bool", "default:\n  domains: [a]\n  refund: 'yes'\n", []string{`policy.yaml:3: default: refund must be true or false, not "yes"`}},
		{"max_hits zero", "default:\n  domains: [a]\n  max_hits: 0\n", []string{"policy.yaml:3: default: max_hits must be a whole number of at least 1, not 0"}},
		{"max_hits negative", "default:\n  domains: [a]\n  max_hits: -5\n", []string{"policy.yaml:3: default: max_hits must be a whole number of at least 1, not -5"}},
		{"max_hits float", "default:\n  domains: [a]\n  max_hits: 1.5\n", []string{"policy.yaml:3: default: max_hits must be a whole number"}},
		{"key twice", "default:\n  domains: [a]\n  domains: [b]\n", []string{"policy.yaml:3: key domains set twice in default"}},
		{"callers not a list", "callers: {a: b}\n", []string{"policy.yaml:1: callers must be a list, not a mapping"}},
		{"caller not a mapping", "callers:\n  - a\n", []string{`policy.yaml:2: callers #1 must be a mapping, not "a"`}},
		{"default not a mapping", "default: [a]\n", []string{"policy.yaml:1: default must be a mapping, not a list"}},
		{"alias", "default: &d\n  domains: [a]\ncallers:\n  - identities: [x]\n    domains: *x\n", []string{"policy.yaml:"}},
		{"merge", "x: &d {domains: [a]}\n", []string{"policy.yaml:1: unknown key x"}},
		{"merge key", "default:\n  <<: {domains: [a]}\n", []string{"policy.yaml:2: merge keys (<<) are not supported"}},
		{"second document", "default:\n  domains: [a]\n---\ncallers: []\n", []string{"policy.yaml:4: a second YAML document"}},
		{"every error", "callers:\n  - identities: [a]\n    bogus: 1\ndefault:\n  max_hits: x\n",
			[]string{"policy.yaml:3: unknown key bogus", "policy.yaml:2: callers #1: domains is missing",
				"policy.yaml:5: default: max_hits must be", "policy.yaml:5: default: domains is missing"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse("policy.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("no error; policy %+v", p)
			}
			if p != nil {
				t.Errorf("a policy with the error: %+v", p)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestAliasRefused(t *testing.T) {
	_, err := Parse("p.yaml", []byte("default: &d\n  domains: &l [a]\ncallers:\n  - identities: [x]\n    domains: *l\n"))
	if err == nil || !strings.Contains(err.Error(), "p.yaml:5: domains: anchors and aliases are not supported") {
		t.Fatalf("got %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path)
	if err != nil || p.File != path || len(p.Callers) != 4 {
		t.Fatalf("%+v, %v", p, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", MaxFileBytes)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "over 1048576 bytes") {
		t.Fatalf("big file: %v", err)
	}
	if err := os.WriteFile(path, []byte("default:\n  domains: [a]\n  nope: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), path+":3: unknown key nope") {
		t.Fatalf("bad file: %v", err)
	}
}

func TestIdentities(t *testing.T) {
	u, _ := url.Parse("spiffe://cluster.local/ns/mesh/sa/envoy")
	cert := &x509.Certificate{
		URIs: []*url.URL{u}, DNSNames: []string{"envoy.mesh"}, EmailAddresses: []string{"a@b.c"},
		IPAddresses: []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("::1")},
	}
	want := []string{"spiffe://cluster.local/ns/mesh/sa/envoy", "envoy.mesh", "a@b.c", "10.0.0.1", "::1"}
	if got := Identities(cert); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	if Identities(nil) != nil {
		t.Fatal("nil certificate has identities")
	}
}
