package descriptors

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/api"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/yamlnode"
)

// A rule file is parsed once into a yaml.Node tree and decoded from it by hand, not by
// reflection into package api's types: one pass gives every value its line, reports unknown and
// repeated keys, null list items and counts that are not whole numbers, and keeps no second
// decoded copy of the file in memory while the tree is built.

// The keys of each mapping of the format: package api's yaml tags, so that a field added there
// is a key here. Each decoder below has a case for every key, and its default reports a key it
// does not decode (TestEveryAPIFieldDecoded holds them to api).
var (
	ruleFileFields    = yamlKeys(reflect.TypeFor[api.RuleFile]())
	descriptorFields  = yamlKeys(reflect.TypeFor[api.Descriptor]())
	rateLimitFields   = yamlKeys(reflect.TypeFor[api.RateLimit]())
	replaceFields     = yamlKeys(reflect.TypeFor[api.Replace]())
	concurrencyFields = yamlKeys(reflect.TypeFor[api.Concurrency]())
)

// yamlKeys lists the yaml keys of struct type t's fields, in order. A mapping marks the keys it
// has seen in one uint64, so a type has at most 64 (which the test holds).
func yamlKeys(t reflect.Type) []string {
	keys := make([]string, t.NumField())
	for i := range keys {
		keys[i], _, _ = strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
	}
	return keys
}

// undecoded reports a key of package api that the decoder of typ has no case for.
func (b *builder) undecoded(k *yaml.Node, typ string) {
	b.rawf(k.Line, "key %s in %s is in package api but not decoded", k.Value, typ)
}

// decodedMetadata is a metadata mapping decoded, with its number of values.
type decodedMetadata struct {
	value map[string]any
	size  int
}

// valueSize counts the values in v, which yaml decoded: maps, lists and scalars.
func valueSize(v any) int {
	n := 1
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			n += valueSize(e)
		}
	case []any:
		for _, e := range v {
			n += valueSize(e)
		}
	}
	return n
}

// rawDescriptor is a descriptor mapping decoded but for its children and limits, which are
// built later from their nodes (Descriptors, RateLimit and RateLimits stay unset).
type rawDescriptor struct {
	api.Descriptor
	node     *yaml.Node
	children *yaml.Node // the descriptors list; nil when absent or null
	limit    *yaml.Node // rate_limit; nil when absent or null
	limits   *yaml.Node // rate_limits; nil when absent or null
	conc     *yaml.Node // concurrency; nil when absent or null
}

// rawLimit is a rate_limit mapping decoded but for its counts, which are parsed from their
// nodes once the descriptor's path is known (RequestsPerUnit, Burst and UnitMultiplier stay unset).
type rawLimit struct {
	api.RateLimit
	node                  *yaml.Node
	perUnit, burst, multi *yaml.Node
}

// spend charges n units of work, done at node at, to the file's budget. It reports false, and
// records the error once, when the budget is spent: anchors and aliases can make a small file
// expand to very many nodes, while a file without them never spends more than its size.
func (b *builder) spend(at *yaml.Node, n int) bool {
	b.visits += n
	if b.visits <= b.budget {
		return true
	}
	if !b.overBudget {
		b.overBudget = true
		b.errorf(at.Line, "anchors and aliases expand the file to more than %d nodes", b.budget)
	}
	return false
}

// rawf records an error about the file's shape, named by file and line only (as yaml's own).
func (b *builder) rawf(line int, format string, args ...any) {
	b.errs = append(b.errs, fmt.Errorf("%s:%d: %s", b.name, line, fmt.Sprintf(format, args...)))
}

// str decodes a string; null is "".
func (b *builder) str(v *yaml.Node, name string) string {
	n := yamlnode.Deref(v)
	if n.Kind != yaml.ScalarNode {
		b.errorf(v.Line, "%s must be a string, not %s", name, b.dec.KindOf(n))
		return ""
	}
	switch n.ShortTag() {
	case "!!null":
		return ""
	case "!!binary":
		var s string
		if err := n.Decode(&s); err != nil {
			b.errorf(v.Line, "%s: %v", name, err)
		}
		return s
	}
	return n.Value
}

// boolean decodes true or false (and yaml 1.1's yes, no, on and off, as yaml does for booleans).
func (b *builder) boolean(v *yaml.Node, name string) bool {
	var x bool
	if yamlnode.IsNull(v) {
		return false
	}
	if n := yamlnode.Deref(v); n.Kind != yaml.ScalarNode || n.Decode(&x) != nil {
		b.errorf(v.Line, "%s must be true or false, not %s", name, b.dec.KindOf(v))
	}
	return x
}

