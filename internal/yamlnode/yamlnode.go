// Package yamlnode decodes YAML files by hand from their yaml.Node trees, for the formats rls
// reads (rule files, caller policies): one document per file, mappings with known keys only,
// each set once, and every error at the line of the node it is about.
package yamlnode

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// An Error is one of yaml's own errors, with its line when yaml gave one (else 0).
type Error struct {
	Line int
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlError turns one of yaml's errors into an *Error.
func yamlError(err error) *Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{Line: line, Msg: m[2]}
	}
	return &Error{Msg: strings.TrimPrefix(msg, "yaml: ")}
}

// Read parses data's one document. It returns its top node, nil when the file holds nothing
// (no document, or a null one); second, the line of a second document that is not empty (0
// when none); and yaml's errors, as *Error.
func Read(data []byte) (doc *yaml.Node, second int, errs []error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, 0, nil
		}
		return nil, 0, []error{yamlError(err)}
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil && len(next.Content) > 0 && !IsNull(next.Content[0]):
		second = next.Content[0].Line
	case err != nil && !errors.Is(err, io.EOF):
		errs = append(errs, yamlError(err))
	}
	if len(root.Content) == 0 || IsNull(root.Content[0]) {
		return nil, second, errs
	}
	return root.Content[0], second, errs
}

// Deref follows an alias to the node its anchor names.
func Deref(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 8; i++ {
		n = n.Alias
	}
	return n
}

// IsNull reports whether n is absent or a null scalar (~, null or nothing), through aliases.
func IsNull(n *yaml.Node) bool {
	n = Deref(n)
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// KindOf names what n is, for errors: "a list", "a mapping", "an alias", "null", a quoted
// string or a scalar as written.
func KindOf(n *yaml.Node) string {
	switch {
	case n == nil:
		return "nothing"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.AliasNode:
		return "an alias"
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null":
		return "null"
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		return strconv.Quote(n.Value)
	case n.Kind == yaml.ScalarNode:
		return n.Value
	}
	return "an unsupported node"
}

// Field returns the value of key in mapping n, or nil.
func Field(n *yaml.Node, key string) *yaml.Node {
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

// MaxMergeDepth bounds merge keys ("<<") that merge mappings that merge again.
const MaxMergeDepth = 8

// A Decoder walks the mappings of one file. The zero value refuses aliases and merge keys.
type Decoder struct {
	// Errorf records an error about the file at line.
	Errorf func(line int, format string, args ...any)
	// Aliases follows aliases and merge keys ("<<") as yaml does; without it they are
	// refused, naming the format as Format says ("a caller policy").
	Aliases bool
	Format  string
	// Spend, when set, is charged the keys of each mapping walked (and 1) at its node, and
	// stops the walk when it returns false: anchors and aliases can make a small file expand
	// to very many nodes.
	Spend func(at *yaml.Node, n int) bool
}

// KindOf names what n is, following aliases when the decoder does.
func (d *Decoder) KindOf(n *yaml.Node) string {
	if d.Aliases {
		n = Deref(n)
	}
	return KindOf(n)
}

// Mapping calls f with the index in known of each key of mapping n, the key and its value.
// Unknown keys, repeated keys and keys that are not strings are reported, naming n as what.
// With Aliases, merge keys are followed as yaml does (a key set in n wins over a merged one,
// and of several merged mappings the first wins); without, merge keys and aliased values are
// reported. known holds at most 64 keys.
func (d *Decoder) Mapping(n *yaml.Node, what string, known []string, f func(field int, key, val *yaml.Node)) {
	var seen uint64
	d.mapping(n, what, known, f, &seen, 0)
}

func (d *Decoder) mapping(n *yaml.Node, what string, known []string, f func(int, *yaml.Node, *yaml.Node), seen *uint64, depth int) {
	if d.Spend != nil && !d.Spend(n, len(n.Content)/2+1) {
		return
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.ShortTag() == "!!merge" {
			if !d.Aliases {
				d.Errorf(k.Line, "merge keys (<<) are not supported in %s", d.Format)
				continue
			}
			merges = append(merges, v)
			continue
		}
		if d.Aliases {
			k = Deref(k)
		}
		if k.Kind != yaml.ScalarNode {
			d.Errorf(k.Line, "a key in %s must be a string, not %s", what, KindOf(k))
			continue
		}
		j := slices.Index(known, k.Value)
		switch {
		case j < 0:
			d.Errorf(k.Line, "unknown key %s in %s (known: %s)", k.Value, what, strings.Join(known, ", "))
			continue
		case *seen&(1<<j) != 0:
			if depth == 0 {
				d.Errorf(k.Line, "key %s set twice in %s", k.Value, what)
			}
			continue
		case !d.Aliases && v.Kind == yaml.AliasNode:
			d.Errorf(v.Line, "%s: anchors and aliases are not supported in %s", k.Value, d.Format)
			continue
		}
		*seen |= 1 << j
		f(j, k, v)
	}
	for _, m := range merges {
		if depth >= MaxMergeDepth {
			d.Errorf(m.Line, "merge keys (<<) nested deeper than %d", MaxMergeDepth)
			return
		}
		items := []*yaml.Node{m}
		if dm := Deref(m); dm.Kind == yaml.SequenceNode {
			items = dm.Content
		}
		for _, it := range items {
			if dm := Deref(it); dm.Kind == yaml.MappingNode {
				d.mapping(dm, what, known, f, seen, depth+1)
			} else {
				d.Errorf(it.Line, "a merge (<<) needs a mapping or a list of mappings, not %s", KindOf(Deref(it)))
			}
		}
	}
}

// FileError formats err, one of Read's, as "name:line: message".
func FileError(name string, err error) error {
	var e *Error
	if errors.As(err, &e) && e.Line > 0 {
		return fmt.Errorf("%s:%d: %s", name, e.Line, e.Msg)
	}
	return fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
}
