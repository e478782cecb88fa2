package replay

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
)

// Format is what an input's lines are.
type Format int

const (
	// FormatAuto: a decision log or /json bodies, told apart by the first line; Envoy access
	// logs when a mapping is given.
	FormatAuto Format = iota
	// FormatLog: rls's decision log (--decision-log).
	FormatLog
	// FormatJSON: /json bodies (protojson RateLimitRequests) with a "time".
	FormatJSON
	// FormatEnvoy: Envoy JSON access logs, read through a Mapping.
	FormatEnvoy
)

// ParseFormat parses "auto", "log", "json" or "envoy".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "auto", "":
		return FormatAuto, nil
	case "log":
		return FormatLog, nil
	case "json":
		return FormatJSON, nil
	case "envoy":
		return FormatEnvoy, nil
	}
	return 0, fmt.Errorf("input format %q: want auto, log, json or envoy", s)
}

// maxCost caps a hits_addend as the service does.
const maxCost = 1 << 40

// maxLine bounds a line of input.
const maxLine = 4 << 20

// LineError is a line of input replay could not use.
type LineError struct {
	Name string // the input's name
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.Name, e.Line, e.Err) }
func (e *LineError) Unwrap() error { return e.Err }

// Reader reads Requests from one input, a line each; blank lines are skipped.
type Reader struct {
	name    string
	sc      *bufio.Scanner
	line    int
	format  Format
	mapping *Mapping
	rec     decisionlog.Record // the decision log's line, reused
	dec     decisionlog.Decoder
}

