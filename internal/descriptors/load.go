package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/api"
)

// Bounds on what a rule file may hold; requests are bounded alike in package service.
const (
	MaxDepth      = 32
	MaxKeyBytes   = 256
	MaxValueBytes = 4096
)

// Load loads a rule file, or every *.yaml and *.yml file of a directory (not recursing, skipping
// names that start with '.', which covers Kubernetes ConfigMap mounts' ..data entries). Every
// problem found is returned at once, joined, each naming its file and line.
func Load(path string) (*RuleSet, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("descriptors: %w", err)
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("descriptors: %w", err)
		}
		return Parse(map[string][]byte{path: data})
	}
	return LoadFS(os.DirFS(path), ".", path)
}

// LoadFS loads the rule files of directory dir of fsys; prefix is prepended to file names in
// errors and in RuleSet.Files.
func LoadFS(fsys fs.FS, dir, prefix string) (*RuleSet, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("descriptors: %w", err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		p := filepath.ToSlash(filepath.Join(dir, name))
		if info, err := fs.Stat(fsys, p); err != nil || info.IsDir() { // follows symlinks
			continue
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("descriptors: %w", err)
		}
		files[filepath.Join(prefix, name)] = data
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("descriptors: %s: no *.yaml or *.yml rule files", prefix)
	}
	return Parse(files)
}

// Parse builds a RuleSet from rule files given as name → content.
func Parse(files map[string][]byte) (*RuleSet, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	b := &builder{rs: &RuleSet{domains: map[string]*level{}, Files: names}, domainFile: map[string]string{}}
	for _, name := range names {
		b.file(name, files[name])
	}
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	slices.SortFunc(b.rs.Domains, func(a, b DomainInfo) int { return strings.Compare(a.Name, b.Name) })
	return b.rs, nil
}

type builder struct {
	rs         *RuleSet
	domainFile map[string]string // domain → "file:line"
	errs       []error
	name       string // the file being built
	domain     string
}

func (b *builder) errorf(line int, format string, args ...any) {
	prefix := fmt.Sprintf("%s:%d: ", b.name, line)
	if b.domain != "" {
		prefix += fmt.Sprintf("domain %q: ", b.domain)
	}
	b.errs = append(b.errs, errors.New(prefix+fmt.Sprintf(format, args...)))
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

var notFound = regexp.MustCompile(`field (\S+) not found in type api\.(\w+)`)

// yamlError turns one of yaml's messages into "file:line: message".
func (b *builder) yamlError(msg string) {
	msg = notFound.ReplaceAllString(msg, "unknown key $1 in $2")
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		b.errs = append(b.errs, fmt.Errorf("%s:%s: %s", b.name, m[1], m[2]))
		return
	}
	b.errs = append(b.errs, fmt.Errorf("%s: %s", b.name, strings.TrimPrefix(msg, "yaml: ")))
}

func (b *builder) file(name string, data []byte) {
	b.name, b.domain = name, ""
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		b.yamlError(err.Error())
		return
	}
	if len(root.Content) == 0 {
		b.errorf(1, "empty rule file: want a domain and descriptors")
		return
	}
	doc := root.Content[0]
	var rf api.RuleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			b.yamlError(err.Error())
			return
		}
		for _, e := range te.Errors {
			b.yamlError(e)
		}
	}
	if rf.Domain == "" {
		b.errorf(lineOf(doc, "domain"), "domain must not be empty")
		return
	}
	b.domain = rf.Domain
	here := fmt.Sprintf("%s:%d", name, lineOf(doc, "domain"))
	if prev, dup := b.domainFile[rf.Domain]; dup {
		b.errorf(lineOf(doc, "domain"), "duplicate domain, first defined at %s", prev)
		return
	}
	b.domainFile[rf.Domain] = here
	info := DomainInfo{Name: rf.Domain, File: name}
	lv := b.level(rf.Descriptors, seqItems(field(doc, "descriptors")), nil, "", &info)
	b.rs.domains[rf.Domain] = lv
	b.rs.Domains = append(b.rs.Domains, info)
}

// level builds one level of the tree. share is the share pattern of each ancestor depth.
func (b *builder) level(ds []api.Descriptor, nodes []*yaml.Node, share []string, path string, info *DomainInfo) *level {
	if len(ds) == 0 {
		return nil
	}
	if len(share) >= MaxDepth {
		b.errorf(nodeLine(nodes, 0), "descriptors nested deeper than %d levels", MaxDepth)
		return nil
	}
	lv := &level{byKey: map[string]*keyNodes{}}
	for i := range ds {
		d := &ds[i]
		n := nodeAt(nodes, i)
		line := nodeLine(nodes, i)
		here := path + d.Key
		if d.Value != "" {
			here += "=" + d.Value
		}
		switch {
		case d.Key == "":
			where := "at the top level"
			if path != "" {
				where = "under " + strings.TrimSuffix(path, "/")
			}
			b.errorf(line, "descriptor #%d %s: key must not be empty", i+1, where)
			continue
		case len(d.Key) > MaxKeyBytes:
			b.errorf(line, "descriptor %s: key longer than %d bytes", here, MaxKeyBytes)
			continue
		case len(d.Value) > MaxValueBytes:
			b.errorf(line, "descriptor %s: value longer than %d bytes", here, MaxValueBytes)
			continue
		}
		kn := lv.byKey[d.Key]
		if kn == nil {
			kn = &keyNodes{exact: map[string]*node{}}
			lv.byKey[d.Key] = kn
		}
		nd := &node{}
		wild := strings.Contains(d.Value, "*")
		switch {
		case d.Value == "":
			if kn.def != nil {
				b.errorf(line, "descriptor %s: duplicate key without value", here)
				continue
			}
			kn.def = nd
		case wild:
			for _, w := range kn.wild {
				if strings.Join(w.segs, "*") == d.Value {
					b.errorf(line, "descriptor %s: duplicate value", here)
				}
			}
			kn.wild = append(kn.wild, wildNode{segs: strings.Split(d.Value, "*"), node: nd})
		default:
			if kn.exact[d.Value] != nil {
				b.errorf(line, "descriptor %s: duplicate value", here)
				continue
			}
			kn.exact[d.Value] = nd
		}
		myShare := append(slices.Clip(share), "")
		if d.ShareThreshold {
			if !wild {
				b.errorf(lineOf(n, "share_threshold"), "descriptor %s: share_threshold needs a wildcard value (with '*')", here)
			}
			myShare[len(myShare)-1] = d.Value
		}
		nd.rule = b.rule(d, n, here, myShare, info)
		nd.children = b.level(d.Descriptors, seqItems(field(n, "descriptors")), myShare, here+"/", info)
	}
	return lv
}