// count parses a whole number from 0 to 2³²-1. A null or absent value is unset (set false).
// A float with no fraction (100.0, 1e3) is accepted as the whole number it is.
func count(v *yaml.Node) (n uint32, set bool, err error) {
	if yamlnode.IsNull(v) {
		return 0, false, nil
	}
	s := yamlnode.Deref(v)
	if s.Kind != yaml.ScalarNode {
		return 0, true, fmt.Errorf("must be a whole number, not %s", yamlnode.KindOf(s))
	}
	plain := strings.ReplaceAll(s.Value, "_", "")
	switch s.ShortTag() {
	case "!!int":
		i, err := strconv.ParseInt(plain, 0, 64)
		switch {
		case err != nil && !errors.Is(err, strconv.ErrRange):
			return 0, true, fmt.Errorf("must be a whole number, got %s", s.Value)
		case err != nil && strings.HasPrefix(plain, "-"), err == nil && i < 0:
			return 0, true, fmt.Errorf("must not be negative, got %s", s.Value)
		case err != nil, i > math.MaxUint32:
			return 0, true, fmt.Errorf("must be at most %d, got %s", uint32(math.MaxUint32), s.Value)
		}
		return uint32(i), true, nil
	case "!!float":
		f, err := strconv.ParseFloat(plain, 64)
		switch {
		case err != nil && !math.IsInf(f, 0), math.IsNaN(f):
			return 0, true, fmt.Errorf("must be a whole number, got %s", s.Value)
		case f < 0:
			return 0, true, fmt.Errorf("must not be negative, got %s", s.Value)
		case f > math.MaxUint32:
			return 0, true, fmt.Errorf("must be at most %d, got %s", uint32(math.MaxUint32), s.Value)
		case f != math.Trunc(f):
			return 0, true, fmt.Errorf("must be a whole number, got %s", s.Value)
		}
		return uint32(f), true, nil
	}
	return 0, true, fmt.Errorf("must be a whole number, not %s", yamlnode.KindOf(s))
}

// descriptor decodes one descriptor mapping.
func (b *builder) descriptor(n *yaml.Node) rawDescriptor {
	d := rawDescriptor{node: n}
	b.dec.Mapping(n, "Descriptor", descriptorFields, func(field int, k, v *yaml.Node) {
		switch descriptorFields[field] {
		case "key":
			d.Key = b.str(v, "key")
		case "value":
			d.Value = b.str(v, "value")
		case "rate_limit":
			if !yamlnode.IsNull(v) {
				d.limit = v
			}
		case "rate_limits":
			if !yamlnode.IsNull(v) {
				d.limits = v
			}
		case "concurrency":
			if !yamlnode.IsNull(v) {
				d.conc = v
			}
		case "descriptors":
			if !yamlnode.IsNull(v) {
				d.children = v
			}
		case "shadow_mode":
			d.ShadowMode = b.boolean(v, "shadow_mode")
		case "quota_mode":
			d.QuotaMode = b.boolean(v, "quota_mode")
		case "detailed_metric":
			d.DetailedMetric = b.boolean(v, "detailed_metric")
		case "value_to_metric":
			d.ValueToMetric = b.boolean(v, "value_to_metric")
		case "share_threshold":
			d.ShareThreshold = b.boolean(v, "share_threshold")
		case "metadata":
			if yamlnode.IsNull(v) {
				return
			}
			if yamlnode.Deref(v).Kind != yaml.MappingNode {
				b.errorf(k.Line, "metadata must be a mapping, not %s", b.dec.KindOf(v))
				return
			}
			// Decoded once per mapping, however many aliases reach it (rules only read it), and
			// charged by its size at each use, since each rule checks it.
			m := yamlnode.Deref(v)
			md, ok := b.metadata[m]
			if !ok {
				if err := m.Decode(&md.value); err != nil {
					b.errorf(k.Line, "metadata: %s", strings.TrimPrefix(err.Error(), "yaml: "))
				}
				md.size = valueSize(md.value)
				if b.metadata == nil {
					b.metadata = map[*yaml.Node]decodedMetadata{}
				}
				b.metadata[m] = md
			}
			if b.spend(v, md.size) {
				d.Metadata = md.value
			}
		case "failure_mode":
			d.FailureMode = b.str(v, "failure_mode")
		default:
			b.undecoded(k, "Descriptor")
		}
	})
	return d
}

