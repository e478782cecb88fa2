package descriptors

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/yamlnode"
)

// builder builds a RuleSet from rule files, one file at a time, recording every error with its
// file and line.
type builder struct {
	rs         *RuleSet
	domainFile map[string]string // domain → "file:line"
	errs       []error
	name       string // the file being built
	domain     string
	// visits counts the nodes decoded from the file, which anchors and aliases can make many
	// more than it holds; budget bounds them (see spend).
	visits, budget int
	overBudget     bool
	metadata       map[*yaml.Node]decodedMetadata // by mapping
	// dec walks the file's mappings: aliases and merge keys followed, within the budget.
	dec yamlnode.Decoder
	// merged holds, with Options.MergeDomains, each domain's descriptors from every file that
	// defines it, built once all files are read; nil otherwise.
	merged map[string]*mergedDomain
	order  []string // merged's domains in the order first seen
	// itemFile names the file of each top-level descriptor of a merged domain.
	itemFile map[*yaml.Node]string
	// overdraft is Options.Overdraft.
	overdraft bool
	// globalDomains is Options.GlobalDomains.
	globalDomains []string
}

func (b *builder) errorf(line int, format string, args ...any) {
	prefix := fmt.Sprintf("%s:%d: ", b.name, line)
	if b.domain != "" {
		prefix += fmt.Sprintf("domain %q: ", b.domain)
	}
	b.errs = append(b.errs, errors.New(prefix+fmt.Sprintf(format, args...)))
}

func (b *builder) file(name string, data []byte) {
	b.name, b.domain = name, ""
	b.visits, b.budget, b.overBudget, b.metadata = 0, len(data)+10000, false, nil
	b.dec = yamlnode.Decoder{Errorf: b.rawf, Aliases: true, Spend: b.spend}
	doc, second, errs := yamlnode.Read(data)
	for _, err := range errs {
		b.errs = append(b.errs, yamlnode.FileError(b.name, err))
	}
	if second > 0 {
		b.errorf(second, "a second YAML document: a rule file holds one domain (put each in its own file)")
	}
	if doc == nil {
		if len(errs) == 0 {
			b.errorf(1, "empty rule file: want a domain and descriptors")
		}
		return
	}
	doc = yamlnode.Deref(doc)
	if doc.Kind != yaml.MappingNode {
		b.errorf(doc.Line, "a rule file must be a mapping with a domain and descriptors, not %s", b.dec.KindOf(doc))
		return
	}
	var list *yaml.Node
	b.dec.Mapping(doc, "RuleFile", ruleFileFields, func(field int, k, v *yaml.Node) {
		switch ruleFileFields[field] {
		case "domain":
			b.domain = b.str(v, "domain")
		case "descriptors":
			list = v
		default:
			b.undecoded(k, "RuleFile")
		}
	})
	if b.domain == "" {
		b.errorf(lineOf(doc, "domain"), "domain must not be empty")
		return
	}
	here := fmt.Sprintf("%s:%d", name, lineOf(doc, "domain"))
	if b.merged != nil {
		b.mergeFile(name, len(data), list)
		return
	}
	if prev, dup := b.domainFile[b.domain]; dup {
		b.errorf(lineOf(doc, "domain"), "duplicate domain, first defined at %s", prev)
		return
	}
	b.domainFile[b.domain] = here
	info := DomainInfo{Name: b.domain, File: name}
	lv := b.level(list, nil, "", &info)
	b.rs.domains[b.domain] = lv
	b.rs.Domains = append(b.rs.Domains, info)
}

// keyBuild is one key's nodes while its level is built: the maps find duplicates.
type keyBuild struct {
	i     int // in level.keys
	exact map[string]*node
	wild  map[string]bool
}

// level builds one level of the tree from a descriptors list. share is the share pattern of
// each ancestor depth.
func (b *builder) level(list *yaml.Node, share []string, path string, info *DomainInfo) *level {
	seq, where := b.levelList(list, len(share), path)
	if seq == nil {
		return nil
	}
	lv := &level{}
	builds := map[string]*keyBuild{}
	for i, item := range seq.Content {
		if !b.spend(item, 1) {
			break
		}
		if f, ok := b.itemFile[item]; ok && path == "" {
			b.name = f
		}
		n, d, here := b.item(item, i, where, path)
		if n == nil {
			continue
		}
		// The key and value are kept as parts of here, which the rule keeps as its Path, so
		// the tree holds no second copy of them.
		key := here[len(path) : len(path)+len(d.Key)]
		value := here[len(here)-len(d.Value):]
		nd := b.place(lv, builds, key, value, item.Line, here)
		if nd == nil {
			continue
		}
		myShare := append(slices.Clip(share), "")
		if d.ShareThreshold {
			if !strings.Contains(value, "*") {
				b.errorf(lineOf(n, "share_threshold"), "descriptor %s: share_threshold needs a wildcard value (with '*')", here)
			}
			myShare[len(myShare)-1] = value
		}
		nd.rule = b.rule(&d, here, myShare, info)
		nd.children = b.level(d.children, myShare, here+"/", info)
	}
	if len(lv.keys) == 0 {
		return nil
	}
	for i := range lv.keys {
		kn := &lv.keys[i]
		kn.setExact(builds[kn.key].exact)
		kn.indexWild()
	}
	lv.keys = slices.Clip(lv.keys)
	lv.index()
	return lv
}

