package descriptors

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/limit"
)

// mixedRules mixes the four algorithms, one descriptor each and all four on one node.
const mixedRules = `domain: mixed
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: month, requests_per_unit: 10000, algorithm: fixed_window, timezone: Asia/Tokyo}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 60}
      - {unit: minute, requests_per_unit: 60, algorithm: fixed_window, name: fw}
      - {unit: minute, requests_per_unit: 60, algorithm: sliding_window, name: sw}
      - {unit: minute, requests_per_unit: 60, algorithm: sliding_log, name: sl}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 5, algorithm: fixed_window, overdraft: true}
  - key: paris
    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window, timezone: Europe/Paris}
`

func TestAlgorithmsLoad(t *testing.T) {
	rs := mustParse(t, map[string]string{"m.yaml": mixedRules})
	tokyo, _ := loadLocation("Asia/Tokyo")
	paris, _ := loadLocation("Europe/Paris")
	got := func(k, v string) []Limit { return rs.Match("mixed", []Entry{{k, v}}).Limits }
	if l := got("plan", "free")[0]; l.Spec.Algorithm != limit.FixedWindow || l.Timezone != "Asia/Tokyo" ||
		l.Spec.Window != (limit.Window{Calendar: limit.Month, Every: 1, Location: tokyo}) || l.Spec.Burst != 10000 {
		t.Errorf("plan=free: %+v", l)
	}
	var algs []string
	for _, l := range got("user", "u") {
		algs = append(algs, l.Spec.Algorithm.String())
	}
	if strings.Join(algs, " ") != "gcra fixed_window sliding_window sliding_log" {
		t.Errorf("user: algorithms %v", algs)
	}
	if l := got("week", "w")[0]; l.Spec.Window != (limit.Window{Offset: 4 * 86400e6}) || !l.Spec.Overdraft {
		t.Errorf("week: %+v, want a UTC week from Monday with overdraft", l.Spec)
	}
	if l := got("paris", "p")[0]; l.Spec.Window != (limit.Window{Calendar: limit.Day, Every: 1, Location: paris}) {
		t.Errorf("paris: %+v", l.Spec)
	}
}

func TestAlgorithmErrors(t *testing.T) {
	limit := func(fields string) map[string][]byte {
		return map[string][]byte{"a.yaml": []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n" + fields)}
	}
	tests := []struct {
		name   string
		fields string
		want   string
	}{
		{"unknown algorithm", "      algorithm: leaky_bucket\n",
			`a.yaml:7: domain "a": descriptor k: algorithm "leaky_bucket": want one of gcra, fixed_window, sliding_window, sliding_log`},
		{"burst on a window", "      algorithm: fixed_window\n      burst: 5\n", `a.yaml:8: domain "a": descriptor k: burst applies to algorithm gcra only`},
		{"overdraft on sliding_log", "      algorithm: sliding_log\n      overdraft: true\n",
			`a.yaml:8: domain "a": descriptor k: overdraft applies to algorithms gcra and fixed_window, not sliding_log`},
		{"overdraft on sliding_window", "      overdraft: true\n      algorithm: sliding_window\n",
			`a.yaml:7: domain "a": descriptor k: overdraft applies to algorithms gcra and fixed_window, not sliding_window`},
		{"timezone on a minute", "      algorithm: fixed_window\n      timezone: Europe/Paris\n",
			`a.yaml:8: domain "a": descriptor k: timezone applies to units day, week, month and year, not minute`},
		{"timezone on gcra", "      timezone: Europe/Paris\n", `a.yaml:7: domain "a": descriptor k: timezone applies to algorithm fixed_window only`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(limit(tc.fields))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	for _, tc := range []struct{ name, file, want string }{
		{"unknown timezone", "domain: a\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: month\n      requests_per_unit: 10\n      algorithm: fixed_window\n      timezone: Mars/Olympus\n",
			`a.yaml:8: domain "a": descriptor k: timezone "Mars/Olympus": not a known IANA time zone name`},
		{"sliding_log above its bound", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1001, algorithm: sliding_log}\n",
			`a.yaml:4: domain "a": descriptor k: requests_per_unit 1001 is above 1000: sliding_log keeps one entry per admitted request`},
		{"sliding_window too large", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 10, requests_per_unit: 4000000000, algorithm: sliding_window}\n",
			`a.yaml:4: domain "a": descriptor k: invalid limit: sliding_window rate 4000000000 × period`},
		{"in rate_limits", "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: day, requests_per_unit: 1, algorithm: sliding_log, overdraft: true}\n",
			`a.yaml:6: domain "a": descriptor k: rate_limits[1]: overdraft applies to algorithms gcra and fixed_window`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(map[string][]byte{"a.yaml": []byte(tc.file)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestOptionsOverdraft: Options.Overdraft gives overdraft to the limits whose algorithm can
// hold it, and leaves the others as they are rather than refusing them.
func TestOptionsOverdraft(t *testing.T) {
	const rules = `
domain: a
descriptors:
  - key: g
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: f
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: s
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window}
`
	for _, on := range []bool{false, true} {
		rs, err := ParseWith(map[string][]byte{"a.yaml": []byte(rules)}, Options{Overdraft: on})
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]bool{"g": on, "f": on, "s": false} {
			if r := rs.Match("a", []Entry{{Key: key, Value: "x"}}); r == nil || r.Limits[0].Spec.Overdraft != want {
				t.Errorf("Overdraft %v, key %s: %+v, want overdraft %v", on, key, r, want)
			}
		}
	}
}

// TestWindowBurstAsTheRate: a window algorithm's burst is its requests_per_unit, which
// limit.Validate decides: a burst equal to it loads, any other is refused.
func TestWindowBurstAsTheRate(t *testing.T) {
	file := "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, burst: %d}\n"
	if _, err := Parse(map[string][]byte{"a.yaml": []byte(fmt.Sprintf(file, 10))}); err != nil {
		t.Fatalf("burst equal to requests_per_unit: %v", err)
	}
	want := `a.yaml:4: domain "a": descriptor k: burst applies to algorithm gcra only: fixed_window admits the rate, 10, per window, not 0`
	if _, err := Parse(map[string][]byte{"a.yaml": []byte(fmt.Sprintf(file, 0))}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("burst 0: got %v, want %q", err, want)
	}
}
