package service

import (
	"context"
	"log/slog"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/descriptors"
)

// debugDecision logs a decided request at debug level: its domain, descriptors (values
// included: debug only), hits and each status's code, what remains and the rule's limit. At
// any other level it costs one check.
func (s *Service) debugDecision(ctx context.Context, req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) {
	if !s.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	var descs []byte // each in the text form rls check reads, separated by "; "
	for i, d := range req.Descriptors {
		if i > 0 {
			descs = append(descs, "; "...)
		}
		for j, e := range d.Entries {
			if j > 0 {
				descs = append(descs, ',')
			}
			descs = descriptors.AppendEntry(descs, e.GetKey(), e.GetValue())
		}
	}
	var codes strings.Builder
	for i, st := range resp.GetStatuses() {
		if i > 0 {
			codes.WriteByte(' ')
		}
		codes.WriteString(st.GetCode().String())
	}
	s.log.LogAttrs(ctx, slog.LevelDebug, "decision", slog.String("domain", req.GetDomain()),
		slog.String("descriptors", string(descs)), slog.Uint64("hits_addend", uint64(req.GetHitsAddend())),
		slog.String("overall_code", resp.GetOverallCode().String()), slog.String("codes", codes.String()))
}
