// Package decisionlog writes rls's decision log: opt-in JSON lines, one per decision of a
// descriptor worth telling (every denial; with Options.Rules every decision of those rules,
// sampled), throttled per key so that a key denied a thousand times a second writes one line per
// interval with the count. The same lines are what `rls replay` reads back (internal/replay).
package decisionlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/rls-project/rls/internal/descriptors"
)

// Codes of a record: the descriptor's status as it was answered.
const (
	CodeOK        = "OK"
	CodeOverLimit = "OVER_LIMIT"
)

// Record is one line of the decision log: one descriptor of one request as it was decided.
//
// In JSON (one object a line, keys in this order):
//
//	{"time":"2026-12-03T18:00:00.123456Z","domain":"shop","descriptor":[{"key":"user","value":"u1"}],
//	 "hits_addend":1,"rule":"user","limit":"per_minute","code":"OVER_LIMIT","remaining":0,
//	 "reset_seconds":1.5,"caller":"10.0.0.7","count":3}
//
// count is how many decisions of this key the line stands for: 1, or, for a line that closes a
// throttle interval, how many came after the one logged at its start (the line carries the
// latest of them). sample, when above 1, says the line was logged for one in that many decisions.
type Record struct {
	Time       time.Time           `json:"time"`
	Domain     string              `json:"domain"`
	Descriptor []descriptors.Entry `json:"descriptor"`
	HitsAddend int64               `json:"hits_addend"`
	// Refund: the descriptor's is_negative_hits (its hits given back).
	Refund bool `json:"refund,omitempty"`
	// Rule is the matched rule's path in its domain ("user" or "user=vip/path").
	Rule string `json:"rule"`
	// Limit is the name of the limit that answered for the descriptor, when it has one.
	Limit string `json:"limit,omitempty"`
	Code  string `json:"code"`
	// Shadow: the limit denied it under shadow mode, and the answer was OK.
	Shadow       bool    `json:"shadow,omitempty"`
	Remaining    int64   `json:"remaining"`
	ResetSeconds float64 `json:"reset_seconds"`
	Caller       string  `json:"caller,omitempty"`
	Count        int64   `json:"count"`
	Sample       int64   `json:"sample,omitempty"`
}

// Denied reports whether the limit denied the descriptor (in shadow mode too).
func (r *Record) Denied() bool { return r.Code == CodeOverLimit || r.Shadow }

// AppendJSON appends r as one JSON object, without a newline. It writes what encoding/json
// would, without reflection: the log is written on the decision path.
func (r *Record) AppendJSON(b []byte) []byte {
	b = append(b, `{"time":"`...)
	b = r.Time.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, `","domain":`...)
	b = appendString(b, r.Domain)
	b = append(b, `,"descriptor":[`...)
	for i, e := range r.Descriptor {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, e.Key)
		b = append(b, `,"value":`...)
		b = appendString(b, e.Value)
		b = append(b, '}')
	}
	b = append(b, `],"hits_addend":`...)
	b = strconv.AppendInt(b, r.HitsAddend, 10)
	if r.Refund {
		b = append(b, `,"refund":true`...)
	}
	b = append(b, `,"rule":`...)
	b = appendString(b, r.Rule)
	if r.Limit != "" {
		b = append(b, `,"limit":`...)
		b = appendString(b, r.Limit)
	}
	b = append(b, `,"code":`...)
	b = appendString(b, r.Code)
	if r.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, r.Remaining, 10)
	b = append(b, `,"reset_seconds":`...)
	b = strconv.AppendFloat(b, r.ResetSeconds, 'f', -1, 64)
	if r.Caller != "" {
		b = append(b, `,"caller":`...)
		b = appendString(b, r.Caller)
	}
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, r.Count, 10)
	if r.Sample > 1 {
		b = append(b, `,"sample":`...)
		b = strconv.AppendInt(b, r.Sample, 10)
	}
	return append(b, '}')
}

// appendString appends s as a JSON string: valid UTF-8 as is but for the escapes JSON needs
// (and <, >, & escaped as encoding/json does), invalid bytes as U+FFFD.
func appendString(b []byte, s string) []byte {
	simple := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x80 || c == '<' || c == '>' || c == '&' {
			simple = false
			break
		}
	}
	if simple {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// Parse reads one line of the decision log, checking what replay needs of it.
func Parse(line []byte) (Record, error) {
	var r Record
	err := ParseInto(line, &r)
	return r, err
}

// ParseInto is Parse into r, reusing r.Descriptor's array. Lines in the shape AppendJSON writes
// are read without reflection (scan); any other is read by encoding/json.
func ParseInto(line []byte, r *Record) error { return parseInto(line, r, nil) }

func parseInto(line []byte, r *Record, d *Decoder) error {
	if scan(line, r, d) != nil {
		*r = Record{HitsAddend: 1} // absent: one hit, as a request without hits_addend
		if err := json.Unmarshal(line, r); err != nil {
			return fmt.Errorf("not a decision log record: %w", err)
		}
	}
	switch {
	case r.Time.IsZero():
		return errors.New(`decision log record without "time"`)
	case r.Domain == "":
		return errors.New(`decision log record without "domain"`)
	case len(r.Descriptor) == 0:
		return errors.New(`decision log record without "descriptor" entries`)
	case r.Count < 0 || r.Sample < 0:
		return errors.New(`decision log record with a negative "count" or "sample"`)
	}
	if r.Count == 0 {
		r.Count = 1
	}
	return nil
}
