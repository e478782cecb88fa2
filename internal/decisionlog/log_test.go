package decisionlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/descriptors"
)

// t0 is far ahead of the clock: the background flush, at the clock's time, never ends a test's
// interval.
var t0 = time.Date(2100, 12, 3, 18, 0, 0, 0, time.UTC)

func rec(at time.Duration, value, code string) *Record {
	return &Record{Time: t0.Add(at), Domain: "shop", Descriptor: []descriptors.Entry{{Key: "user", Value: value}},
		HitsAddend: 1, Rule: "user", Code: code, Remaining: 0, ResetSeconds: 1.5, Caller: "10.0.0.7"}
}

// lines parses what a log wrote.
func lines(t *testing.T, b *bytes.Buffer) []Record {
	t.Helper()
	var out []Record
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		r, err := Parse([]byte(l))
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// TestRecordFormat: AppendJSON writes what encoding/json writes of the same record (every
// field, escapes of keys and values included), and Parse reads it back whole.
func TestRecordFormat(t *testing.T) {
	t.Parallel()
	for _, r := range []Record{
		*rec(1500*time.Microsecond, "u1", CodeOverLimit),
		{Time: t0, Domain: "d\"q", Descriptor: []descriptors.Entry{{Key: "a<b>&", Value: "é\n\x01"}, {Key: "k", Value: "\xff"}},
			HitsAddend: 7, Refund: true, Rule: "a=b/c", Limit: "per_day", Code: CodeOK, Shadow: true, Remaining: 12,
			ResetSeconds: 0.000001, Count: 40, Sample: 10},
	} {
		r.Count = max(r.Count, 1)
		got := r.AppendJSON(nil)
		var a, b map[string]any
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		want, _ := json.Marshal(r)
		_ = json.Unmarshal(want, &b)
		// The time is written with six digits of fraction always, encoding/json's trimmed.
		ta, _ := time.Parse(time.RFC3339Nano, a["time"].(string))
		tb, _ := time.Parse(time.RFC3339Nano, b["time"].(string))
		if !ta.Equal(tb) {
			t.Errorf("time %v, want %v", a["time"], b["time"])
		}
		delete(a, "time")
		delete(b, "time")
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("AppendJSON\n %s\nencoding/json\n %s", got, want)
		}
		back, err := Parse(got)
		if err != nil {
			t.Fatal(err)
		}
		r.Descriptor[len(r.Descriptor)-1].Value = strings.ToValidUTF8(r.Descriptor[len(r.Descriptor)-1].Value, "\uFFFD")
		if fmt.Sprint(back) != fmt.Sprint(r) {
			t.Errorf("Parse(AppendJSON(r)) =\n %+v\nwant\n %+v", back, r)
		}
	}
	if !strings.HasPrefix(string(rec(0, "u", CodeOK).AppendJSON(nil)), `{"time":"2100-12-03T18:00:00.000000Z","domain":"shop","descriptor":[{"key":"user","value":"u"}],"hits_addend":1,"rule":"user","code":"OK",`) {
		t.Errorf("the fields are not in the documented order: %s", rec(0, "u", CodeOK).AppendJSON(nil))
	}
	for _, bad := range []string{`{`, `{"domain":"d","descriptor":[{"key":"k","value":"v"}]}`, `{"time":"2026-12-03T18:00:00Z","descriptor":[{"key":"k","value":"v"}]}`,
		`{"time":"2026-12-03T18:00:00Z","domain":"d"}`, `{"time":"2026-12-03T18:00:00Z","domain":"d","descriptor":[{"key":"k","value":"v"}],"count":-1}`} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%s) took it", bad)
		}
	}
}

