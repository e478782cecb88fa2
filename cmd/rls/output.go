package main

import (
	"encoding/json"
	"io"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// The JSON rls check and rls inspect print is one style, the style of rls's HTTP answers
// (/v1/keys, which inspect prints as it comes): field names in snake_case; every field present,
// zeros included, except the optional ones the documentation marks; durations as a number of
// seconds (a fraction where it has one) in a field named *_seconds; units as rule files write them
// (minute); codes as Envoy names them (OK, OVER_LIMIT). docs/commands.md documents it, and
// scripts parse it: change it only by adding fields.

// checkOutput is rls check's answer: the RateLimitResponse.
type checkOutput struct {
	OverallCode          string          `json:"overall_code"`
	Statuses             []checkStatus   `json:"statuses"`
	ResponseHeadersToAdd []checkHeader   `json:"response_headers_to_add"`
	RequestHeadersToAdd  []checkHeader   `json:"request_headers_to_add"`
	DynamicMetadata      json.RawMessage `json:"dynamic_metadata,omitempty"` // only when rls sent some
}

// checkStatus is one descriptor's status.
type checkStatus struct {
	Code         string      `json:"code"`
	CurrentLimit *checkLimit `json:"current_limit"` // null: no rule limits the descriptor
	Remaining    uint32      `json:"limit_remaining"`
	ResetAfter   *float64    `json:"duration_until_reset_seconds"` // null: rls said none (no wait admits a cost above the burst)
}

// checkLimit is the limit a descriptor matched.
type checkLimit struct {
	Name            string `json:"name,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
}

// checkHeader is a header rls asks Envoy to add.
type checkHeader struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// writeCheck prints resp in the commands' JSON style, indented by two spaces as /v1/keys is.
func writeCheck(w io.Writer, resp *rlsv3.RateLimitResponse) error {
	out := checkOutput{
		OverallCode:          resp.GetOverallCode().String(),
		Statuses:             make([]checkStatus, 0, len(resp.GetStatuses())),
		ResponseHeadersToAdd: headers(resp.GetResponseHeadersToAdd()),
		RequestHeadersToAdd:  headers(resp.GetRequestHeadersToAdd()),
	}
	for _, st := range resp.GetStatuses() {
		s := checkStatus{Code: st.GetCode().String(), Remaining: st.GetLimitRemaining()}
		if d := st.GetDurationUntilReset(); d != nil {
			secs := d.AsDuration().Seconds()
			s.ResetAfter = &secs
		}
		if l := st.GetCurrentLimit(); l != nil {
			s.CurrentLimit = &checkLimit{Name: l.GetName(), RequestsPerUnit: l.GetRequestsPerUnit(), Unit: strings.ToLower(l.GetUnit().String())}
		}
		out.Statuses = append(out.Statuses, s)
	}
	if md := resp.GetDynamicMetadata(); md != nil {
		b, err := protojson.Marshal(md)
		if err != nil {
			return err
		}
		out.DynamicMetadata = b
	}
	return writeJSON(w, out)
}

// writeJSON prints v indented by two spaces, as rls's HTTP answers are.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func headers[H interface {
	GetKey() string
	GetValue() string
}](hs []H) []checkHeader {
	out := make([]checkHeader, 0, len(hs))
	for _, h := range hs {
		out = append(out, checkHeader{Key: h.GetKey(), Value: h.GetValue()})
	}
	return out
}
