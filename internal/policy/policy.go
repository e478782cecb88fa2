package policy

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/yamlnode"
)

// MaxFileBytes bounds a policy file: one is a few lines per caller.
const MaxFileBytes = 1 << 20

// Reason is why a request was refused; the set is fixed, so it may label a metric.
type Reason string

// The reasons a request is refused.
const (
	ReasonCaller   Reason = "caller"   // no entry for the caller and no default entry
	ReasonDomain   Reason = "domain"   // the domain is not among the entry's
	ReasonRefund   Reason = "refund"   // is_negative_hits from a caller that may not refund
	ReasonOverride Reason = "override" // a descriptor limit from a caller that may not override
	ReasonHits     Reason = "hits"     // hits_addend above the entry's max_hits
)

// Reasons are every Reason, in a fixed order.
var Reasons = []Reason{ReasonCaller, ReasonDomain, ReasonRefund, ReasonOverride, ReasonHits}

// Denial is a refused request: why, and a message for the caller.
type Denial struct {
	Reason Reason
	msg    string
}

func (d *Denial) Error() string { return d.msg }

// Entry is what one caller, or the default, may do.
type Entry struct {
	// Identities are the names (exact, or prefixes ending in *) that select this entry; none
	// for the default entry.
	Identities []string
	// Domains are the domains it may ask about: exact names, "*" (any), or prefixes ending in *.
	Domains []string
	// Refund: it may send descriptors with is_negative_hits.
	Refund bool
	// Override: it may send descriptors with a limit.
	Override bool
	// MaxHits, when not 0, is the largest hits_addend it may send, of the request or of a
	// descriptor.
	MaxHits uint64
	// Line is where the entry starts in the file.
	Line int
}

// Policy is a parsed caller policy; it is immutable and safe for concurrent use.
type Policy struct {
	// File is the name the policy was parsed under.
	File     string
	Callers  []*Entry // in file order
	Default  *Entry   // nil when the file has none
	exact    map[string]*Entry
	prefixes []prefix // longest first
}

type prefix struct {
	prefix string
	entry  *Entry
}

// Load reads and parses the policy file at path.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s: the file is over %d bytes", path, MaxFileBytes)
	}
	return Parse(path, data)
}

// Parse parses a policy file's content; name is used in errors ("name:line: ...").
// Every error found is returned, joined.
func Parse(name string, data []byte) (*Policy, error) {
	p := &parser{name: name}
	p.dec = yamlnode.Decoder{Errorf: p.errorf, Format: "a caller policy"}
	pol := p.parse(data)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return pol, nil
}

type parser struct {
	name string
	errs []error
	dec  yamlnode.Decoder // anchors, aliases and merge keys refused
}

func (p *parser) errorf(line int, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s", p.name, line, fmt.Sprintf(format, args...)))
}

var (
	fileFields  = []string{"callers", "default"}
	entryFields = []string{"identities", "domains", "refund", "override", "max_hits"}
)

func (p *parser) parse(data []byte) *Policy {
	doc, second, errs := yamlnode.Read(data)
	for _, err := range errs {
		p.errs = append(p.errs, yamlnode.FileError(p.name, err))
	}
	if second > 0 {
		p.errorf(second, "a second YAML document: a caller policy is one")
	}
	if doc == nil {
		if len(errs) == 0 {
			p.errorf(1, "empty caller policy: want callers, default or both")
		}
		return nil
	}
	if doc.Kind != yaml.MappingNode {
		p.errorf(doc.Line, "a caller policy must be a mapping with callers and default, not %s", yamlnode.KindOf(doc))
		return nil
	}
	pol := &Policy{File: p.name, exact: map[string]*Entry{}}
	exactLine, prefixLine := map[string]int{}, map[string]int{}
	p.dec.Mapping(doc, "the caller policy", fileFields, func(field int, k, v *yaml.Node) {
		switch fileFields[field] {
		case "callers":
			if yamlnode.IsNull(v) {
				return
			}
			if v.Kind != yaml.SequenceNode {
				p.errorf(v.Line, "callers must be a list, not %s", yamlnode.KindOf(v))
				return
			}
			for i, it := range v.Content {
				if it.Kind != yaml.MappingNode {
					p.errorf(it.Line, "callers #%d must be a mapping, not %s", i+1, yamlnode.KindOf(it))
					continue
				}
				e := p.entry(it, fmt.Sprintf("callers #%d", i+1), false)
				pol.Callers = append(pol.Callers, e)
				for j, id := range e.Identities {
					line := it.Line
					if n := yamlnode.Field(it, "identities"); n != nil && n.Kind == yaml.SequenceNode && j < len(n.Content) {
						line = n.Content[j].Line
					}
					if pat, ok := strings.CutSuffix(id, "*"); ok {
						if l, dup := prefixLine[pat]; dup {
							p.errorf(line, "identity %q is listed twice (first at line %d)", id, l)
							continue
						}
						prefixLine[pat] = line
						pol.prefixes = append(pol.prefixes, prefix{pat, e})
						continue
					}
					if l, dup := exactLine[id]; dup {
						p.errorf(line, "identity %q is listed twice (first at line %d)", id, l)
						continue
					}
					exactLine[id] = line
					pol.exact[id] = e
				}
			}
		case "default":
			if v.Kind != yaml.MappingNode {
				p.errorf(v.Line, "default must be a mapping, not %s", yamlnode.KindOf(v))
				return
			}
			pol.Default = p.entry(v, "default", true)
		}
	})
	slices.SortStableFunc(pol.prefixes, func(a, b prefix) int { return len(b.prefix) - len(a.prefix) })
	return pol
}