// levelList checks a descriptors list at depth (the entries above it) and under path: it
// returns the list's items, and where it stands in words for errors; nil for an empty or
// invalid list (an error recorded).
func (b *builder) levelList(list *yaml.Node, depth int, path string) (seq *yaml.Node, where string) {
	if yamlnode.IsNull(list) {
		return nil, ""
	}
	where = "at the top level"
	if path != "" {
		where = "under " + strings.TrimSuffix(path, "/")
	}
	seq = yamlnode.Deref(list)
	if seq.Kind != yaml.SequenceNode {
		b.errorf(list.Line, "descriptors %s must be a list, not %s", where, b.dec.KindOf(seq))
		return nil, ""
	}
	if len(seq.Content) == 0 {
		return nil, ""
	}
	if depth >= limit.MaxEntries {
		b.errorf(list.Line, "descriptors nested deeper than %d levels", limit.MaxEntries)
		return nil, ""
	}
	return seq, where
}

// item decodes and checks the descriptor #i+1 of a list: its mapping node, what it holds, and
// its path (path, the key, and =value when it has one). A nil node means an error was recorded.
func (b *builder) item(item *yaml.Node, i int, where, path string) (*yaml.Node, rawDescriptor, string) {
	n := yamlnode.Deref(item)
	if yamlnode.IsNull(n) {
		b.errorf(item.Line, "descriptor #%d %s is empty (null)", i+1, where)
		return nil, rawDescriptor{}, ""
	}
	if n.Kind != yaml.MappingNode {
		b.errorf(item.Line, "descriptor #%d %s must be a mapping, not %s", i+1, where, b.dec.KindOf(n))
		return nil, rawDescriptor{}, ""
	}
	d := b.descriptor(n)
	line := item.Line
	here := path + d.Key
	if d.Value != "" {
		here += "=" + d.Value
	}
	switch {
	case d.Key == "":
		b.errorf(line, "descriptor #%d %s: key must not be empty", i+1, where)
		return nil, rawDescriptor{}, ""
	case len(d.Key) > limit.MaxKeyBytes:
		b.errorf(line, "descriptor %s: key longer than %d bytes", here, limit.MaxKeyBytes)
		return nil, rawDescriptor{}, ""
	case len(d.Value) > limit.MaxValueBytes:
		b.errorf(line, "descriptor %s: value longer than %d bytes", here, limit.MaxValueBytes)
		return nil, rawDescriptor{}, ""
	}
	return n, d, here
}

// place adds a node for key=value (value "" for the key's default, with '*' for a wildcard)
// to lv, and returns it; nil when the level holds it already (an error recorded).
func (b *builder) place(lv *level, builds map[string]*keyBuild, key, value string, line int, here string) *node {
	kb := builds[key]
	if kb == nil {
		kb = &keyBuild{i: len(lv.keys)}
		builds[key] = kb
		lv.keys = append(lv.keys, keyNodes{key: key})
	}
	kn := &lv.keys[kb.i] // not kept: lv.keys may grow
	nd := &node{}
	switch {
	case value == "":
		if kn.def != nil {
			b.errorf(line, "descriptor %s: duplicate key without value", here)
			return nil
		}
		kn.def = nd
	case strings.Contains(value, "*"):
		if kb.wild[value] {
			b.errorf(line, "descriptor %s: duplicate value", here)
			return nil
		}
		if kb.wild == nil {
			kb.wild = map[string]bool{}
		}
		kb.wild[value] = true
		kn.wild = append(kn.wild, newWildNode(value, nd))
	default:
		if kb.exact[value] != nil {
			b.errorf(line, "descriptor %s: duplicate value", here)
			return nil
		}
		if kb.exact == nil {
			kb.exact = map[string]*node{}
		}
		kb.exact[value] = nd
	}
	return nd
}

