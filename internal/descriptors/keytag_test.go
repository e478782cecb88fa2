package descriptors

import (
	"strings"
	"testing"
)

// keyTagRules has one rule per form of key tag.
const keyTagRules = `domain: k
descriptors:
  - key: single
    rate_limit: {unit: minute, requests_per_unit: 5, name: per_key}
  - key: single_unnamed
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window}
  - key: list
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: day, requests_per_unit: 20, name: daily}
      - {unit: second, unit_multiplier: 60, requests_per_unit: 100, algorithm: sliding_window}
      - {unit: hour, requests_per_unit: 50, algorithm: sliding_log}
  - key: windows
    rate_limits:
      - {unit: day, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: hour, unit_multiplier: 24, requests_per_unit: 5}
      - {unit: day, requests_per_unit: 5, algorithm: fixed_window, timezone: Europe/Paris}
      - {unit: week, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: day, unit_multiplier: 7, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: week, requests_per_unit: 5, algorithm: fixed_window, timezone: Europe/Paris}
      - {unit: day, unit_multiplier: 7, requests_per_unit: 5, algorithm: fixed_window, timezone: Europe/Paris}
      - {unit: month, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: day, unit_multiplier: 30, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: month, unit_multiplier: 3, requests_per_unit: 5, algorithm: fixed_window, timezone: Asia/Tokyo}
      - {unit: year, requests_per_unit: 5, algorithm: fixed_window}
`

func keyTags(r *Rule) []string {
	var tags []string
	for _, l := range r.Limits {
		tags = append(tags, l.KeyTag)
	}
	return tags
}

// TestKeyTags: a singular rate_limit keeps the tag its keys have always had ("0", whatever its
// name); a limit of a rate_limits list is tagged by its name, else by its period and algorithm
// and, for a fixed_window, what aligns its windows: two limits whose windows differ never share
// a tag, and no tag is "0" or begins with 'o' (an override's key).
func TestKeyTags(t *testing.T) {
	rs := mustParse(t, map[string]string{"k.yaml": keyTagRules})
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"single", []string{"0"}},
		{"single_unnamed", []string{"0"}},
		{"list", []string{"p1s/gcra", "n5:daily", "p60s/sliding_window", "p3600s/sliding_log"}},
		{"windows", []string{
			"p86400s/fixed_window",
			"p86400s/gcra",
			"p86400s/fixed_window/day@Europe/Paris",
			"p604800s/fixed_window+345600s", // UTC weeks from Monday
			"p604800s/fixed_window",         // 7-day windows from the epoch (a Thursday)
			"p604800s/fixed_window/week@Europe/Paris",
			"p604800s/fixed_window/day@Europe/Paris",
			"p2592000s/fixed_window/month@UTC",
			"p2592000s/fixed_window",
			"p7776000s/fixed_window/month@Asia/Tokyo",
			"p31536000s/fixed_window/year@UTC",
		}},
	} {
		r := rs.Match("k", entries(tc.key, "v"))
		if r == nil {
			t.Fatalf("%s: no rule", tc.key)
		}
		got := keyTags(r)
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: key tags %q, want %q", tc.key, got, tc.want)
		}
		if tc.key == "single" || tc.key == "single_unnamed" {
			continue
		}
		for _, tag := range got {
			if tag == "0" || tag[0] == 'o' || (tag[0] != 'n' && tag[0] != 'p') {
				t.Errorf("%s: key tag %q could be another form's", tc.key, tag)
			}
		}
	}
}

