package service

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/httpjson"
	"github.com/rls-project/rls/internal/limit"
)

type limitJSON struct {
	Name            string   `json:"name,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit"`
	Unit            string   `json:"unit"`
	UnitMultiplier  uint32   `json:"unit_multiplier"`
	Burst           uint32   `json:"burst"`
	Replaces        []string `json:"replaces,omitempty"`
	Overdraft       bool     `json:"overdraft,omitempty"`
	Algorithm       string   `json:"algorithm"`
	Timezone        string   `json:"timezone,omitempty"`
}

func toLimitJSON(l *descriptors.Limit) limitJSON {
	return limitJSON{Name: l.Name, RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit.String(), UnitMultiplier: l.UnitMultiplier, Burst: l.Burst,
		Replaces: l.Replaces, Overdraft: l.Spec.Overdraft, Algorithm: l.Spec.Algorithm.String(), Timezone: l.Timezone}
}

type ruleJSON struct {
	Path        string         `json:"path"`
	Source      string         `json:"source"`
	Limits      []limitJSON    `json:"limits,omitempty"`
	Unlimited   bool           `json:"unlimited,omitempty"`
	ShadowMode  bool           `json:"shadow_mode,omitempty"`
	QuotaMode   bool           `json:"quota_mode,omitempty"`
	FailureMode string         `json:"failure_mode,omitempty"`
	Metadata    map[string]any `json:"metadata,omitempty"`
}

func toRuleJSON(r *descriptors.Rule) *ruleJSON {
	if r == nil {
		return nil
	}
	j := &ruleJSON{Path: r.Path, Source: r.Source, Unlimited: r.Unlimited, ShadowMode: r.ShadowMode, QuotaMode: r.QuotaMode, FailureMode: r.FailureMode.String(), Metadata: r.Metadata}
	for i := range r.Limits {
		j.Limits = append(j.Limits, toLimitJSON(&r.Limits[i]))
	}
	return j
}

// RulesHandler serves GET /debug/rules: the rules in force, their generation, files and every
// rule with its limits and where it is defined.
func (s *Service) RulesHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs := s.Rules()
		if rs == nil {
			http.Error(w, "no rules loaded yet", http.StatusServiceUnavailable)
			return
		}
		gen, at := s.Generation()
		type domainJSON struct {
			Name  string      `json:"name"`
			File  string      `json:"file"`
			Rules []*ruleJSON `json:"rules"`
		}
		out := struct {
			Generation uint64       `json:"generation"`
			LoadedAt   time.Time    `json:"loaded_at"`
			Files      []string     `json:"files"`
			Domains    []domainJSON `json:"domains"`
		}{Generation: gen, LoadedAt: at.UTC(), Files: rs.Files}
		for _, d := range rs.Domains {
			dj := domainJSON{Name: d.Name, File: d.File, Rules: []*ruleJSON{}}
			for _, r := range d.Rules {
				dj.Rules = append(dj.Rules, toRuleJSON(r))
			}
			out.Domains = append(out.Domains, dj)
		}
		httpjson.Write(w, http.StatusOK, out)
	})
}

// GlobalExplainer says what this region holds of a limit global across regions (package
// regions), for /debug/explain.
type GlobalExplainer interface {
	ExplainShare(key string, l limit.Limit) any
}

type explainLimit struct {
	limitJSON
	Global     any    `json:"global,omitempty"` // this region's share of a global limit
	BackendKey string `json:"backend_key"`
	Replaced   bool   `json:"replaced,omitempty"`
	Remaining  *int64 `json:"remaining,omitempty"`
	ResetAfter string `json:"reset_after,omitempty"`
	Error      string `json:"error,omitempty"`
}

type explainDescriptor struct {
	Entries  []descriptors.Entry `json:"entries"`
	Rule     *ruleJSON           `json:"rule"`
	Override bool                `json:"override,omitempty"`
	Reason   string              `json:"reason,omitempty"`
	Limits   []explainLimit      `json:"limits,omitempty"`
}

