package rlqs

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/rls-project/rls/internal/descriptors"
)

// Bounds on a bucket id. Envoy's bucket id builders (RateLimitQuotaBucketSettings'
// bucket_id_builder) make a few pairs whose keys are names written in the filter's
// configuration and whose values are a constant or one piece of the request (a header such as
// an API key, the client address, a path): 8 pairs, 128-byte keys and 512-byte values leave room
// for every such id while a hostile proxy's largest id is 5 KiB rather than 16 pairs of 1 KiB.
const (
	maxBucketKeys   = 8
	maxBucketKey    = 128 // bytes of one key
	maxBucketValue  = 512 // bytes of one value
	maxPermuteKeys  = 4   // up to 4! = 24 orders tried
	maxDomainLength = 256
)

// bucketID is a validated bucket id: its pairs sorted by key.
type bucketID []descriptors.Entry

// parseBucketID validates a bucket id's map and returns its pairs sorted by key.
func parseBucketID(m map[string]string) (bucketID, error) {
	if len(m) == 0 {
		return nil, fmt.Errorf("bucket_id has no key/value pairs")
	}
	if len(m) > maxBucketKeys {
		return nil, fmt.Errorf("bucket_id has %d pairs, more than %d", len(m), maxBucketKeys)
	}
	id := make(bucketID, 0, len(m))
	for k, v := range m {
		switch {
		case k == "":
			return nil, fmt.Errorf("bucket_id has an empty key")
		case len(k) > maxBucketKey:
			return nil, fmt.Errorf("bucket_id key %.32q: key longer than %d bytes", k, maxBucketKey)
		case len(v) > maxBucketValue:
			return nil, fmt.Errorf("bucket_id key %.32q: value longer than %d bytes", k, maxBucketValue)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return nil, fmt.Errorf("bucket_id key %.32q: key or value is not valid UTF-8", k)
		}
		id = append(id, descriptors.Entry{Key: k, Value: v})
	}
	slices.SortFunc(id, func(a, b descriptors.Entry) int { return strings.Compare(a.Key, b.Key) })
	return id, nil
}

// key is the id as one string, unambiguous whatever the keys and values hold:
// "len:domain" then "|len:key=len:value" for each pair in order. It is the one copy of a bucket
// id that rls keeps: entries reads the pairs back as parts of it.
func (id bucketID) key(domain string) string {
	n := len(domain) + 8
	for _, e := range id {
		n += len(e.Key) + len(e.Value) + 12
	}
	b := make([]byte, 0, n)
	b = strconv.AppendInt(b, int64(len(domain)), 10)
	b = append(b, ':')
	b = append(b, domain...)
	for _, e := range id {
		b = append(b, '|')
		b = strconv.AppendInt(b, int64(len(e.Key)), 10)
		b = append(b, ':')
		b = append(b, e.Key...)
		b = append(b, '=')
		b = strconv.AppendInt(b, int64(len(e.Value)), 10)
		b = append(b, ':')
		b = append(b, e.Value...)
	}
	return string(b)
}

// entries reads a key back: the domain and the pairs, each a part of key (nothing copied).
// ok is false for a string key did not make.
func entries(key string) (domain string, id bucketID, ok bool) {
	field := func(s string) (string, string, bool) {
		i := strings.IndexByte(s, ':')
		if i <= 0 {
			return "", "", false
		}
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > len(s)-i-1 {
			return "", "", false
		}
		return s[i+1 : i+1+n], s[i+1+n:], true
	}
	domain, rest, ok := field(key)
	if !ok {
		return "", nil, false
	}
	for rest != "" {
		if rest[0] != '|' {
			return "", nil, false
		}
		var k, v string
		if k, rest, ok = field(rest[1:]); !ok || rest == "" || rest[0] != '=' {
			return "", nil, false
		}
		if v, rest, ok = field(rest[1:]); !ok {
			return "", nil, false
		}
		id = append(id, descriptors.Entry{Key: k, Value: v})
	}
	return domain, id, true
}