// TestKeyTagsFollowTheLimit: what an edit may change without moving a limit's state. A rate,
// burst or overdraft changed keeps the tag; limits added, removed or reordered keep theirs; a
// named limit keeps its tag whatever its period; the period of an unnamed one changes it.
func TestKeyTagsFollowTheLimit(t *testing.T) {
	load := func(limits ...string) []string {
		t.Helper()
		f := "domain: k\ndescriptors:\n  - key: u\n    rate_limits:\n"
		for _, l := range limits {
			f += "      - " + l + "\n"
		}
		return keyTags(mustParse(t, map[string]string{"k.yaml": f}).Match("k", entries("u", "x")))
	}
	const (
		second = "{unit: second, requests_per_unit: 10}"
		day    = "{unit: day, requests_per_unit: 20}"
	)
	before := load(second, day)
	for _, tc := range []struct {
		name   string
		limits []string
		want   []string
	}{
		{"removed", []string{day}, before[1:]},
		{"swapped", []string{day, second}, []string{before[1], before[0]}},
		{"added before", []string{"{unit: hour, requests_per_unit: 5}", second, day}, []string{"p3600s/gcra", before[0], before[1]}},
		{"rates changed", []string{"{unit: second, requests_per_unit: 50, burst: 70}", "{unit: day, requests_per_unit: 2, overdraft: true}"}, before},
		{"period as 60 minutes of a day", []string{second, "{unit: minute, unit_multiplier: 1440, requests_per_unit: 20}"}, before},
		{"named", []string{second, "{unit: day, requests_per_unit: 20, name: daily}"}, []string{before[0], "n5:daily"}},
		{"named, period changed", []string{"{unit: hour, requests_per_unit: 20, name: daily}", second}, []string{"n5:daily", before[0]}},
		{"unnamed, period changed", []string{second, "{unit: week, requests_per_unit: 20}"}, []string{before[0], "p604800s/gcra"}},
	} {
		if got := load(tc.limits...); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("%s: key tags %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestKeyTagClashes: two limits of one list that would share a key are refused with file:line,
// saying to name them; limits whose windows differ do not clash.
func TestKeyTagClashes(t *testing.T) {
	for _, tc := range []struct {
		name, limits, want string
	}{
		{"two per second", "      - {unit: second, requests_per_unit: 10}\n      - {unit: second, requests_per_unit: 100, burst: 200}\n",
			`k.yaml:6: domain "k": descriptor u: rate_limits: two limits per 1 second under gcra (rate_limits[0] and rate_limits[1]): give each a name so their state stays apart`},
		{"a minute as 60 seconds", "      - {unit: minute, requests_per_unit: 10}\n      - {unit: hour, requests_per_unit: 1}\n      - {unit: second, unit_multiplier: 60, requests_per_unit: 20}\n",
			`k.yaml:7: domain "k": descriptor u: rate_limits: two limits per 60 seconds under gcra (rate_limits[0] and rate_limits[2])`},
		{"two calendar months", "      - {unit: month, requests_per_unit: 10, algorithm: fixed_window, timezone: Asia/Tokyo}\n      - {unit: month, requests_per_unit: 20, algorithm: fixed_window, timezone: Asia/Tokyo}\n",
			`k.yaml:6: domain "k": descriptor u: rate_limits: two limits per 1 month under fixed_window in Asia/Tokyo (rate_limits[0] and rate_limits[1])`},
		{"one name twice", "      - {unit: second, requests_per_unit: 10, name: a}\n      - {unit: day, requests_per_unit: 10,\n         name: a}\n",
			`k.yaml:7: domain "k": descriptor u: rate_limits[0] and rate_limits[1] are both named "a": give each its own name so their state stays apart`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(map[string][]byte{"k.yaml": []byte("domain: k\ndescriptors:\n  - key: u\n    rate_limits:\n" + tc.limits)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	// Apart: named apart, windows aligned apart, algorithms apart; a singular rate_limit has
	// nothing to clash with.
	for _, limits := range []string{
		"      - {unit: second, requests_per_unit: 10, name: a}\n      - {unit: second, requests_per_unit: 100, name: b}\n",
		"      - {unit: second, requests_per_unit: 10}\n      - {unit: second, requests_per_unit: 100, name: b}\n",
		"      - {unit: day, requests_per_unit: 10, algorithm: fixed_window}\n      - {unit: day, requests_per_unit: 10, algorithm: fixed_window, timezone: Asia/Tokyo}\n",
		"      - {unit: minute, requests_per_unit: 10}\n      - {unit: minute, requests_per_unit: 10, algorithm: sliding_window}\n",
	} {
		if _, err := Parse(map[string][]byte{"k.yaml": []byte("domain: k\ndescriptors:\n  - key: u\n    rate_limits:\n" + limits)}); err != nil {
			t.Errorf("%s: %v", limits, err)
		}
	}
}