// rule validates a node's limits and options; it returns nil for a node without a limit.
func (b *builder) rule(d *api.Descriptor, n *yaml.Node, path string, share []string, info *DomainInfo) *Rule {
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
	var yamlLimits []api.RateLimit
	var limitNodes []*yaml.Node
	switch {
	case d.RateLimit != nil && d.RateLimits != nil:
		b.errorf(lineOf(n, "rate_limits"), "descriptor %s: set rate_limit or rate_limits, not both", path)
		return nil
	case d.RateLimit != nil:
		yamlLimits = []api.RateLimit{*d.RateLimit}
		limitNodes = []*yaml.Node{field(n, "rate_limit")}
	case d.RateLimits != nil:
		if len(d.RateLimits) == 0 {
			b.errorf(lineOf(n, "rate_limits"), "descriptor %s: rate_limits is empty", path)
			return nil
		}
		yamlLimits = d.RateLimits
		limitNodes = seqItems(field(n, "rate_limits"))
	default:
		return nil
	}
	r := &Rule{
		Domain: b.domain, Path: path,
		ShadowMode: d.ShadowMode, QuotaMode: d.QuotaMode, DetailedMetric: d.DetailedMetric,
		ValueToMetric: d.ValueToMetric, Metadata: d.Metadata, FailureMode: failure,
		Source: fmt.Sprintf("%s:%d", b.name, lineOf(n, "")),
	}
	if slices.ContainsFunc(share, func(s string) bool { return s != "" }) {
		r.Share = share
	}
	for i := range yamlLimits {
		rl := &yamlLimits[i]
		ln := nodeAt(limitNodes, i)
		where := fmt.Sprintf("descriptor %s", path)
		if len(yamlLimits) > 1 {
			where += fmt.Sprintf(": rate_limits[%d]", i)
		}
		unit, unitOK := ParseUnit(rl.Unit)
		if rl.Unlimited {
			if rl.Unit != "" {
				b.errorf(lineOf(ln, "unit"), "%s: unlimited must not have a unit", where)
			}
			if len(yamlLimits) > 1 {
				b.errorf(lineOf(ln, "unlimited"), "%s: unlimited cannot be one of several rate_limits", where)
			}
			r.Unlimited = true
			continue
		}
		if !unitOK {
			b.errorf(lineOf(ln, "unit"), "%s: unit %q: want second, minute, hour, day, week, month or year", where, rl.Unit)
			continue
		}
		if rl.UnitMultiplier != nil && *rl.UnitMultiplier == 0 {
			b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier must be > 0", where)
			continue
		}
		if rl.Burst != nil && *rl.Burst == 0 && rl.RequestsPerUnit > 0 {
			b.errorf(lineOf(ln, "burst"), "%s: burst must be > 0 (requests_per_unit: 0 denies every request)", where)
			continue
		}
		var mult, burst uint32
		if rl.UnitMultiplier != nil {
			mult = *rl.UnitMultiplier
		}
		if rl.Burst != nil {
			burst = *rl.Burst
		}
		lim := NewLimit(rl.Name, rl.RequestsPerUnit, unit, mult, burst)
		if err := lim.GCRA.Validate(); err != nil {
			b.errorf(lineOf(ln, ""), "%s: %v", where, err)
			continue
		}
		for _, rep := range rl.Replaces {
			switch {
			case rep.Name == "":
				b.errorf(lineOf(ln, "replaces"), "%s: replaces has an entry without a name", where)
			case rep.Name == rl.Name:
				b.errorf(lineOf(ln, "replaces"), "%s: a limit cannot replace itself (%q)", where, rep.Name)
			default:
				lim.Replaces = append(lim.Replaces, rep.Name)
			}
		}
		r.Limits = append(r.Limits, lim)
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

// field returns the value node of key in mapping node n, or nil.
func field(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// lineOf returns the line of key in mapping node n, or of n itself when the key is absent.
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

func seqItems(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

func nodeAt(nodes []*yaml.Node, i int) *yaml.Node {
	if i < len(nodes) {
		return nodes[i]
	}
	return nil
}

func nodeLine(nodes []*yaml.Node, i int) int {
	if n := nodeAt(nodes, i); n != nil {
		return n.Line
	}
	return 0
}
