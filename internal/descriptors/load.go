package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/backend"
)

// Bounds on what a rule file may hold; requests are bounded alike in package service.
const (
	MaxDepth      = 32
	MaxKeyBytes   = 256
	MaxValueBytes = 4096
)

// Options changes how rule files are found and combined. The zero value is rls's own layout.
type Options struct {
	// AllFiles loads every regular file of a directory and of its subdirectories, whatever its
	// name, as envoyproxy/ratelimit's runtime directory is read; otherwise only the directory's
	// own *.yaml and *.yml files.
	AllFiles bool
	// DotFiles also loads files and directories whose names start with '.'. Leave it off for a
	// Kubernetes ConfigMap mount, whose ..data entries hold a second copy of every file.
	DotFiles bool
	// MergeDomains merges files that define the same domain (their descriptors put together)
	// instead of rejecting the second, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does.
	MergeDomains bool
}

// Load loads a rule file, or every *.yaml and *.yml file of a directory (not recursing, skipping
// names that start with '.', which covers Kubernetes ConfigMap mounts' ..data entries). Every
// problem found is returned at once, joined, each naming its file and line.
func Load(path string) (*RuleSet, error) { return LoadWith(path, Options{}) }

// LoadWith is Load with opts.
func LoadWith(path string, opts Options) (*RuleSet, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("descriptors: %w", err)
	}
	if !info.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("descriptors: %w", err)
		}
		return ParseWith(map[string][]byte{path: data}, opts)
	}
	return loadFS(os.DirFS(path), ".", path, opts)
}

// LoadFS loads the rule files of directory dir of fsys; prefix is prepended to file names in
// errors and in RuleSet.Files.
func LoadFS(fsys fs.FS, dir, prefix string) (*RuleSet, error) {
	return loadFS(fsys, dir, prefix, Options{})
}

func loadFS(fsys fs.FS, dir, prefix string, opts Options) (*RuleSet, error) {
	files := map[string][]byte{}
	root := filepath.ToSlash(filepath.Clean(dir))
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		entries, err := fs.ReadDir(fsys, dir)
		if err != nil {
			return fmt.Errorf("descriptors: %w", err)
		}
		for _, e := range entries {
			name := e.Name()
			if strings.HasPrefix(name, ".") && !opts.DotFiles {
				continue
			}
			p := filepath.ToSlash(filepath.Join(dir, name))
			info, err := fs.Stat(fsys, p) // follows symlinks
			if err != nil {
				continue
			}
			if info.IsDir() {
				// Subdirectories only when loading every file, and not through a symlink
				// (e.IsDir is false for one), which envoyproxy/ratelimit's runtime does not
				// follow either.
				if opts.AllFiles && e.IsDir() && depth < MaxDepth {
					if err := walk(p, depth+1); err != nil {
						return err
					}
				}
				continue
			}
			if !opts.AllFiles && !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
				continue
			}
			data, err := fs.ReadFile(fsys, p)
			if err != nil {
				return fmt.Errorf("descriptors: %w", err)
			}
			rel := p
			if root != "." {
				rel = strings.TrimPrefix(p, root+"/")
			}
			files[filepath.Join(prefix, filepath.FromSlash(rel))] = data
		}
		return nil
	}
	if err := walk(dir, 0); err != nil {
		return nil, err
	}
	if len(files) == 0 {
		if opts.AllFiles {
			return nil, fmt.Errorf("descriptors: %s: no rule files", prefix)
		}
		return nil, fmt.Errorf("descriptors: %s: no *.yaml or *.yml rule files", prefix)
	}
	return ParseWith(files, opts)
}

// Parse builds a RuleSet from rule files given as name → content.
func Parse(files map[string][]byte) (*RuleSet, error) { return ParseWith(files, Options{}) }

// ParseWith is Parse with opts (only MergeDomains applies).
func ParseWith(files map[string][]byte, opts Options) (*RuleSet, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	b := &builder{rs: &RuleSet{domains: map[string]*level{}, Files: names}, domainFile: map[string]string{}}
	if opts.MergeDomains {
		b.merged = map[string]*mergedDomain{}
	}
	for _, name := range names {
		b.file(name, files[name])
	}
	b.buildMerged()
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
	// visits counts the nodes decoded from the file, which anchors and aliases can make many
	// more than it holds; budget bounds them (see spend).
	visits, budget int
	overBudget     bool
	metadata       map[*yaml.Node]decodedMetadata // by mapping
	// merged holds, with Options.MergeDomains, each domain's descriptors from every file that
	// defines it, built once all files are read; nil otherwise.
	merged map[string]*mergedDomain
	order  []string // merged's domains in the order first seen
	// itemFile names the file of each top-level descriptor of a merged domain.
	itemFile map[*yaml.Node]string
}

