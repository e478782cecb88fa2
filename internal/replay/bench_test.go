package replay_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/replay"
	"github.com/rls-project/rls/internal/rlstest"
)

func benchRules(b *testing.B) *descriptors.RuleSet {
	rs, err := descriptors.Parse(map[string][]byte{"b.yaml": []byte(`
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
`)})
	if err != nil {
		b.Fatal(err)
	}
	return rs
}

// benchRequests are n single-descriptor requests over 10000 users, 10 µs apart (100k a second:
// about one in ten denied).
func benchRequests(n int) []replay.Request {
	reqs := make([]replay.Request, n)
	start := time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC).UnixMicro()
	for i := range reqs {
		reqs[i] = replay.Request{Time: start + int64(i)*10, Domain: "shop", Descs: []replay.Desc{
			{Entries: []descriptors.Entry{{Key: "user", Value: fmt.Sprint("u", (i*7919)%10000)}}, Hits: 1}}}
	}
	return reqs
}

// rate reports requests a second of wall time and of this process's CPU time (the figure for
// one core on a machine shared with other work), n requests since cpu0.
func rate(b *testing.B, n int, cpu0 time.Duration) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "requests/s")
	b.ReportMetric(float64(n)/(rlstest.ProcessCPU(b)-cpu0).Seconds(), "requests/cpu-s")
}

// BenchmarkReplay measures replay's speed on single-descriptor requests (run it with -cpu 1 for
// one core): the engine's decisions alone, with the report's counting (Run.Decide), and from
// decision log lines read and parsed (Run.Replay).
func BenchmarkReplay(b *testing.B) {
	reqs := benchRequests(1 << 16)
	start := reqs[0].Time
	b.Run("engine", func(b *testing.B) {
		e := replay.NewEngine(benchRules(b), replay.Options{})
		b.ReportAllocs()
		cpu0 := rlstest.ProcessCPU(b)
		for i := 0; b.Loop(); i++ {
			r := &reqs[i%len(reqs)]
			r.Time = start + int64(i)*10
			if _, _, err := e.Decide(r); err != nil {
				b.Fatal(err)
			}
		}
		rate(b, b.N, cpu0)
	})
	b.Run("run", func(b *testing.B) {
		run := &replay.Run{Sets: []*replay.Engine{replay.NewEngine(benchRules(b), replay.Options{})}, Names: []string{"b.yaml"}}
		b.ReportAllocs()
		cpu0 := rlstest.ProcessCPU(b)
		for i := 0; b.Loop(); i++ {
			r := &reqs[i%len(reqs)]
			r.Time = start + int64(i)*10
			if err := run.Decide(r); err != nil {
				b.Fatal(err)
			}
		}
		rate(b, b.N, cpu0)
	})
	b.Run("log-lines", func(b *testing.B) {
		var in bytes.Buffer
		for i, r := range reqs {
			rec := decisionlog.Record{Time: time.UnixMicro(start + int64(i)*10), Domain: r.Domain, Descriptor: r.Descs[0].Entries,
				HitsAddend: 1, Rule: "user", Code: decisionlog.CodeOK, Count: 1}
			in.Write(append(rec.AppendJSON(nil), '\n'))
		}
		data := in.Bytes()
		b.ReportAllocs()
		cpu0 := rlstest.ProcessCPU(b)
		for b.Loop() {
			run := &replay.Run{Sets: []*replay.Engine{replay.NewEngine(benchRules(b), replay.Options{})}, Names: []string{"b.yaml"}}
			rd, _ := replay.NewReader(bytes.NewReader(data), "bench", replay.FormatLog, nil)
			if err := run.Replay(rd); err != nil {
				b.Fatal(err)
			}
		}
		rate(b, b.N*len(reqs), cpu0)
	})
}
