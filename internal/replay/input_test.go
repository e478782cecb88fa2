package replay

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/descriptors"
)

const inputRules = `
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`

func shopRules(t testing.TB) *descriptors.RuleSet {
	t.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"shop.yaml": []byte(inputRules)})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

const envoyMapping = `domain: shop
time_field: start_time
descriptors:
  - entries:
      - {key: user, field: x_user}
  - entries:
      - {key: path, field: path, skip_if_absent: true}
`

// TestBadInput: each kind of line replay cannot use is named with its input and line number;
// with --on-error stop replay ends there, with skip it goes on and replays the rest.
func TestBadInput(t *testing.T) {
	t.Parallel()
	m, err := ParseMapping([]byte(envoyMapping), "map.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		format  Format
		mapping *Mapping
		input   string
		want    string // the error of line 3
	}{
		{"malformed log line", FormatLog, nil, `{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptor":[{"key":"user","value":"a"}],"code":"OK","count":1}
{"time":"2026-12-03T18:00:01Z","domain":"shop","descriptor":[{"key":"user","value":"a"}],"code":"OK","count":1}
{"time":"2026-12-03T18:00:02Z","domain":"shop","descriptor":[{"key":"user","va`, "in.log:3: not a decision log record"},
		{"unknown domain", FormatAuto, nil, `{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptor":[{"key":"user","value":"a"}],"code":"OK"}
{"time":"2026-12-03T18:00:01Z","domain":"shop","descriptor":[{"key":"user","value":"b"}],"code":"OK"}
{"time":"2026-12-03T18:00:02Z","domain":"shpo","descriptor":[{"key":"user","value":"a"}],"code":"OK"}
`, `in.log:3: domain "shpo": the rules define no such domain`},
		{"mapping names a missing field", FormatAuto, m, `{"start_time":"2026-12-03T18:00:00.000Z","x_user":"a","path":"/"}
{"start_time":"2026-12-03T18:00:01.000Z","x_user":"b"}
{"start_time":"2026-12-03T18:00:02.000Z","path":"/"}`, `in.log:3: descriptor 1, entry "user": no field "x_user" in the line`},
		{"json body without time", FormatAuto, nil, `{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}
{"time":1796320801.5,"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}
{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`, `in.log:3: no "time"`},
		{"json body with an override", FormatJSON, nil, `{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}
{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}
{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":{"requests_per_unit":1,"unit":"SECOND"}}]}`,
			"in.log:3: descriptor 0: a descriptor's own limit (override) is not replayed"},
		{"a request the service refuses", FormatJSON, nil, `{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}
{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}
{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptors":[{"entries":[{"key":"","value":"a"}]}]}`,
			"in.log:3: descriptor 0, entry 0: the key is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			input := tc.input + "\n" + strings.SplitN(tc.input, "\n", 2)[0] + "\n" // a good line after
			for _, goOn := range []bool{false, true} {
				rd, err := NewReader(strings.NewReader(input), "in.log", tc.format, tc.mapping)
				if err != nil {
					t.Fatal(err)
				}
				run := &Run{Sets: []*Engine{NewEngine(shopRules(t), Options{})}, Names: []string{"shop.yaml"}}
				var told []string
				run.OnError = func(le *LineError) bool { told = append(told, le.Error()); return goOn }
				err = run.Replay(rd)
				rep := run.Report()
				var le *LineError
				switch {
				case !goOn && (!errors.As(err, &le) || !strings.HasPrefix(err.Error(), tc.want)):
					t.Fatalf("on error stop: %v, want %q", err, tc.want)
				case !goOn && le.Line != 3:
					t.Fatalf("line %d, want 3", le.Line)
				case goOn && err != nil:
					t.Fatalf("on error skip: %v", err)
				case len(told) != 1 || !strings.HasPrefix(told[0], tc.want):
					t.Fatalf("told %q, want %q", told, tc.want)
				case goOn && (rep.Requests != 3 || rep.Skipped != 1):
					t.Fatalf("going on: %d requests replayed and %d skipped, want 3 and 1", rep.Requests, rep.Skipped)
				case !goOn && rep.Requests != 2:
					t.Fatalf("stopping: %d requests replayed, want the 2 before", rep.Requests)
				}
			}
		})
	}
}

