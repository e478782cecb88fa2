package decisionlog

import (
	"bytes"
	"errors"
	"strconv"
	"time"

	"github.com/rls-project/rls/internal/descriptors"
)

// errSlow says a line is not in the shape scan reads; encoding/json reads it instead.
var errSlow = errors.New("decisionlog: not in the common shape")

// scan reads a line as AppendJSON writes it, and the like: one object of the record's keys in
// any order, strings without escapes, numbers in plain notation. Anything else returns errSlow
// and the line is read by encoding/json, which decides what it means. r.Descriptor is reused.
func scan(line []byte, r *Record, d *Decoder) error {
	s := scanner{b: line, d: d}
	if !s.lit('{') {
		return errSlow
	}
	desc := r.Descriptor[:0]
	*r = Record{HitsAddend: 1}
	first := true
	for !s.lit('}') {
		if !first && !s.lit(',') {
			return errSlow
		}
		first = false
		key, ok := s.str()
		if !ok || !s.lit(':') {
			return errSlow
		}
		switch string(key) {
		case "time":
			v, ok := s.str()
			if !ok {
				return errSlow
			}
			t, ok := parseMicros(v)
			if !ok {
				var err error
				if t, err = time.Parse(time.RFC3339Nano, string(v)); err != nil {
					return errSlow
				}
			}
			r.Time = t
		case "domain":
			r.Domain, ok = s.interned()
		case "rule":
			r.Rule, ok = s.interned()
		case "limit":
			r.Limit, ok = s.interned()
		case "code":
			r.Code, ok = s.interned()
		case "caller":
			r.Caller, ok = s.interned()
		case "hits_addend":
			r.HitsAddend, ok = s.int()
		case "remaining":
			r.Remaining, ok = s.int()
		case "count":
			r.Count, ok = s.int()
		case "sample":
			r.Sample, ok = s.int()
		case "refund":
			r.Refund, ok = s.bool()
		case "shadow":
			r.Shadow, ok = s.bool()
		case "reset_seconds":
			var n []byte
			if n, ok = s.number(); ok {
				var err error
				r.ResetSeconds, err = strconv.ParseFloat(string(n), 64)
				ok = err == nil
			}
		case "descriptor":
			desc, ok = s.entries(desc[:0])
			r.Descriptor = desc
		default:
			return errSlow
		}
		if !ok {
			return errSlow
		}
	}
	if s.ws(); s.i != len(s.b) {
		return errSlow
	}
	return nil
}

type scanner struct {
	b []byte
	i int
	d *Decoder // nil: no interning
}

// Decoder reads decision log lines one after another, keeping the strings that repeat from line
// to line (domains, rules, codes, callers, entry keys) once. It is not safe for concurrent use.
type Decoder struct {
	intern map[string]string
}

// maxInterned bounds a Decoder's strings: past it they are forgotten and kept afresh.
const maxInterned = 4096

// Decode is ParseInto, interning the strings that repeat.
func (d *Decoder) Decode(line []byte, r *Record) error { return parseInto(line, r, d) }

// interned reads a string, the Decoder's copy when it has one.
func (s *scanner) interned() (string, bool) {
	v, ok := s.str()
	if !ok || s.d == nil {
		return string(v), ok
	}
	if k, found := s.d.intern[string(v)]; found {
		return k, true
	}
	if s.d.intern == nil || len(s.d.intern) >= maxInterned {
		s.d.intern = make(map[string]string, 64)
	}
	k := string(v)
	s.d.intern[k] = k
	return k, true
}

// parseMicros reads the time as AppendJSON writes it, 2006-01-02T15:04:05.000000Z, or says it
// cannot.
func parseMicros(v []byte) (time.Time, bool) {
	if len(v) != 27 || v[4] != '-' || v[7] != '-' || v[10] != 'T' || v[13] != ':' || v[16] != ':' || v[19] != '.' || v[26] != 'Z' {
		return time.Time{}, false
	}
	num := func(from, to int) int {
		n := 0
		for _, c := range v[from:to] {
			if c < '0' || c > '9' {
				return -1
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	y, mo, d, h, mi, sec, us := num(0, 4), num(5, 7), num(8, 10), num(11, 13), num(14, 16), num(17, 19), num(20, 26)
	if y < 0 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 59 || us < 0 {
		return time.Time{}, false
	}
	t := time.Date(y, time.Month(mo), d, h, mi, sec, us*1000, time.UTC)
	if t.Day() != d { // February 30th and the like: time.Parse's error
		return time.Time{}, false
	}
	return t, true
}

func (s *scanner) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// lit consumes c after blanks, reporting whether it was there.
func (s *scanner) lit(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string without escapes or control characters, and returns its bytes.
func (s *scanner) str() ([]byte, bool) {
	if !s.lit('"') {
		return nil, false
	}
	end := bytes.IndexByte(s.b[s.i:], '"')
	if end < 0 {
		return nil, false
	}
	v := s.b[s.i : s.i+end]
	for _, c := range v {
		if c == '\\' || c < 0x20 || c >= 0x80 {
			return nil, false // escapes, and bytes that may not be valid UTF-8: encoding/json's
		}
	}
	s.i += end + 1
	return v, true
}

func (s *scanner) string() (string, bool) {
	v, ok := s.str()
	return string(v), ok
}

func (s *scanner) number() ([]byte, bool) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && (s.b[s.i] == '-' || s.b[s.i] == '.' || s.b[s.i] == '+' || s.b[s.i] == 'e' || s.b[s.i] == 'E' || s.b[s.i] >= '0' && s.b[s.i] <= '9') {
		s.i++
	}
	return s.b[start:s.i], s.i > start
}

func (s *scanner) int() (int64, bool) {
	n, ok := s.number()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseInt(string(n), 10, 64)
	return v, err == nil
}

func (s *scanner) bool() (bool, bool) {
	s.ws()
	switch {
	case bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
		return true, true
	case bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
		return false, true
	}
	return false, false
}

// entries reads [{"key":..,"value":..},...] into dst.
func (s *scanner) entries(dst []descriptors.Entry) ([]descriptors.Entry, bool) {
	if !s.lit('[') {
		return dst, false
	}
	if s.lit(']') {
		return dst, true
	}
	for {
		if !s.lit('{') {
			return dst, false
		}
		var e descriptors.Entry
		var haveKey, haveValue bool
		for f := 0; f < 2; f++ {
			if f == 1 && !s.lit(',') {
				return dst, false
			}
			name, ok := s.str()
			if !ok || !s.lit(':') {
				return dst, false
			}
			switch string(name) {
			case "key":
				e.Key, ok = s.interned()
				haveKey = true
			case "value":
				e.Value, ok = s.string()
				haveValue = true
			default:
				return dst, false
			}
			if !ok {
				return dst, false
			}
		}
		if !haveKey || !haveValue || !s.lit('}') {
			return dst, false
		}
		dst = append(dst, e)
		if s.lit(']') {
			return dst, true
		}
		if !s.lit(',') {
			return dst, false
		}
	}
}
