package rlqs

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rls-project/rls/internal/descriptors"
)

// Bounds on a bucket id: Envoy's bucket id builders make a few short pairs.
const (
	maxBucketKeys   = 16
	maxBucketField  = 1024 // bytes of one key or value
	maxPermuteKeys  = 4    // up to 4! = 24 orders tried
	maxDomainLength = 1024
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
		case len(k) > maxBucketField || len(v) > maxBucketField:
			return nil, fmt.Errorf("bucket_id key %.32q: key or value longer than %d bytes", k, maxBucketField)
		case !utf8.ValidString(k) || !utf8.ValidString(v):
			return nil, fmt.Errorf("bucket_id key %.32q: key or value is not valid UTF-8", k)
		}
		id = append(id, descriptors.Entry{Key: k, Value: v})
	}
	slices.SortFunc(id, func(a, b descriptors.Entry) int { return strings.Compare(a.Key, b.Key) })
	return id, nil
}

// key is the id as one string, unambiguous whatever the keys and values hold.
func (id bucketID) key(domain string) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(domain)))
	b.WriteByte(':')
	b.WriteString(domain)
	for _, e := range id {
		fmt.Fprintf(&b, "|%d:%s=%d:%s", len(e.Key), e.Key, len(e.Value), e.Value)
	}
	return b.String()
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
	lim      Limit
	limit    descriptors.Limit
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
		per := l.GCRA.Period.Seconds()
		if per <= 0 {
			continue
		}
		if rate := float64(l.GCRA.Rate) / per; rate < bestRate {
			best, bestRate = i, rate
		}
	}
	if best < 0 {
		return policy{rule: r, allowAll: true}
	}
	l := r.Limits[best]
	return policy{rule: r, limit: l, lim: Limit{
		Rate: l.GCRA.Rate, PeriodMs: l.GCRA.Period.Milliseconds(), Burst: l.GCRA.Burst,
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