// TestThrottle: per key and interval, the first decision is written at once, the ones after it
// are counted, and the interval's end writes the latest with the count; keys are apart (a
// denial of one key does not hide another's, nor an admission its denial); interval 0 writes
// every decision.
func TestThrottle(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	l, err := New(&b, Options{Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 100 {
		l.Write(rec(time.Duration(i)*time.Millisecond, "u1", CodeOverLimit))
	}
	l.Write(rec(200*time.Millisecond, "u2", CodeOverLimit))
	l.Write(rec(300*time.Millisecond, "u1", CodeOK))
	l.Flush(t0.Add(500 * time.Millisecond)) // not over yet: writes out what was written
	got := lines(t, &b)
	if len(got) != 3 || got[0].Count != 1 || got[1].Descriptor[0].Value != "u2" || got[2].Code != CodeOK {
		t.Fatalf("within the interval: %+v", got)
	}
	l.Write(rec(1100*time.Millisecond, "u1", CodeOverLimit)) // a new interval: the counts first
	l.Flush(t0.Add(1200 * time.Millisecond))
	got = lines(t, &b)
	if len(got) != 5 {
		t.Fatalf("after the interval, %d lines: %+v", len(got), got)
	}
	if c := got[3]; c.Count != 99 || !c.Time.Equal(t0.Add(99*time.Millisecond)) || c.Descriptor[0].Value != "u1" {
		t.Errorf("the count line: %+v, want count 99 at the latest's time", c)
	}
	if c := got[4]; c.Count != 1 || !c.Time.Equal(t0.Add(1100*time.Millisecond)) {
		t.Errorf("the next interval's first: %+v", c)
	}
	var total int64
	for _, r := range got {
		total += r.Count
	}
	if total != 103 {
		t.Errorf("counts add to %d, want the 103 decisions", total)
	}

	var every bytes.Buffer
	l0, _ := New(&every, Options{})
	for i := range 5 {
		l0.Write(rec(time.Duration(i), "u1", CodeOverLimit))
	}
	l0.Close()
	if n := len(lines(t, &every)); n != 5 {
		t.Errorf("interval 0: %d lines for 5 decisions", n)
	}
}

// TestThrottleBounded: however many distinct keys, the throttle holds at most MaxKeys, and every
// decision is counted in some line.
func TestThrottleBounded(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	l, _ := New(&b, Options{Interval: time.Hour, MaxKeys: 100})
	const n = 4000
	for i := range n {
		// Each key twice in a row, then never again: 2000 distinct keys.
		l.Write(rec(time.Duration(i)*time.Microsecond, fmt.Sprint("u", i/2), CodeOverLimit))
		if k := l.Keys(); k > 100 {
			t.Fatalf("the throttle holds %d keys, over its bound of 100", k)
		}
	}
	l.Close()
	var total int64
	for _, r := range lines(t, &b) {
		total += r.Count
	}
	if total != n {
		t.Errorf("counts add to %d, want %d", total, n)
	}
}

// TestWants: every denial; admitted decisions only of the rules named, one in Sample; concurrent
// writers each write whole lines.
func TestWants(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	l, _ := New(&b, Options{Rules: []string{"shop/user", "api"}, Sample: 4})
	defer l.Close()
	if ok, _ := l.Wants("other", "x", true); !ok {
		t.Error("a denial is not wanted")
	}
	if ok, _ := l.Wants("other", "x", false); ok {
		t.Error("an admission of a rule not named is wanted")
	}
	if ok, _ := l.Wants("shop", "path", false); ok {
		t.Error("shop/path is wanted, only shop/user is named")
	}
	n := 0
	for range 40 {
		if ok, s := l.Wants("shop", "user", false); ok {
			n++
			if s != 4 {
				t.Errorf("sample %d, want 4", s)
			}
		}
		if ok, _ := l.Wants("api", "any/thing", false); ok {
			n++
		}
	}
	if n != 20 {
		t.Errorf("%d of 80 admissions wanted, want one in 4", n)
	}
	all, _ := New(&b, Options{Rules: []string{"*"}})
	defer all.Close()
	if ok, s := all.Wants("x", "y", false); !ok || s != 1 {
		t.Error("* does not want every rule's decisions")
	}

	var out bytes.Buffer
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	cl, _ := New(w, Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				cl.Write(rec(time.Duration(i), fmt.Sprint("g", g), CodeOverLimit))
			}
		}()
	}
	wg.Wait()
	cl.Close()
	if got := len(lines(t, &out)); got != 1600 {
		t.Errorf("%d lines from 1600 concurrent writes", got)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestScanMatchesJSON: the reader without reflection reads every line as encoding/json does,
// or leaves it to encoding/json: records as AppendJSON writes them, with their keys reordered,
// blanks added, escapes, other keys, other types.
func TestScanMatchesJSON(t *testing.T) {
	t.Parallel()
	lines := []string{
		`{"time":"2026-12-03T18:00:00Z","domain":"d","descriptor":[{"value":"v","key":"k"}],"count":3,"hits_addend":0,"code":"OK"}`,
		` { "domain" : "d" , "time" : "2026-12-03T18:00:00.5+02:00", "descriptor" : [ ] , "shadow" : true , "refund": false, "reset_seconds": 1e-3 } `,
		`{"time":"2026-12-03T18:00:00Z","domain":"d\u0041","descriptor":[{"key":"k","value":"v"}]}`,
		`{"time":"2026-12-03T18:00:00Z","domain":"d","Domain":"e","descriptor":[{"key":"k","value":"v"}]}`,
		`{"time":"2026-12-03T18:00:00Z","domain":"d","descriptor":[{"key":"k","value":"v","x":1}]}`,
		`{"time":"2026-12-03T18:00:00Z","domain":"d","descriptor":[{"key":"k","value":"v"}],"count":1.5}`,
		`{"time":"2026-12-03T18:00:00Z","domain":"d","descriptor":[{"key":"k","value":"v"}]} x`,
		`{"time":"2026-12-03T18:00:00Z","domain":"é","descriptor":[{"key":"k","value":"v"}],"count":2,"count":5}`,
		`{"time":"2026-12-03T18:00:00Z","domain":"d","descriptor":[{"key":"k","value":"v"}],"descriptor":[{"key":"a","value":"b"}]}`,
	}
	for i := range 50 {
		r := rec(time.Duration(i)*time.Microsecond*7919, fmt.Sprint("u", i), []string{CodeOK, CodeOverLimit}[i%2])
		r.Count, r.Sample, r.Shadow, r.Refund, r.Remaining, r.Limit = int64(i), int64(i%3), i%5 == 0, i%7 == 0, int64(i*3), fmt.Sprint("l", i%2)
		lines = append(lines, string(r.AppendJSON(nil)))
	}
	var dec Decoder
	lines = append(lines, `{"time":"2026-02-30T18:00:00.000000Z","domain":"d","descriptor":[{"key":"k","value":"v"}]}`,
		`{"time":"2026-12-03T18:00:00.000001Z","domain":"d","descriptor":[{"key":"k","value":"v"}]}`)
	for _, l := range lines {
		var fast Record
		fastErr := scan([]byte(l), &fast, &dec)
		slow := Record{HitsAddend: 1}
		slowErr := json.Unmarshal([]byte(l), &slow)
		if fastErr == nil && (slowErr != nil || fmt.Sprint(fast) != fmt.Sprint(slow)) {
			t.Errorf("%s\n scan: %+v\n json: %+v (%v)", l, fast, slow, slowErr)
		}
	}
	var r Record
	if err := ParseInto([]byte(lines[len(lines)-3]), &r); err != nil || scan([]byte(lines[len(lines)-3]), &r, nil) != nil {
		t.Errorf("a line as AppendJSON writes it is not read by scan: %v", err)
	}
}