// mergedDomain is one domain's top-level descriptors gathered from several files.
type mergedDomain struct {
	info  DomainInfo
	items []*yaml.Node
	files []string
	size  int // bytes of its files, for the decoding budget
}

func (b *builder) errorf(line int, format string, args ...any) {
	prefix := fmt.Sprintf("%s:%d: ", b.name, line)
	if b.domain != "" {
		prefix += fmt.Sprintf("domain %q: ", b.domain)
	}
	b.errs = append(b.errs, errors.New(prefix+fmt.Sprintf(format, args...)))
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlError turns one of yaml's messages into "file:line: message".
func (b *builder) yamlError(msg string) {
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		b.errs = append(b.errs, fmt.Errorf("%s:%s: %s", b.name, m[1], m[2]))
		return
	}
	b.errs = append(b.errs, fmt.Errorf("%s: %s", b.name, strings.TrimPrefix(msg, "yaml: ")))
}

func (b *builder) file(name string, data []byte) {
	b.name, b.domain = name, ""
	b.visits, b.budget, b.overBudget, b.metadata = 0, len(data)+10000, false, nil
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			b.errorf(1, "empty rule file: want a domain and descriptors")
		} else {
			b.yamlError(err.Error())
		}
		return
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil && len(next.Content) > 0 && !isNull(next.Content[0]):
		b.errorf(next.Content[0].Line, "a second YAML document: a rule file holds one domain (put each in its own file)")
	case err != nil && !errors.Is(err, io.EOF):
		b.yamlError(err.Error())
	}
	if len(root.Content) == 0 || isNull(root.Content[0]) {
		b.errorf(1, "empty rule file: want a domain and descriptors")
		return
	}
	doc := deref(root.Content[0])
	if doc.Kind != yaml.MappingNode {
		b.errorf(doc.Line, "a rule file must be a mapping with a domain and descriptors, not %s", kindOf(doc))
		return
	}
	var list *yaml.Node
	b.mapping(doc, "RuleFile", ruleFileFields, func(field int, k, v *yaml.Node) {
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
	if isNull(list) {
		return nil
	}
	where := "at the top level"
	if path != "" {
		where = "under " + strings.TrimSuffix(path, "/")
	}
	seq := deref(list)
	if seq.Kind != yaml.SequenceNode {
		b.errorf(list.Line, "descriptors %s must be a list, not %s", where, kindOf(seq))
		return nil
	}
	if len(seq.Content) == 0 {
		return nil
	}
	if len(share) >= MaxDepth {
		b.errorf(list.Line, "descriptors nested deeper than %d levels", MaxDepth)
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
		n := deref(item)
		if isNull(n) {
			b.errorf(item.Line, "descriptor #%d %s is empty (null)", i+1, where)
			continue
		}
		if n.Kind != yaml.MappingNode {
			b.errorf(item.Line, "descriptor #%d %s must be a mapping, not %s", i+1, where, kindOf(n))
			continue
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
			continue
		case len(d.Key) > MaxKeyBytes:
			b.errorf(line, "descriptor %s: key longer than %d bytes", here, MaxKeyBytes)
			continue
		case len(d.Value) > MaxValueBytes:
			b.errorf(line, "descriptor %s: value longer than %d bytes", here, MaxValueBytes)
			continue
		}
		// The key and value are kept as parts of here, which the rule keeps as its Path, so
		// the tree holds no second copy of them.
		key := here[len(path) : len(path)+len(d.Key)]
		value := here[len(here)-len(d.Value):]
		kb := builds[key]
		if kb == nil {
			kb = &keyBuild{i: len(lv.keys)}
			builds[key] = kb
			lv.keys = append(lv.keys, keyNodes{key: key})
		}
		kn := &lv.keys[kb.i] // not kept: lv.keys may grow
		nd := &node{}
		wild := strings.Contains(value, "*")
		switch {
		case value == "":
			if kn.def != nil {
				b.errorf(line, "descriptor %s: duplicate key without value", here)
				continue
			}
			kn.def = nd
		case wild:
			if kb.wild[value] {
				b.errorf(line, "descriptor %s: duplicate value", here)
				continue
			}
			if kb.wild == nil {
				kb.wild = map[string]bool{}
			}
			kb.wild[value] = true
			kn.wild = append(kn.wild, newWildNode(value, nd))
		default:
			if kb.exact[value] != nil {
				b.errorf(line, "descriptor %s: duplicate value", here)
				continue
			}
			if kb.exact == nil {
				kb.exact = map[string]*node{}
			}
			kb.exact[value] = nd
		}
		myShare := append(slices.Clip(share), "")
		if d.ShareThreshold {
			if !wild {
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
		seq := deref(d.limits)
		if seq.Kind != yaml.SequenceNode {
			b.errorf(d.limits.Line, "descriptor %s: rate_limits must be a list, not %s", path, kindOf(seq))
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
		return nil
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
	for i, item := range limitNodes {
		where := fmt.Sprintf("descriptor %s", path)
		if len(limitNodes) > 1 {
			where += fmt.Sprintf(": rate_limits[%d]", i)
		}
		ln := deref(item)
		if isNull(ln) {
			b.errorf(item.Line, "descriptor %s: rate_limits[%d] is empty (null)", path, i)
			continue
		}
		if ln.Kind != yaml.MappingNode {
			if d.limit != nil {
				b.errorf(item.Line, "%s: rate_limit must be a mapping, not %s", where, kindOf(ln))
			} else {
				b.errorf(item.Line, "descriptor %s: rate_limits[%d] must be a mapping, not %s", path, i, kindOf(ln))
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
		if lim, ok := b.limitOf(rl, where); ok {
			r.Limits = append(r.Limits, lim)
		}
	}
	info.Rules = append(info.Rules, r)
	return r
}

// locations holds the time zones loaded so far, by name: a zone loads once per process, and
// limits under one zone share its *time.Location (so equal limits compare equal across reloads).
var locations sync.Map // string → *time.Location

func loadLocation(name string) (*time.Location, error) {
	if l, ok := locations.Load(name); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	actual, _ := locations.LoadOrStore(name, l)
	return actual.(*time.Location), nil
}

// windowOf aligns a fixed_window limit of mult units: to the epoch in UTC for units up to a
// day, weeks from Monday, calendar months and years, and days and weeks in loc when it is not UTC.
func windowOf(unit Unit, mult uint32, loc *time.Location) backend.Window {
	utc := loc == nil || loc == time.UTC
	switch {
	case unit == Week && utc:
		return backend.Window{Offset: 4 * 86400 * 1e6} // 1970-01-05 was a Monday
	case unit == Day && !utc:
		return backend.Window{Calendar: backend.Day, Every: int64(mult), Location: loc}
	case unit == Week:
		return backend.Window{Calendar: backend.Week, Every: int64(mult), Location: loc}
	case unit == Month, unit == Year:
		cal := backend.Month
		if unit == Year {
			cal = backend.Year
		}
		if loc == nil {
			loc = time.UTC
		}
		return backend.Window{Calendar: cal, Every: int64(mult), Location: loc}
	}
	return backend.Window{}
}

// limitOf validates one rate_limit that is not unlimited. It returns ok false for an error,
// already recorded.
func (b *builder) limitOf(rl rawLimit, where string) (Limit, bool) {
	ln := rl.node
	unit, unitOK := ParseUnit(rl.Unit)
	perUnit, _, err := count(rl.perUnit)
	if err != nil {
		b.errorf(lineOf(ln, "requests_per_unit"), "%s: requests_per_unit %v", where, err)
	}
	mult, multSet, merr := count(rl.multi)
	if merr != nil {
		b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier %v", where, merr)
	}
	burst, burstSet, berr := count(rl.burst)
	if berr != nil {
		b.errorf(lineOf(ln, "burst"), "%s: burst %v", where, berr)
	}
	if err != nil || merr != nil || berr != nil {
		return Limit{}, false
	}
	if !unitOK {
		b.errorf(lineOf(ln, "unit"), "%s: unit %q: want second, minute, hour, day, week, month or year", where, rl.Unit)
		return Limit{}, false
	}
	if multSet && mult == 0 {
		b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier must be > 0", where)
		return Limit{}, false
	}
	if longest := int64(backend.MaxTolerance / time.Second); unit.Seconds()*int64(max(mult, 1)) > longest {
		b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier %d: a period of %d %ss is longer than the longest supported, %d days",
			where, mult, mult, unit, longest/86400)
		return Limit{}, false
	}
	if burstSet && burst == 0 && perUnit > 0 {
		b.errorf(lineOf(ln, "burst"), "%s: burst must be > 0 (requests_per_unit: 0 denies every request)", where)
		return Limit{}, false
	}
	alg, ok := backend.ParseAlgorithm(rl.Algorithm)
	if !ok {
		b.errorf(lineOf(ln, "algorithm"), "%s: algorithm %q: want one of %s", where, rl.Algorithm, strings.Join(backend.Algorithms, ", "))
		return Limit{}, false
	}
	if alg != backend.GCRA {
		if burstSet {
			b.errorf(lineOf(ln, "burst"), "%s: burst applies to algorithm gcra only: %v admits requests_per_unit per window", where, alg)
			return Limit{}, false
		}
		burst = perUnit
	}
	if rl.Overdraft && alg != backend.GCRA && alg != backend.FixedWindow {
		b.errorf(lineOf(ln, "overdraft"), "%s: overdraft applies to algorithms gcra and fixed_window, not %v: it charges hits that went over, which %v cannot hold",
			where, alg, alg)
		return Limit{}, false
	}
	var loc *time.Location
	if rl.Timezone != "" {
		switch {
		case alg != backend.FixedWindow:
			b.errorf(lineOf(ln, "timezone"), "%s: timezone applies to algorithm fixed_window only", where)
			return Limit{}, false
		case unit != Day && unit != Week && unit != Month && unit != Year:
			b.errorf(lineOf(ln, "timezone"), "%s: timezone applies to units day, week, month and year, not %s", where, unit)
			return Limit{}, false
		}
		var lerr error
		if loc, lerr = loadLocation(rl.Timezone); lerr != nil || rl.Timezone == "Local" {
			b.errorf(lineOf(ln, "timezone"), "%s: timezone %q: not a known IANA time zone name", where, rl.Timezone)
			return Limit{}, false
		}
	}
	lim := NewLimit(rl.Name, perUnit, unit, mult, burst)
	lim.GCRA.Overdraft = rl.Overdraft
	lim.GCRA.Algorithm = alg
	if alg == backend.FixedWindow {
		lim.GCRA.Window = windowOf(unit, lim.UnitMultiplier, loc)
	}
	lim.Timezone = rl.Timezone
	if err := lim.GCRA.Validate(); err != nil {
		b.errorf(ln.Line, "%s: %v", where, err)
		return Limit{}, false
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
	return lim, true
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

// mergeFile gathers the top-level descriptors of the file being read into its domain's.
func (b *builder) mergeFile(name string, size int, list *yaml.Node) {
	md := b.merged[b.domain]
	if md == nil {
		md = &mergedDomain{info: DomainInfo{Name: b.domain, File: name}}
		b.merged[b.domain] = md
		b.order = append(b.order, b.domain)
	}
	md.files = append(md.files, name)
	md.size += size
	if isNull(list) {
		return
	}
	seq := deref(list)
	if seq.Kind != yaml.SequenceNode {
		b.errorf(list.Line, "descriptors at the top level must be a list, not %s", kindOf(seq))
		return
	}
	if b.itemFile == nil {
		b.itemFile = map[*yaml.Node]string{}
	}
	for _, item := range seq.Content {
		b.itemFile[item] = name
		md.items = append(md.items, item)
	}
}

// buildMerged builds the domains gathered by mergeFile, each from its files' descriptors
// together: a descriptor defined in two of them is a duplicate, reported where it appears.
func (b *builder) buildMerged() {
	for _, domain := range b.order {
		md := b.merged[domain]
		b.name, b.domain = md.files[0], domain
		b.visits, b.budget, b.overBudget, b.metadata = 0, md.size+10000*len(md.files), false, nil
		info := md.info
		list := &yaml.Node{Kind: yaml.SequenceNode, Content: md.items, Line: 1}
		if len(md.items) == 0 {
			list = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
		}
		b.rs.domains[domain] = b.level(list, nil, "", &info)
		b.rs.Domains = append(b.rs.Domains, info)
	}
}
