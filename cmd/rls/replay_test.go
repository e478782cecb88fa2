package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/replay"
	"github.com/rls-project/rls/internal/replay/replaytest"
	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/service"
)

// liveRules have periods of an hour: within the few seconds the test takes no limit refills, so
// the answers cannot depend on the microseconds between the live decision and its logged time.
const liveRules = `
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 6}
  - key: path
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 4}
  - key: plan
    rate_limits:
      - {name: hourly, unit: hour, requests_per_unit: 8}
      - {name: daily, unit: day, requests_per_unit: 20, algorithm: sliding_log}
`

// TestReplayAgreesWithService records a stream decided by the real binary (memory backend) with
// the decision log on for every decision, then replays the log: request by request, replay
// gives the answers the server gave (code and remaining: the limits do not refill while the
// test runs), and exactly the answers of the service over a store that is backend.DecideBatch
// alone at the recorded times (reset included).
func TestReplayAgreesWithService(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "decisions.log")
	p := rlstest.Start(t, rlstest.Options{Rules: liveRules, Args: []string{"--backend", "memory",
		"--decision-log", logPath, "--decision-log-rules", "*", "--decision-log-interval", "0", "--shutdown-delay", "0s"}})
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	rng := rand.New(rand.NewPCG(38, 2))
	type sent struct {
		entry []descriptors.Entry
		hits  uint64
		resp  *rlsv3.RateLimitResponse
	}
	var stream []sent
	for range 300 {
		key := []string{"user", "path", "plan"}[rng.IntN(3)]
		e := []descriptors.Entry{{Key: key, Value: fmt.Sprint("v", rng.IntN(6))}}
		hits := uint64(1 + rng.IntN(2))
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: uint32(hits),
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: e[0].Key, Value: e[0].Value}}}}})
		if err != nil {
			t.Fatal(err)
		}
		stream = append(stream, sent{e, hits, resp})
	}
	p.Stop(t) // writes out the log
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd, err := replay.NewReader(f, logPath, replay.FormatAuto, nil)
	if err != nil {
		t.Fatal(err)
	}

	rs, err := descriptors.Parse(map[string][]byte{"r.yaml": []byte(liveRules)})
	if err != nil {
		t.Fatal(err)
	}
	e := replay.NewEngine(rs, replay.Options{})
	pb := replaytest.NewPure()
	svc, err := service.New(rs, service.Options{Backend: pb})
	if err != nil {
		t.Fatal(err)
	}
	denials := 0
	for i, s := range stream {
		var r replay.Request
		if err := rd.Next(&r); err != nil {
			t.Fatalf("line %d of %d: %v", i+1, len(stream), err)
		}
		if got := r.Descs[0]; got.Entries[0] != s.entry[0] || got.Hits != int64(s.hits) || r.Count != 1 {
			t.Fatalf("line %d: %+v, the request sent was %v hits %d", i+1, r, s.entry, s.hits)
		}
		admitted, items, err := e.Decide(&r)
		if err != nil {
			t.Fatal(err)
		}
		// Exactly the service over DecideBatch at the recorded time.
		pb.Now = r.Time
		want, err := svc.ShouldRateLimit(context.Background(), replaytest.ToProto(&r))
		if err != nil {
			t.Fatal(err)
		}
		replaytest.SameAnswer(t, fmt.Sprintf("line %d", i+1), admitted, items, want)
		// The live server's answer: the same code and remaining.
		live := s.resp.Statuses[0]
		got := want.Statuses[0]
		if s.resp.OverallCode != want.OverallCode || live.Code != got.Code || live.LimitRemaining != got.LimitRemaining ||
			live.GetCurrentLimit().GetName() != got.GetCurrentLimit().GetName() {
			t.Fatalf("request %d (%v): live %v %v, replayed %v %v", i+1, s.entry, s.resp.OverallCode, live, want.OverallCode, got)
		}
		if !items[0].Decision.Allowed {
			denials++
		}
	}
	if err := rd.Next(new(replay.Request)); err == nil {
		t.Fatal("the log has more lines than requests were sent")
	}
	if denials == 0 || denials == len(stream) {
		t.Fatalf("%d of %d denied: the stream tests nothing", denials, len(stream))
	}

	// The log's lines carry what the format says: the caller, the rule and the limit.
	data, _ := os.ReadFile(logPath)
	first, err := decisionlog.Parse([]byte(strings.SplitN(string(data), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	if first.Caller != "127.0.0.1" || first.Rule != first.Descriptor[0].Key || first.Count != 1 {
		t.Errorf("first line: %+v", first)
	}
	if !strings.Contains(string(data), `"limit":"hourly"`) && !strings.Contains(string(data), `"limit":"daily"`) {
		t.Error("no line names a limit of the rate_limits list")
	}
	if !strings.Contains(string(data), `"shadow":true`) {
		t.Error("no line says a shadow-mode denial")
	}

	// rls replay on the log counts the denials the server made, per rule.
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(liveRules), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runArgs("replay", "--config", rulesPath, "--input", logPath, "--format", "csv")
	if code != 0 {
		t.Fatalf("rls replay: exit %d\n%s", code, errOut)
	}
	for _, key := range []string{"user", "plan"} { // not path: its shadow-mode denials were answered OK
		n := 0
		for _, s := range stream {
			if s.entry[0].Key == key && s.resp.Statuses[0].Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				n++
			}
		}
		if row := fmt.Sprintf("shop,%s,%s,,%d,%d,,", key, rulesPath, strings.Count(string(data), `"rule":"`+key+`"`), n); !strings.Contains(out, row) {
			t.Errorf("rls replay's CSV has no row %q:\n%s", row, out)
		}
	}
	// A bad line stops replay with its number, or with --on-error skip is named and passed.
	bad := filepath.Join(dir, "bad.log")
	if err := os.WriteFile(bad, append(data, "{not json\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s:%d: not a decision log record", bad, len(stream)+1)
	if code, _, errOut := runArgs("replay", "--config", rulesPath, "--input", bad); code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("a bad line: exit %d, %q; want 1 and %q", code, errOut, want)
	}
	if code, out, errOut := runArgs("replay", "--config", rulesPath, "--input", bad, "--on-error", "skip"); code != 0 ||
		!strings.Contains(errOut, want) || !strings.Contains(out, fmt.Sprintf("replayed %d requests from %d lines (1 skipped)", len(stream), len(stream)+1)) {
		t.Errorf("--on-error skip: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestReplayUsage: wrong values of rls replay's and the decision log's flags are usage errors,
// exit 64, found before anything is read or served.
func TestReplayUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--input", "x.log"}, "usage: rls replay --config RULES"},
		{[]string{"replay", "--config", "r.yaml", "--format", "pdf"}, `--format "pdf": want table, csv or html`},
		{[]string{"replay", "--config", "r.yaml", "--on-error", "maybe"}, `--on-error "maybe": want stop or skip`},
		{[]string{"replay", "--config", "r.yaml", "--input-format", "xml"}, `input format "xml": want auto, log, json or envoy`},
		{[]string{"serve", "--decision-log-rules", "shop"}, "--decision-log-rules and --decision-log-sample need --decision-log"},
		{[]string{"serve", "--decision-log", "-", "--decision-log-interval", "-1s"}, "must be ≥ 0"},
	} {
		code, _, errOut := runArgs(tc.args...)
		if code != 64 || !strings.Contains(errOut, tc.want) {
			t.Errorf("rls %s: exit %d, %q; want 64 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
}

// TestReplayEnvoyAccessLog: rls replay reads an Envoy JSON access log through a mapping file and
// writes the HTML report to --output; a line the mapping cannot read is skipped with its number.
func TestReplayEnvoyAccessLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rules := write("rules.yaml", "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	mapping := write("map.yaml", "domain: edge\ndescriptors:\n  - entries:\n      - {key: remote_address, field: downstream_remote_address_without_port}\n")
	var log strings.Builder
	for i := range 10 {
		fmt.Fprintf(&log, `{"start_time":"2026-12-03T18:00:%02d.000Z","method":"GET","path":"/","response_code":200,"downstream_remote_address_without_port":"10.0.0.%d"}`+"\n", i, i%2)
	}
	log.WriteString(`{"start_time":"2026-12-03T18:00:11.000Z","path":"/"}` + "\n")
	access := write("access.log", log.String())
	report := filepath.Join(dir, "report.html")
	code, out, errOut := runArgs("replay", "--config", rules, "--mapping", mapping, "--input", access, "--on-error", "skip", "--format", "html", "--output", report)
	if code != 0 || out != "" {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if want := access + `:11: descriptor 1, entry "remote_address": no field "downstream_remote_address_without_port" in the line`; !strings.Contains(errOut, want) {
		t.Errorf("stderr %q, want %q", errOut, want)
	}
	page, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "edge / remote_address", "replayed 10 requests from 11 lines (1 skipped)", "<td>remote_address=10.0.0.0</td><td class=\"n\">2</td>"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the report has no %q", want)
		}
	}
}