// entry decodes one entry mapping; what names it in errors.
func (p *parser) entry(n *yaml.Node, what string, isDefault bool) *Entry {
	e := &Entry{Line: n.Line}
	var hasDomains, hasIdentities bool
	p.dec.Mapping(n, what, entryFields, func(field int, k, v *yaml.Node) {
		switch entryFields[field] {
		case "identities":
			hasIdentities = true
			if isDefault {
				p.errorf(k.Line, "default: identities has no place in the default entry (it is for callers no entry names)")
				return
			}
			e.Identities = p.strings(v, what+": identities", checkIdentity)
		case "domains":
			hasDomains = true
			e.Domains = p.strings(v, what+": domains", checkDomain)
		case "refund":
			e.Refund = p.boolean(v, what+": refund")
		case "override":
			e.Override = p.boolean(v, what+": override")
		case "max_hits":
			e.MaxHits = p.maxHits(v, what+": max_hits")
		}
	})
	if !hasDomains {
		p.errorf(n.Line, `%s: domains is missing (["*"] allows any domain, [] none)`, what)
	}
	if !isDefault && !hasIdentities {
		p.errorf(n.Line, "%s: identities is missing (the client certificate names the entry applies to)", what)
	} else if !isDefault && hasIdentities && len(e.Identities) == 0 {
		p.errorf(n.Line, "%s: identities is empty", what)
	}
	return e
}

// strings decodes a list of non-empty strings, each checked by check.
func (p *parser) strings(v *yaml.Node, what string, check func(string) error) []string {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v.Line, "%s must be a list, not %s", what, yamlnode.KindOf(v))
		return nil
	}
	out := []string{}
	for _, it := range v.Content {
		if it.Kind != yaml.ScalarNode || it.ShortTag() != "!!str" {
			p.errorf(it.Line, "%s: each must be a string, not %s", what, yamlnode.KindOf(it))
			continue
		}
		if err := check(it.Value); err != nil {
			p.errorf(it.Line, "%s: %q: %v", what, it.Value, err)
			continue
		}
		out = append(out, it.Value)
	}
	return out
}

func checkIdentity(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if strings.Contains(strings.TrimSuffix(s, "*"), "*") {
		return errors.New("* may only end a pattern")
	}
	return nil
}

func checkDomain(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if strings.Contains(strings.TrimSuffix(s, "*"), "*") {
		return errors.New(`* may only end a pattern ("*" alone is any domain)`)
	}
	return nil
}

func (p *parser) boolean(v *yaml.Node, what string) bool {
	var x bool
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" || v.Decode(&x) != nil {
		p.errorf(v.Line, "%s must be true or false, not %s", what, yamlnode.KindOf(v))
	}
	return x
}

func (p *parser) maxHits(v *yaml.Node, what string) uint64 {
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" {
		p.errorf(v.Line, "%s must be a whole number of at least 1, not %s", what, yamlnode.KindOf(v))
		return 0
	}
	n, err := strconv.ParseUint(strings.ReplaceAll(v.Value, "_", ""), 0, 64)
	if err != nil || n == 0 {
		p.errorf(v.Line, "%s must be a whole number of at least 1, not %s (leave it out for no bound)", what, v.Value)
		return 0
	}
	return n
}

