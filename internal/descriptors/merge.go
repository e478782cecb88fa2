package descriptors

import (
	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/yamlnode"
)

// mergedDomain is one domain's top-level descriptors gathered from several files.
type mergedDomain struct {
	info  DomainInfo
	items []*yaml.Node
	files []string
	size  int // bytes of its files, for the decoding budget
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
	if yamlnode.IsNull(list) {
		return
	}
	seq := yamlnode.Deref(list)
	if seq.Kind != yaml.SequenceNode {
		b.errorf(list.Line, "descriptors at the top level must be a list, not %s", b.dec.KindOf(seq))
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
