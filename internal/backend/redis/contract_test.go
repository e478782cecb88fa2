package redis

import (
	"encoding/binary"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// doublesOf packs vals as the script does: little-endian doubles.
func doublesOf(vals ...float64) string {
	var b []byte
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

// plain returns args with the pointers go-redis is given replaced by what they point to.
func plain(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case *string:
			out[i] = *v
		case *packed:
			out[i] = []byte(*v)
		default:
			out[i] = v
		}
	}
	return out
}

// TestWireFormat pins the format contract.go describes: the arguments of each operation
// and how each reply reads.
func TestWireFormat(t *testing.T) {
	l := limit.Limit{Rate: 7, Period: 3 * time.Second, Burst: 5}
	newCall := func(multi bool, reqs ...backend.Request) *call {
		c := &call{multi: multi, threshold: 2}
		for i := range reqs {
			c.add(fmt.Sprintf("rls:k%d", i), &reqs[i], 0)
		}
		return c
	}

	t.Run("decide arguments", func(t *testing.T) {
		c := newCall(false,
			backend.Request{Limit: l, Cost: 1, Mode: backend.Quota},
			backend.Request{Limit: l, Cost: 1 << 40, Refund: true, Mode: backend.Shadow}, // cost clamped to burst+1
			backend.Request{Limit: l, Cost: -3})                                          // and to 0
		args := plain(decideArgs("sha", 0, c))
		want := []any{"evalsha", "sha", 3, "rls:k0", "rls:k1", "rls:k2", "d", int64(0), int64(2), "0"}
		if fmt.Sprint(args[:len(want)]) != fmt.Sprint(want) {
			t.Fatalf("args %v, want %v then the values", args[:len(want)], want)
		}
		vals := string(args[len(want)].([]byte))
		wantVals := doublesOf(7, 3e6, 5, 1, 4, 0, 0, 0) + doublesOf(7, 3e6, 5, 6, 3, 0, 0, 0) + doublesOf(7, 3e6, 5, 0, 0, 0, 0, 0)
		if vals != wantVals {
			t.Fatalf("values %x, want %x", vals, wantVals)
		}
		// The window algorithms: 16×algorithm in the flags, then the window: the offset of
		// Period-long windows, or a calendar window holding the instant given and the next.
		paris, err := time.LoadLocation("Europe/Paris")
		if err != nil {
			t.Fatal(err)
		}
		week := limit.Limit{Rate: 4, Period: 7 * 24 * time.Hour, Burst: 4, Algorithm: limit.FixedWindow, Window: limit.Window{Offset: 4 * 86400e6}}
		month := limit.Limit{Rate: 4, Period: 30 * 24 * time.Hour, Burst: 4, Algorithm: limit.FixedWindow, Overdraft: true,
			Window: limit.Window{Calendar: limit.Month, Every: 1, Location: paris}}
		log := limit.Limit{Rate: 4, Period: time.Minute, Burst: 4, Algorithm: limit.SlidingLog}
		w := &call{}
		at := time.Date(2026, 2, 10, 0, 0, 0, 0, paris).UnixMicro()
		w.add("a", &backend.Request{Limit: week, Cost: 1}, at)
		w.add("b", &backend.Request{Limit: month, Cost: 1}, at)
		w.add("c", &backend.Request{Limit: log, Cost: 2, Refund: true}, at)
		feb, mar, apr := time.Date(2026, 2, 1, 0, 0, 0, 0, paris), time.Date(2026, 3, 1, 0, 0, 0, 0, paris), time.Date(2026, 4, 1, 0, 0, 0, 0, paris)
		wantW := doublesOf(4, 7*86400e6, 4, 1, 16, 4*86400e6, 0, 0) +
			doublesOf(4, 30*86400e6, 4, 1, 8+16, float64(feb.UnixMicro()), float64(mar.UnixMicro()), float64(apr.UnixMicro())) +
			doublesOf(4, 60e6, 4, 2, 1+48, 0, 0, 0)
		if string(w.vals) != wantW {
			t.Fatalf("window values %x, want %x", w.vals, wantW)
		}
		if c.multi = true; plain(decideArgs("sha", 5, c))[9] != "1" {
			t.Fatal("a multi call does not say so")
		}
	})

	t.Run("merged arguments", func(t *testing.T) {
		a := newCall(false, backend.Request{Limit: l, Cost: 1})
		b := newCall(false, backend.Request{Limit: l, Cost: 2}, backend.Request{Limit: l, Cost: 3})
		b.threshold = -1
		args := plain(mergedArgs("sha", 9, []*call{a, b}))
		want := fmt.Sprint([]any{"evalsha", "sha", 3, "rls:k0", "rls:k0", "rls:k1", "m", int64(9), int64(2), a.vals, int64(-1), b.vals})
		if fmt.Sprint(args) != want {
			t.Fatalf("args %v, want %v", args, want)
		}
	})

	t.Run("undo arguments", func(t *testing.T) {
		// A multi call of a GCRA key, a key with nothing to undo and a sliding_log key a refund
		// took hits from at two instants; its reply, then the undo of what it wrote.
		// A fourth key's refund was given back in the terms of the key's state (100 an hour),
		// not l's: its undo is in those terms, with no burst to cap it.
		log := limit.Limit{Rate: 4, Period: time.Minute, Burst: 4, Algorithm: limit.SlidingLog}
		reqs := []backend.Request{{Limit: l, Cost: 1}, {Limit: l}, {Limit: log, Cost: 3, Refund: true}, {Limit: l, Cost: 2, Refund: true}}
		c := newCall(true, reqs...)
		reply := doublesOf(1, 77, 1, 4, 0, 428572, 1, 5, 0, 0, 1, 4, 0, 0, 1, 5, 0, 0) +
			doublesOf(5, 0, 428571, 3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 4, 0, 0, 9, 0, 0, 2, 1e6, 1, 2e6, 2) +
			doublesOf(5, 0, -72e6, 0, 100, 3600e6, 0)
		if err := decodeDecide(reply, c); err != nil {
			t.Fatal(err)
		}
		var keys []string
		var vals []byte
		for n := range c.keys {
			var ok bool
			if vals, ok = c.appendUndo(vals, n, &reqs[n]); ok {
				keys = append(keys, c.keys[n])
			}
		}
		wantVals := doublesOf(7, 3e6, 5, 428571, 3, 0, 0) + doublesOf(4, 60e6, 4, 0, 9, 1+48, 2, 1e6, 1, 2e6, 2) +
			doublesOf(100, 3600e6, 1<<33, -72e6, 0, 8, 0)
		if string(vals) != wantVals {
			t.Fatalf("undo values %x, want %x", vals, wantVals)
		}
		if c.now != 77 {
			t.Fatalf("the script's instant read as %d, want 77", c.now)
		}
		args := plain(undoArgs("sha", 0, keys, vals))
		want := fmt.Sprint([]any{"evalsha", "sha", 3, "rls:k0", "rls:k2", "rls:k3", "u", int64(0), []byte(wantVals)})
		if fmt.Sprint(args) != want {
			t.Fatalf("args %v, want %v", args, want)
		}
	})

	for _, tc := range []struct {
		name  string
		multi bool
		n     int
		reply string
		want  string // fmt of charged, decisions, check, delta; or the error
	}{
		{name: "one key admitted", n: 1, reply: doublesOf(1, 77, 1, 4, 0, 428572),
			want: "true 77 [{true 4 0s 428.572ms}] [] []"},
		{name: "two keys, one denied", n: 2, reply: doublesOf(0, 77, 1, 3, 0, 10, 0, 0, 250000, 1e6),
			want: "false 77 [{true 3 0s 10µs} {false 0 250ms 1s}] [] []"},
		{name: "multi", multi: true, n: 1, reply: doublesOf(1, 77, 1, 4, 0, 428572, 5, 0, 428571, 3, 0, 0, 0),
			want: "true 77 [{true 4 0s 428.572ms}] [5 0] [428571 3 0 0 0]"},
		{name: "multi in the state's own terms", multi: true, n: 1, reply: doublesOf(1, 77, 1, 4, 0, 428572, 5, 0, -3, 1, 100, 3600e6, 0),
			want: "true 77 [{true 4 0s 428.572ms}] [5 0] [-3 1 100 3600000000 0]"},
		{name: "multi with entries", multi: true, n: 2, reply: doublesOf(1, 77, 1, 4, 0, 428572, 1, 1, 0, 9) +
			doublesOf(4, 9, 0, 8, 0, 0, 2, 5, 6, 7, 8, 1, 2, 3, 4, 0, 0, 0),
			want: "true 77 [{true 4 0s 428.572ms} {true 1 0s 9µs}] [4 9 1 2] [0 8 0 0 2 5 6 7 8 3 4 0 0 0]"},
		{name: "multi, entries beyond the reply", multi: true, n: 2, reply: doublesOf(1, 77, 1, 4, 0, 428572, 1, 1, 0, 9) +
			doublesOf(4, 9, 0, 8, 0, 0, 3, 5, 6, 7, 8, 1, 2, 3, 4, 0, 0, 0),
			want: "script reply: 224 bytes for 2 keys, key 0's delta says 3 entries"},
		{name: "multi, negative entries", multi: true, n: 1, reply: doublesOf(1, 77, 1, 4, 0, 428572, 5, 0, 428571, 3, 0, 0, -1),
			want: "script reply: 104 bytes for 1 keys, key 0's delta says -1 entries"},
		{name: "multi, bytes left over", multi: true, n: 1, reply: doublesOf(1, 77, 1, 4, 0, 428572, 5, 0, 428571, 3, 0, 0, 0, 7),
			want: "script reply: 112 bytes for 1 keys, 8 more than the deltas say"},
		{name: "multi, short", multi: true, n: 2, reply: doublesOf(1, 77, 1, 4, 0, 428572, 1, 1, 0, 9, 4, 9, 0, 8, 0, 0, 0),
			want: "script reply: 136 bytes for 2 keys, want 192"},
		{name: "short", n: 2, reply: doublesOf(1, 77, 1, 4, 0, 428572),
			want: "script reply: 48 bytes for 2 keys, want 80"},
		{name: "not doubles", n: 1, reply: "OK",
			want: "script reply: 2 bytes for 1 keys, want 48"},
		{name: "multi reply for a plain call", n: 1, reply: doublesOf(1, 77, 1, 4, 0, 428572, 5, 0, 428571, 3, 0, 0, 0),
			want: "script reply: 104 bytes for 1 keys, want 48"},
	} {
		t.Run("reply "+tc.name, func(t *testing.T) {
			c := &call{multi: tc.multi, keys: make([]string, tc.n)}
			got := ""
			if err := decodeDecide(tc.reply, c); err != nil {
				got = err.Error()
			} else {
				got = fmt.Sprint(c.charged, c.now, c.dec, c.check, c.delta)
			}
			if got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}

	t.Run("merged reply", func(t *testing.T) {
		a := &call{keys: make([]string, 1)}
		b := &call{keys: make([]string, 2)}
		reply := doublesOf(0, 77, 0, 2, 100, 200) + doublesOf(1, 77, 1, 1, 0, 5, 1, 0, 0, 6)
		if err := decodeMerged(reply, []*call{a, b}); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(a.charged, a.dec, b.charged, b.dec); got != "false [{false 2 100µs 200µs}] true [{true 1 0s 5µs} {true 0 0s 6µs}]" {
			t.Fatalf("got %s", got)
		}
		if err := decodeMerged(reply[:len(reply)-8], []*call{a, b}); err == nil || !strings.Contains(err.Error(), "2 merged calls") {
			t.Fatalf("short merged reply: %v", err)
		}
	})

	t.Run("state", func(t *testing.T) {
		s := backend.State{TAT: 1_796_000_000_123_456, Frac: 6, Rate: 7, Period: 3_000_000}
		v := encodeState(s)
		if v != doublesOf(1_796_000_000_123_456, 6, 7, 3e6) {
			t.Fatalf("stored %x", v)
		}
		if got, ok := decodeState(v); !ok || !got.Equal(s) {
			t.Fatalf("decoded %+v %v, want %+v", got, ok, s)
		}
		for _, tc := range []struct {
			s    backend.State
			want string
		}{
			{backend.State{Alg: limit.FixedWindow, TAT: 1_796_000_040_000_000, Frac: 3, Rate: 4, Period: 60e6}, doublesOf(1, 1_796_000_040_000_000, 3, 0, 4, 60e6)},
			{backend.State{Alg: limit.SlidingWindow, TAT: 1_796_000_040_000_000, Frac: 3, Prev: 2, Rate: 4, Period: 60e6}, doublesOf(2, 1_796_000_040_000_000, 3, 2, 4, 60e6)},
			{backend.State{Alg: limit.SlidingLog, Rate: 4, Period: 60e6, Log: []int64{1_796_000_000_000_001, 2, 1_796_000_000_000_009, 1}},
				doublesOf(3, 4, 60e6, 2, 0, 1_796_000_000_000_001, 2, 1_796_000_000_000_009, 3)},
		} {
			v := encodeState(tc.s)
			if v != tc.want {
				t.Fatalf("%v stored %x, want %x", tc.s.Alg, v, tc.want)
			}
			if got, ok := decodeState(v); !ok || !got.Equal(tc.s) {
				t.Fatalf("decoded %+v %v, want %+v", got, ok, tc.s)
			}
		}
		for _, text := range []string{"1796000000123456 6 7 3000000", "1796061026251098 1 54 3600000000"} {
			if _, ok := decodeState(text); ok {
				t.Fatalf("the text form %q (%d bytes) decodes as a packed state", text, len(text))
			}
		}
	})
}

// TestContract holds decide.lua to contract.go: the script reads every position, format and
// bit by the constants luaConstants renders (none written again, none written as a number),
// unpacks and packs each record in the order contract.go names its fields, and reads every
// constant the contract names. Moving a field or a position on one side only fails here.
func TestContract(t *testing.T) {
	if !strings.HasPrefix(scriptCode, luaConstants()) || !strings.HasSuffix(scriptCode, decideLua) {
		t.Fatal("the script is not the contract's constants followed by decide.lua")
	}
	fields := map[string][]string{}
	for _, r := range records {
		seen := map[string]bool{}
		for i, f := range r.fields {
			if f == "" || seen[f] {
				t.Errorf("contract.go: record %s field %d is %q: every field has a name of its own", r.lua, i, f)
			}
			seen[f] = true
		}
		fields[r.lua] = r.fields
	}
	// The constants the preamble defines.
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^local ([A-Z0-9_, ]+) =`).FindAllStringSubmatch(luaConstants(), -1) {
		for _, n := range strings.Split(m[1], ",") {
			names = append(names, strings.TrimSpace(n))
		}
	}
	if len(names) < 40 {
		t.Fatalf("the preamble defines %d constants: %v", len(names), names)
	}
	redefined := regexp.MustCompile(`^\s*local\s+(?:[\w, ]*\b)?(` + strings.Join(names, "|") + `)\b[\w, ]*=`)
	lines := strings.Split(decideLua, "\n")
	bad := func(n int, format string, args ...any) {
		t.Errorf("decide.lua:%d: %s\n\t%s", n+1, fmt.Sprintf(format, args...), strings.TrimSpace(lines[n]))
	}
	literals := []struct {
		re   *regexp.Regexp
		what string
	}{
		{regexp.MustCompile(`"<[a-z]+"`), "a literal format: use the record's _FMT constant"},
		{regexp.MustCompile(`\b(ARGV_?|argv)\[\d+\]`), "a literal ARGV position: use an ARG_ constant"},
		{regexp.MustCompile(`[=~]= *"[dmu]"`), "a literal operation: use an OP_ constant"},
		{regexp.MustCompile(`\b(alg|mode)\s*[=~]=\s*\d`), "a literal algorithm or mode: use an ALG_ or MODE_ constant"},
		{regexp.MustCompile(`\bflags\s*[/%]\s*\d`), "a literal flag bit: use a FLAG_ constant"},
		{regexp.MustCompile(`#\w+\s*/\s*\d`), "a literal record size: use a record's _BYTES constant"},
	}
	unpackRe := regexp.MustCompile(`^\s*(?:local\s+)?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=\s*unpack\(([A-Z_]+)_FMT\b`)
	packRe := regexp.MustCompile(`\bpack\(([A-Z_]+)_FMT,`)
	for n, line := range lines {
		code, _, _ := strings.Cut(line, "--")
		for _, l := range literals {
			if l.re.MatchString(code) {
				bad(n, "%s", l.what)
			}
		}
		if m := redefined.FindStringSubmatch(code); m != nil {
			bad(n, "defines %s again: the contract's constants come from contract.go", m[1])
		}
		if m := unpackRe.FindStringSubmatch(code); m != nil {
			if want, ok := fields[m[2]]; ok {
				got := strings.Split(strings.ReplaceAll(m[1], " ", ""), ",")
				if len(got) == len(want)+1 && got[len(got)-1] == "pos" {
					got = got[:len(want)]
				}
				if !sameFields(got, want) {
					bad(n, "unpacks %s as %s; contract.go names its fields %s", m[2], strings.Join(got, ", "), strings.Join(want, ", "))
				}
			}
		}
		for _, m := range packRe.FindAllStringSubmatchIndex(code, -1) {
			rec := code[m[2]:m[3]]
			want, ok := fields[rec]
			if !ok {
				continue
			}
			var got []string
			for _, a := range callArgs(code[m[1]:]) {
				// An argument names its field: a variable or a table's field of that name.
				if i := strings.LastIndexByte(a, '.'); i >= 0 {
					a = a[i+1:]
				}
				got = append(got, a)
			}
			if !sameFields(got, want) {
				bad(n, "packs %s as %s; contract.go names its fields %s", rec, strings.Join(got, ", "), strings.Join(want, ", "))
			}
		}
	}
	for _, name := range names {
		if strings.HasSuffix(name, "_WORDS") || strings.HasSuffix(name, "_BYTES") {
			continue // sizes, where the script needs them
		}
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(decideLua) {
			t.Errorf("decide.lua never reads %s, which contract.go renders", name)
		}
	}
}

// sameFields reports whether got names want's fields in order (_ stands for any).
func sameFields(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] && got[i] != "_" {
			return false
		}
	}
	return true
}

// callArgs splits the arguments of a call whose text s starts after its first comma, up to
// the parenthesis that closes it, at the commas outside nested parentheses.
func callArgs(s string) []string {
	var args []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '(', '{', '[':
			depth++
		case ')', '}', ']':
			if depth == 0 {
				return append(args, strings.TrimSpace(s[start:i]))
			}
			depth--
		case ',':
			if depth == 0 {
				args = append(args, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	return args
}