// TestMappingErrors: a mapping file's mistakes are refused with where they are.
func TestMappingErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, want string }{
		{"domain: shop\ndescriptors:\n  - entries:\n      - {key: user, feild: x}\n", "m.yaml: yaml: unmarshal errors:\n  line 4: field feild not found"},
		{"descriptors:\n  - entries:\n      - {key: user, field: x}\n", "m.yaml: give one of domain and domain_field"},
		{"domain: shop\ndescriptors:\n  - entries:\n      - {key: user, field: x, value: y}\n", `m.yaml: descriptor 1, entry "user": give one of field and value`},
		{"domain: shop\ndescriptors: []\n", "m.yaml: no descriptors"},
	} {
		if _, err := ParseMapping([]byte(tc.yaml), "m.yaml"); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestInputsAlike: the same requests as a decision log, as /json bodies and as Envoy access log
// lines read alike, and a throttled log line stands for its count times its sample.
func TestInputsAlike(t *testing.T) {
	t.Parallel()
	m, err := ParseMapping([]byte(envoyMapping), "map.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inputs := []struct {
		format  Format
		mapping *Mapping
		text    string
	}{
		{FormatAuto, nil, `{"time":"2026-12-03T18:00:00.5Z","domain":"shop","descriptor":[{"key":"user","value":"a"}],"hits_addend":1,"rule":"user","code":"OK","remaining":1,"reset_seconds":1,"count":1}`},
		{FormatAuto, nil, `{"time":"2026-12-03T18:00:00.5Z","domain":"shop","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`},
		{FormatAuto, m, `{"start_time":"2026-12-03T18:00:00.500Z","x_user":"a","path":null,"response_code":200}`},
	}
	var first Request
	for i, in := range inputs {
		rd, err := NewReader(strings.NewReader(in.text+"\n"), "in", in.format, in.mapping)
		if err != nil {
			t.Fatal(err)
		}
		var r Request
		if err := rd.Next(&r); err != nil {
			t.Fatal(err)
		}
		if err := rd.Next(&r); err != io.EOF {
			t.Fatalf("after the line: %v", err)
		}
		if i == 0 {
			first = r
			if r.Time != 1796320800500000 || len(r.Descs) != 1 || r.Descs[0].Hits != 1 {
				t.Fatalf("%+v", r)
			}
			continue
		}
		if r.Time != first.Time || r.Domain != first.Domain || len(r.Descs) != 1 || r.Descs[0].Entries[0] != first.Descs[0].Entries[0] || r.Descs[0].Hits != 1 {
			t.Errorf("input %d read as %+v, the decision log's line as %+v", i, r, first)
		}
	}
	rd, _ := NewReader(strings.NewReader(`{"time":"2026-12-03T18:00:00Z","domain":"shop","descriptor":[{"key":"user","value":"a"}],"code":"OVER_LIMIT","count":7,"sample":3}`), "in", FormatLog, nil)
	run := &Run{Sets: []*Engine{NewEngine(shopRules(t), Options{})}, Names: []string{"shop.yaml"}}
	if err := run.Replay(rd); err != nil {
		t.Fatal(err)
	}
	if rep := run.Report(); rep.Requests != 21 || rep.Rules[0].Denied[0] != 19 || rep.Rules[0].Top[0][0] != (KeyCount{"user=a", 19, 0}) {
		t.Errorf("a line of count 7, sample 3: %d requests, rules %+v", rep.Requests, rep.Rules[0])
	}
}

// TestDocMappingParses: the mapping file docs/replay.md shows is one ParseMapping takes.
func TestDocMappingParses(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "replay.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(time_field:.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/replay.md shows no mapping file (a yaml block starting with time_field:)")
	}
	if _, err := ParseMapping(m[1], "docs/replay.md"); err != nil {
		t.Errorf("docs/replay.md's mapping: %v", err)
	}
}