// rule validates a node's limits and options; it returns nil for a node without a limit.
func (b *builder) rule(d *rawDescriptor, path string, share []string, info *DomainInfo) *Rule {
	n := d.node
	var failure FailureMode
	if d.FailureMode != "" {
		var err error
		if failure, err = ParseFailureMode(d.FailureMode); err != nil {
			b.errorf(lineOf(n, "failure_mode"), "descriptor %s: failure_mode %q: want one of %s", path, d.FailureMode, strings.Join(FailureModes, ", "))
		}
	}
	if err := checkMetadata(d.Metadata); err != nil {
		b.errorf(lineOf(n, "metadata"), "descriptor %s: metadata: %v", path, err)
	}
	if d.ShadowMode && d.QuotaMode {
		b.errorf(lineOf(n, "quota_mode"), "descriptor %s: shadow_mode and quota_mode are exclusive", path)
	}
	var limitNodes []*yaml.Node
	switch {
	case d.limit != nil && d.limits != nil:
		b.errorf(lineOf(n, "rate_limits"), "descriptor %s: set rate_limit or rate_limits, not both", path)
		return nil
	case d.limit != nil:
		limitNodes = []*yaml.Node{d.limit}
	case d.limits != nil:
		seq := yamlnode.Deref(d.limits)
		if seq.Kind != yaml.SequenceNode {
			b.errorf(d.limits.Line, "descriptor %s: rate_limits must be a list, not %s", path, b.dec.KindOf(seq))
			return nil
		}
		if len(seq.Content) == 0 {
			b.errorf(lineOf(n, "rate_limits"), "descriptor %s: rate_limits is empty", path)
			return nil
		}
		if !b.spend(seq, len(seq.Content)) {
			return nil
		}
		limitNodes = seq.Content
	default:
		if d.conc == nil {
			return nil
		}
	}
	r := &Rule{
		Domain: b.domain, Path: path,
		ShadowMode: d.ShadowMode, QuotaMode: d.QuotaMode, DetailedMetric: d.DetailedMetric,
		ValueToMetric: d.ValueToMetric, Metadata: d.Metadata, FailureMode: failure,
		Source: fmt.Sprintf("%s:%d", b.name, n.Line),
	}
	if slices.ContainsFunc(share, func(s string) bool { return s != "" }) {
		r.Share = share
	}
	var tags map[string]int // a list's key tags so far → the index of the limit with it
	if d.limits != nil && len(limitNodes) > 1 {
		tags = make(map[string]int, len(limitNodes))
	}
	for i, item := range limitNodes {
		where := fmt.Sprintf("descriptor %s", path)
		if len(limitNodes) > 1 {
			where += fmt.Sprintf(": rate_limits[%d]", i)
		}
		ln := yamlnode.Deref(item)
		if yamlnode.IsNull(ln) {
			b.errorf(item.Line, "descriptor %s: rate_limits[%d] is empty (null)", path, i)
			continue
		}
		if ln.Kind != yaml.MappingNode {
			if d.limit != nil {
				b.errorf(item.Line, "%s: rate_limit must be a mapping, not %s", where, b.dec.KindOf(ln))
			} else {
				b.errorf(item.Line, "descriptor %s: rate_limits[%d] must be a mapping, not %s", path, i, b.dec.KindOf(ln))
			}
			continue
		}
		rl := b.limit(ln)
		if rl.Unlimited {
			if rl.Unit != "" {
				b.errorf(lineOf(ln, "unit"), "%s: unlimited must not have a unit", where)
			}
			if len(limitNodes) > 1 {
				b.errorf(lineOf(ln, "unlimited"), "%s: unlimited cannot be one of several rate_limits", where)
			}
			if rl.Overdraft {
				b.errorf(lineOf(ln, "overdraft"), "%s: unlimited cannot have overdraft", where)
			}
			r.Unlimited = true
			continue
		}
		lim, ok := b.limitOf(rl, where)
		if !ok {
			continue
		}
		lim.KeyTag = singularTag
		if d.limits != nil {
			lim.KeyTag = listTag(&lim)
		}
		if j, dup := tags[lim.KeyTag]; dup {
			// Two limits with one key would read and write one state.
			if lim.Name != "" {
				b.errorf(lineOf(ln, "name"), "descriptor %s: rate_limits[%d] and rate_limits[%d] are both named %q: give each its own name so their state stays apart",
					path, j, i, lim.Name)
			} else {
				b.errorf(ln.Line, "descriptor %s: rate_limits: two limits %s (rate_limits[%d] and rate_limits[%d]): give each a name so their state stays apart",
					path, what(&lim), j, i)
			}
			continue
		}
		if tags != nil {
			tags[lim.KeyTag] = i
		}
		r.Limits = append(r.Limits, lim)
	}
	if d.conc != nil {
		switch {
		case d.QuotaMode:
			b.errorf(lineOf(n, "quota_mode"), "descriptor %s: quota_mode does not apply with concurrency: a slot is held or not", path)
		case r.Unlimited:
			b.errorf(lineOf(n, "concurrency"), "descriptor %s: concurrency does not apply with an unlimited rate_limit", path)
		default:
			if lim, ok := b.concurrency(d.conc, path); ok {
				r.Limits = append(r.Limits, lim)
			}
		}
	}
	info.Rules = append(info.Rules, r)
	return r
}

func checkMetadata(v any) error {
	switch v := v.(type) {
	case nil, string, bool, int, int64, uint64, float64:
		return nil
	case map[string]any:
		for k, e := range v {
			if err := checkMetadata(e); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
		return nil
	case []any:
		for i, e := range v {
			if err := checkMetadata(e); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return nil
	default:
		return fmt.Errorf("unsupported value of type %T (want strings, numbers, booleans, lists and maps with string keys)", v)
	}
}

// lineOf returns the line of key in mapping node n, or of n itself when the key is absent (or
// comes from a merge).
func lineOf(n *yaml.Node, key string) int {
	if n == nil {
		return 0
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				return n.Content[i].Line
			}
		}
	}
	return n.Line
}