// limit decodes one rate_limit mapping.
func (b *builder) limit(n *yaml.Node) rawLimit {
	l := rawLimit{node: n}
	b.dec.Mapping(n, "RateLimit", rateLimitFields, func(field int, k, v *yaml.Node) {
		switch rateLimitFields[field] {
		case "unit":
			l.Unit = b.str(v, "unit")
		case "requests_per_unit":
			l.perUnit = v
		case "unlimited":
			l.Unlimited = b.boolean(v, "unlimited")
		case "name":
			l.Name = b.str(v, "name")
		case "replaces":
			if yamlnode.IsNull(v) {
				return
			}
			list := yamlnode.Deref(v)
			if list.Kind != yaml.SequenceNode {
				b.errorf(v.Line, "replaces must be a list, not %s", b.dec.KindOf(v))
				return
			}
			if !b.spend(v, len(list.Content)) {
				return
			}
			for _, it := range list.Content {
				var r api.Replace
				if m := yamlnode.Deref(it); m.Kind == yaml.MappingNode {
					b.dec.Mapping(m, "Replace", replaceFields, func(field int, k, v *yaml.Node) {
						if replaceFields[field] == "name" {
							r.Name = b.str(v, "name")
						} else {
							b.undecoded(k, "Replace")
						}
					})
				} else if !yamlnode.IsNull(m) {
					b.errorf(it.Line, "replaces: an entry must be a mapping with a name, not %s", b.dec.KindOf(m))
					continue
				}
				l.Replaces = append(l.Replaces, r)
			}
		case "burst":
			l.burst = v
		case "unit_multiplier":
			l.multi = v
		case "overdraft":
			l.Overdraft = b.boolean(v, "overdraft")
		case "global":
			g := b.boolean(v, "global")
			l.Global = &g
		case "algorithm":
			l.Algorithm = b.str(v, "algorithm")
		case "timezone":
			l.Timezone = b.str(v, "timezone")
		default:
			b.undecoded(k, "RateLimit")
		}
	})
	return l
}

// concurrency decodes and validates a concurrency mapping into its limit (KeyTag
// concurrencyTag). It returns ok false for an error, already recorded.
func (b *builder) concurrency(v *yaml.Node, path string) (Limit, bool) {
	n := yamlnode.Deref(v)
	where := "descriptor " + path + ": concurrency"
	if n.Kind != yaml.MappingNode {
		b.errorf(v.Line, "%s must be a mapping, not %s", where, b.dec.KindOf(n))
		return Limit{}, false
	}
	var maxNode *yaml.Node
	var lifetime string
	b.dec.Mapping(n, "Concurrency", concurrencyFields, func(field int, k, v *yaml.Node) {
		switch concurrencyFields[field] {
		case "max_in_flight":
			maxNode = v
		case "slot_lifetime":
			lifetime = b.str(v, "slot_lifetime")
		default:
			b.undecoded(k, "Concurrency")
		}
	})
	most, set, err := count(maxNode)
	switch {
	case err != nil:
		b.errorf(lineOf(n, "max_in_flight"), "%s: max_in_flight %v", where, err)
		return Limit{}, false
	case !set:
		b.errorf(n.Line, "%s: max_in_flight is required", where)
		return Limit{}, false
	case lifetime == "":
		b.errorf(n.Line, "%s: slot_lifetime is required (how long a slot never released stays held, e.g. 10m)", where)
		return Limit{}, false
	}
	d, perr := time.ParseDuration(lifetime)
	if perr != nil {
		b.errorf(lineOf(n, "slot_lifetime"), "%s: slot_lifetime %q: want a duration such as 90s or 10m", where, lifetime)
		return Limit{}, false
	}
	lim := Limit{
		RequestsPerUnit: most, Unit: limit.Second, UnitMultiplier: 1, Burst: most, KeyTag: concurrencyTag,
		Spec: limit.Limit{Rate: int64(most), Burst: int64(most), Period: d, Algorithm: limit.Concurrency},
	}
	if s := int64(d / time.Second); d%time.Second == 0 && s > 0 && s <= math.MaxUint32 {
		lim.UnitMultiplier = uint32(s)
	}
	if err := lim.Spec.Validate(); err != nil {
		var e *limit.Error
		key := "max_in_flight"
		if errors.As(err, &e) && e.Field == limit.PeriodField {
			key = "slot_lifetime"
		}
		msg := err.Error()
		if e != nil {
			msg = e.Reason
			if e.Value != "" && key == "max_in_flight" {
				msg = fmt.Sprint(most) + " " + msg
			} else if key == "slot_lifetime" {
				msg = lifetime + " " + msg
			}
		}
		b.errorf(lineOf(n, key), "%s: %s %s", where, key, msg)
		return Limit{}, false
	}
	return lim, true
}