// bucketProto is the BucketId of a key, for an answer; its strings are parts of key.
func bucketProto(key string) *rlqspb.BucketId {
	_, id, _ := entries(key)
	m := make(map[string]string, len(id))
	for _, e := range id {
		m[e.Key] = e.Value
	}
	return &rlqspb.BucketId{Bucket: m}
}

// String is the id as "k=v,k2=v2", sorted by key, for logs and the debug pages.
func (id bucketID) String() string {
	parts := make([]string, len(id))
	for i, e := range id {
		parts[i] = e.Key + "=" + e.Value
	}
	return strings.Join(parts, ",")
}

// match finds the rule of a bucket: the entries in sorted key order first, then, for up to
// maxPermuteKeys keys, every other order in lexicographic order of the permutations; the first
// that matches wins. It returns the rule (nil when none) and the order that matched.
func match(rs *descriptors.RuleSet, domain string, id bucketID) (*descriptors.Rule, []descriptors.Entry) {
	if rs == nil || !rs.HasDomain(domain) {
		return nil, nil
	}
	entries := slices.Clone([]descriptors.Entry(id))
	if r := rs.Match(domain, entries); r != nil {
		return r, entries
	}
	if len(entries) > maxPermuteKeys {
		return nil, nil
	}
	for nextPermutation(entries) {
		if r := rs.Match(domain, entries); r != nil {
			return r, entries
		}
	}
	return nil, nil
}

// nextPermutation rearranges e into the next order by key, lexicographically, reporting false
// (and leaving e sorted again) after the last.
func nextPermutation(e []descriptors.Entry) bool {
	i := len(e) - 2
	for i >= 0 && e[i].Key >= e[i+1].Key {
		i--
	}
	if i < 0 {
		slices.Reverse(e)
		return false
	}
	j := len(e) - 1
	for e[j].Key <= e[i].Key {
		j--
	}
	e[i], e[j] = e[j], e[i]
	slices.Reverse(e[i+1:])
	return true
}

// policy is what a bucket gets under its rule.
type policy struct {
	rule *descriptors.Rule // nil: no rule
	// allowAll: no limit applies (no rule, allow-listed, unlimited or shadow mode).
	allowAll bool
	lim      Budget
	index    int // of the limit divided in rule.Limits
}

// policyOf is the policy of a matched rule: its tightest limit (the lowest rate per second)
// divided among the proxies, or allow-all when nothing limits it.
func policyOf(r *descriptors.Rule) policy {
	if r == nil || r.Unlimited || r.ShadowMode || len(r.Limits) == 0 {
		return policy{rule: r, allowAll: true}
	}
	best := -1
	bestRate := math.Inf(1)
	for i, l := range r.Limits {
		per := l.Spec.Period.Seconds()
		if per <= 0 {
			continue
		}
		if rate := float64(l.Spec.Rate) / per; rate < bestRate {
			best, bestRate = i, rate
		}
	}
	if best < 0 {
		return policy{rule: r, allowAll: true}
	}
	l := r.Limits[best]
	return policy{rule: r, index: best, lim: Budget{
		Rate: l.Spec.Rate, PeriodMs: l.Spec.Period.Milliseconds(), Burst: l.Spec.Burst,
	}}
}

// domainLabel is a domain as a metric label: a domain of the rules, or "_unknown_" for any
// other, so that clients cannot add series by naming domains.
func domainLabel(rs *descriptors.RuleSet, domain string) string {
	if rs != nil && rs.HasDomain(domain) {
		return domain
	}
	return "_unknown_"
}

// ruleName names a rule in metrics: its path, or "_none_" for buckets without one.
func ruleName(r *descriptors.Rule) string {
	if r == nil {
		return "_none_"
	}
	return r.Path
}

// ttlDuration is ms milliseconds as a Duration.
func ttlDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