// NewReader reads in from in, named name in errors. A mapping is needed for FormatEnvoy, and
// with FormatAuto means FormatEnvoy.
func NewReader(in io.Reader, name string, format Format, m *Mapping) (*Reader, error) {
	if format == FormatAuto && m != nil {
		format = FormatEnvoy
	}
	if format == FormatEnvoy && m == nil {
		return nil, errors.New("an Envoy access log needs a mapping file (--mapping)")
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	return &Reader{name: name, sc: sc, format: format, mapping: m}, nil
}

// Next reads the next request into r (its slices reused): io.EOF after the last, a *LineError
// for a line it cannot use (the next call reads on), or the error reading the input.
func (rd *Reader) Next(r *Request) error {
	for rd.sc.Scan() {
		rd.line++
		line := bytes.TrimSpace(rd.sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if rd.format == FormatAuto {
			rd.format = sniff(line)
		}
		*r = Request{Line: rd.line, Descs: r.Descs[:0]}
		var err error
		switch rd.format {
		case FormatLog:
			err = parseLog(line, r, &rd.dec, &rd.rec)
		case FormatJSON:
			err = parseJSON(line, r)
		default:
			err = rd.mapping.parse(line, r)
		}
		if err != nil {
			return &LineError{Name: rd.name, Line: rd.line, Err: err}
		}
		return nil
	}
	if err := rd.sc.Err(); err != nil {
		return fmt.Errorf("%s:%d: %w", rd.name, rd.line+1, err)
	}
	return io.EOF
}

// sniff tells a decision log line from a /json body by its keys.
func sniff(line []byte) Format {
	var keys map[string]json.RawMessage
	if json.Unmarshal(line, &keys) == nil {
		if _, ok := keys["descriptors"]; ok {
			return FormatJSON
		}
	}
	return FormatLog
}

// parseLog reads a decision log line, through rec (reused).
func parseLog(line []byte, r *Request, dec *decisionlog.Decoder, rec *decisionlog.Record) error {
	if err := dec.Decode(line, rec); err != nil {
		return err
	}
	r.Time = rec.Time.UnixMicro()
	r.Domain = rec.Domain
	r.Count = rec.Count * max(rec.Sample, 1)
	r.Descs = append(r.Descs, Desc{Entries: rec.Descriptor, Hits: min(rec.HitsAddend, maxCost), Refund: rec.Refund})
	return nil
}

// parseJSON reads a /json body, a protojson RateLimitRequest, with "time" beside its fields.
func parseJSON(line []byte, r *Request) error {
	var t struct {
		Time json.RawMessage `json:"time"`
	}
	if err := json.Unmarshal(line, &t); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	if len(t.Time) == 0 {
		return errors.New(`no "time"`)
	}
	at, err := parseTime(t.Time)
	if err != nil {
		return fmt.Errorf(`"time": %w`, err)
	}
	var req rlsv3.RateLimitRequest
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(line, &req); err != nil {
		return fmt.Errorf("not a RateLimitRequest: %w", err)
	}
	if req.Domain == "" {
		return errors.New(`no "domain"`)
	}
	if n := len(req.Descriptors); n == 0 || n > limit.MaxDescriptors {
		return fmt.Errorf("%d descriptors: want 1 to %d", n, limit.MaxDescriptors)
	}
	r.Time, r.Domain = at, req.Domain
	hits := int64(req.GetHitsAddend())
	if hits == 0 {
		hits = 1
	}
	for i, d := range req.Descriptors {
		if d.GetLimit() != nil {
			return fmt.Errorf("descriptor %d: %w", i, ErrOverride)
		}
		if len(d.Entries) == 0 {
			return fmt.Errorf("descriptor %d has no entries", i)
		}
		ds := Desc{Hits: hits, Refund: d.GetIsNegativeHits()}
		if h := d.GetHitsAddend(); h != nil {
			ds.Hits = int64(min(h.GetValue(), maxCost))
		}
		for _, e := range d.Entries {
			ds.Entries = append(ds.Entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		r.Descs = append(r.Descs, ds)
	}
	return nil
}

// parseTime reads a time: an RFC 3339 string, or a number of seconds since the Unix epoch. It
// returns µs since the epoch.
func parseTime(raw json.RawMessage) (int64, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, fmt.Errorf("%q is not an RFC 3339 time", s)
		}
		return t.UnixMicro(), nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 1e11 {
		return 0, fmt.Errorf("%s is neither an RFC 3339 time nor seconds since the epoch", raw)
	}
	return int64(math.Round(f * 1e6)), nil
}

// Mapping says how an Envoy JSON access log line becomes a request, as a route's rate_limits
// actions would: the domain, where the time is, and each descriptor's entries, each from a
// field of the line (as request_headers or remote_address would give it) or a fixed value (as
// generic_key would).
//
//	domain: edge
//	time_field: start_time
//	descriptors:
//	  - entries:
//	      - {key: remote_address, field: downstream_remote_address_without_port}
//	  - entries:
//	      - {key: generic_key, value: api}
//	      - {key: path, field: path, skip_if_absent: true}
type Mapping struct {
	Domain      string       `yaml:"domain"`
	DomainField string       `yaml:"domain_field"`
	TimeField   string       `yaml:"time_field"`
	HitsField   string       `yaml:"hits_field"`
	Descriptors []MappedDesc `yaml:"descriptors"`
}

// MappedDesc is one descriptor of a Mapping.
type MappedDesc struct {
	Entries []MappedEntry `yaml:"entries"`
}

// MappedEntry is one entry: Key, and its value from Field of the line, or Value.
type MappedEntry struct {
	Key   string `yaml:"key"`
	Field string `yaml:"field"`
	Value string `yaml:"value"`
	// SkipIfAbsent: when the field is absent (or null, or "-"), the descriptor is left out, as
	// Envoy leaves it out for a request_headers action with skip_if_absent; otherwise such a
	// line is an error.
	SkipIfAbsent bool `yaml:"skip_if_absent"`
}

// ParseMapping reads a mapping file; its errors name their line.
func ParseMapping(data []byte, name string) (*Mapping, error) {
	var m Mapping
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(name+": "+format, args...)) }
	if (m.Domain == "") == (m.DomainField == "") {
		bad("give one of domain and domain_field")
	}
	if m.TimeField == "" {
		m.TimeField = "start_time"
	}
	if len(m.Descriptors) == 0 {
		bad("no descriptors")
	}
	for i, d := range m.Descriptors {
		if len(d.Entries) == 0 {
			bad("descriptor %d: no entries", i+1)
		}
		for j, e := range d.Entries {
			switch {
			case e.Key == "":
				bad("descriptor %d, entry %d: no key", i+1, j+1)
			case (e.Field == "") == (e.Value == ""):
				bad("descriptor %d, entry %q: give one of field and value", i+1, e.Key)
			case e.Value != "" && e.SkipIfAbsent:
				bad("descriptor %d, entry %q: skip_if_absent needs a field", i+1, e.Key)
			}
		}
	}
	return &m, errors.Join(errs...)
}

// parse reads one access log line through m.
func (m *Mapping) parse(line []byte, r *Request) error {
	var fields map[string]any
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	if err := dec.Decode(&fields); err != nil {
		return fmt.Errorf("not a JSON object: %w", err)
	}
	str := func(name string) (string, bool) {
		switch v := fields[name].(type) {
		case string:
			return v, v != "-"
		case json.Number:
			return v.String(), true
		case bool:
			return strconv.FormatBool(v), true
		}
		return "", false
	}
	t, ok := fields[m.TimeField]
	if !ok || t == nil {
		return fmt.Errorf("no field %q (time_field)", m.TimeField)
	}
	raw, _ := json.Marshal(t)
	at, err := parseTime(raw)
	if err != nil {
		return fmt.Errorf("field %q: %w", m.TimeField, err)
	}
	r.Time = at
	r.Domain = m.Domain
	if m.DomainField != "" {
		if r.Domain, ok = str(m.DomainField); !ok {
			return fmt.Errorf("no field %q (domain_field)", m.DomainField)
		}
	}
	hits := int64(1)
	if m.HitsField != "" {
		s, ok := str(m.HitsField)
		if !ok {
			return fmt.Errorf("no field %q (hits_field)", m.HitsField)
		}
		if hits, err = strconv.ParseInt(s, 10, 64); err != nil || hits < 0 {
			return fmt.Errorf("field %q: %q is not a count of hits", m.HitsField, s)
		}
		hits = min(max(hits, 1), maxCost)
	}
descriptors:
	for i, d := range m.Descriptors {
		ds := Desc{Hits: hits, Entries: make([]descriptors.Entry, 0, len(d.Entries))}
		for _, e := range d.Entries {
			v := e.Value
			if e.Field != "" {
				if v, ok = str(e.Field); !ok {
					if e.SkipIfAbsent {
						continue descriptors
					}
					return fmt.Errorf("descriptor %d, entry %q: no field %q in the line", i+1, e.Key, e.Field)
				}
			}
			ds.Entries = append(ds.Entries, descriptors.Entry{Key: e.Key, Value: v})
		}
		r.Descs = append(r.Descs, ds)
	}
	return nil // every descriptor skipped: a request Envoy would not have sent
}