// ExplainHandler serves POST /debug/explain: a RateLimitRequest in protobuf JSON in; out, per
// descriptor, the rule matched (or why none), its limits, their backend keys and current state
// (remaining, time to a full burst). It charges nothing.
func (s *Service) ExplainHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := readRequest(w, r, s.maxJSON)
		if !ok {
			return
		}
		if err := validate(req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if s.Rules() == nil {
			http.Error(w, "no rules loaded yet", http.StatusServiceUnavailable)
			return
		}
		httpjson.Write(w, http.StatusOK, s.explain(r, req))
	})
}

func (s *Service) explain(r *http.Request, req *rlsv3.RateLimitRequest) any {
	rs := s.Rules()
	gen, _ := s.Generation()
	var wk work
	s.translate(rs, req, &wk, true)
	out := make([]explainDescriptor, len(req.Descriptors))
	for i, d := range req.Descriptors {
		es := make([]descriptors.Entry, len(d.Entries))
		for j, e := range d.Entries {
			es[j] = descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		out[i].Entries = es
		if wk.descs[i].override {
			out[i].Override = true
			continue
		}
		rule, reason := rs.Explain(req.GetDomain(), es)
		out[i].Rule, out[i].Reason = toRuleJSON(rule), reason
		if rule != nil && rule.Unlimited {
			out[i].Reason = "unlimited"
		}
	}
	// Check, never charge: every limit not replaced, at cost 0, in shadow mode.
	var reqs []backend.Request
	var at [][2]int // (descriptor, limit) of each of reqs
	for k := range wk.items {
		it := &wk.items[k]
		ed := &out[it.desc]
		if !it.replaced {
			reqs = append(reqs, backend.Request{Key: it.req.Key, Limit: it.req.Limit, Mode: backend.Shadow})
			at = append(at, [2]int{it.desc, len(ed.Limits)})
		}
		el := explainLimit{limitJSON: toLimitJSON(it.limit), BackendKey: it.req.Key, Replaced: it.replaced}
		if it.req.Limit.Shared && s.global != nil {
			el.Global = s.global.ExplainShare(it.req.Key, it.req.Limit)
		}
		ed.Limits = append(ed.Limits, el)
	}
	if len(reqs) > 0 {
		decs := make([]backend.Decision, len(reqs))
		_, err := s.backend.Decide(r.Context(), reqs, decs)
		for k, ij := range at {
			el := &out[ij[0]].Limits[ij[1]]
			if err != nil {
				el.Error = clientMessage(err)
				continue
			}
			rem := decs[k].Remaining
			el.Remaining = &rem
			el.ResetAfter = decs[k].ResetAfter.String()
		}
	}
	return struct {
		Domain      string              `json:"domain"`
		Generation  uint64              `json:"generation"`
		Descriptors []explainDescriptor `json:"descriptors"`
	}{req.GetDomain(), gen, out}
}

// RLConfigHandler serves GET /rlconfig as envoyproxy/ratelimit does: one line per rule,
// "<domain>.<key>_<value>...: unit=MINUTE requests_per_unit=10, shadow_mode: false", in text.
func (s *Service) RLConfigHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		rs := s.Rules()
		if rs == nil {
			http.Error(w, "no rules loaded yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var b strings.Builder
		for _, d := range rs.Domains {
			for _, r := range d.Rules {
				name := d.Name + "." + strings.NewReplacer("=", "_", "/", ".").Replace(r.Path)
				shadow := r.ShadowMode || s.shadowAll
				if r.Unlimited {
					fmt.Fprintf(&b, "%s: unlimited, shadow_mode: %t\n", name, shadow)
				}
				for _, l := range r.Limits {
					unit := strings.ToUpper(l.Unit.String())
					if l.UnitMultiplier > 1 {
						unit = fmt.Sprintf("%d*%s", l.UnitMultiplier, unit)
					}
					fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, burst=%d, shadow_mode: %t\n", name, unit, l.RequestsPerUnit, l.Burst, shadow)
				}
			}
		}
		io.WriteString(w, b.String())
	})
}