// Identities are the names a verified client certificate gives its holder, as a policy lists
// them: its URIs, DNS names, e-mail addresses and IP addresses, in that order.
func Identities(cert *x509.Certificate) []string {
	if cert == nil {
		return nil
	}
	ids := make([]string, 0, len(cert.URIs)+len(cert.DNSNames)+len(cert.EmailAddresses)+len(cert.IPAddresses))
	for _, u := range cert.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, cert.DNSNames...)
	ids = append(ids, cert.EmailAddresses...)
	for _, ip := range cert.IPAddresses {
		ids = append(ids, ip.String())
	}
	return ids
}

// Caller returns the entry for a caller with these identities (none: no client certificate),
// and which of them selected it ("" for the default entry). The entry is nil when none applies
// and the policy has no default.
func (p *Policy) Caller(ids []string) (*Entry, string) {
	var best *Entry
	var bestID string
	for _, id := range ids {
		if e, ok := p.exact[id]; ok && (best == nil || e.Line < best.Line) {
			best, bestID = e, id
		}
	}
	if best != nil {
		return best, bestID
	}
	for _, pre := range p.prefixes { // longest first
		for _, id := range ids {
			if strings.HasPrefix(id, pre.prefix) {
				return pre.entry, id
			}
		}
	}
	return p.Default, ""
}

// Check decides whether a caller with these identities may make req: nil, or a *Denial saying
// why not. The checks are, in order: the caller has an entry, the domain, the request's
// hits_addend, then each descriptor's override, refund and hits; the first refused is reported.
func (p *Policy) Check(ids []string, req *rlsv3.RateLimitRequest) error {
	e, id := p.Caller(ids)
	switch {
	case e == nil && len(ids) == 0:
		return deny(ReasonCaller, "caller policy: a caller without a client certificate is refused (the policy has no default entry)")
	case e == nil:
		return deny(ReasonCaller, "caller policy: no entry names %s and the policy has no default entry", quoteAll(ids))
	}
	if !e.AllowsDomain(req.GetDomain()) {
		return deny(ReasonDomain, "caller policy: %s may not ask about domain %q", who(id), req.GetDomain())
	}
	if e.MaxHits > 0 && uint64(req.GetHitsAddend()) > e.MaxHits {
		return deny(ReasonHits, "caller policy: hits_addend %d is over %d, the most %s may send", req.GetHitsAddend(), e.MaxHits, who(id))
	}
	for i, d := range req.GetDescriptors() {
		if err := e.checkDescriptor(i, d, id); err != nil {
			return err
		}
	}
	return nil
}

// who names, in a message, the caller an entry was chosen for by id ("" for the default entry).
func who(id string) string {
	if id == "" {
		return "callers without a listed identity (the default entry)"
	}
	return strconv.Quote(id)
}

func (e *Entry) checkDescriptor(i int, d *ratelimitv3.RateLimitDescriptor, id string) error {
	if d.GetLimit() != nil && !e.Override {
		return deny(ReasonOverride, "caller policy: descriptor #%d carries a limit override, which %s may not send", i+1, who(id))
	}
	if d.GetIsNegativeHits() && !e.Refund {
		return deny(ReasonRefund, "caller policy: descriptor #%d refunds (is_negative_hits), which %s may not do", i+1, who(id))
	}
	if h := d.GetHitsAddend(); h != nil && e.MaxHits > 0 && h.GetValue() > e.MaxHits {
		return deny(ReasonHits, "caller policy: descriptor #%d hits_addend %d is over %d, the most %s may send", i+1, h.GetValue(), e.MaxHits, who(id))
	}
	return nil
}

// AllowsDomain reports whether the entry lets its caller ask about domain.
func (e *Entry) AllowsDomain(domain string) bool {
	for _, d := range e.Domains {
		if pre, ok := strings.CutSuffix(d, "*"); ok {
			if strings.HasPrefix(domain, pre) {
				return true
			}
		} else if d == domain {
			return true
		}
	}
	return false
}

func deny(r Reason, format string, args ...any) *Denial {
	return &Denial{Reason: r, msg: fmt.Sprintf(format, args...)}
}

// quoteAll quotes the first few identities, for a message.
func quoteAll(ids []string) string {
	const most = 4
	q := make([]string, 0, min(len(ids), most))
	for _, id := range ids[:min(len(ids), most)] {
		q = append(q, strconv.Quote(id))
	}
	s := strings.Join(q, ", ")
	if len(ids) > most {
		s += fmt.Sprintf(" (and %d more)", len(ids)-most)
	}
	return s
}
