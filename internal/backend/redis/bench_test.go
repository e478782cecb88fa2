package redis

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/rlstest"
)

// benchClients runs body from clients goroutines in all (one: a plain loop).
func benchClients(b *testing.B, clients int, body func(i int64)) {
	var n atomic.Int64
	if clients == 1 {
		for b.Loop() {
			body(n.Add(1))
		}
		return
	}
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body(n.Add(1))
		}
	})
}

// BenchmarkDecide measures one-request batches on distinct keys (the admitted path), with and
// without coalescing, at 1, 8 and 64 concurrent clients, on a single node and on the Cluster.
// cpu-ns/op is this process's CPU per decision, the kernel's work for its round trips included
// (Redis's own CPU is another process's): set beside BenchmarkMemoryDecide's, what the Redis
// path costs rls itself.
func BenchmarkDecide(b *testing.B) {
	for _, topo := range []struct{ name, env string }{{"single", singleEnv}, {"cluster", clusterEnv}} {
		for _, co := range []struct {
			name string
			opts Options
		}{
			{"direct", Options{}},
			{"coalesced", Options{Coalesce: 64, CoalescePipelines: 1}},
			{"coalesced-2", Options{Coalesce: 64, CoalescePipelines: 2}},
		} {
			for _, clients := range []int{1, 8, 64} {
				b.Run(fmt.Sprintf("%s/%s/clients=%d", topo.name, co.name, clients), func(b *testing.B) {
					be := newTestBackend(b, topo.env, co.opts)
					l := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
					b.ReportAllocs()
					cpu := rlstest.ProcessCPU(b)
					benchClients(b, clients, func(i int64) {
						out := make([]backend.Decision, 1)
						ok, err := be.Decide(context.Background(), []backend.Request{{Key: "bench-" + strconv.FormatInt(i%10000, 10), Limit: l, Cost: 1}}, out)
						if err != nil || !ok {
							b.Fatalf("admitted=%v err=%v", ok, err)
						}
					})
					rlstest.ReportCPU(b, cpu)
				})
			}
		}
	}
}

// BenchmarkDecideDenied measures a hot denied key, with and without the local cache.
func BenchmarkDecideDenied(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts Options
	}{{"redis", Options{}}, {"cached", Options{LocalCacheSize: 1000}}} {
		for _, clients := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", tc.name, clients), func(b *testing.B) {
				be := newTestBackend(b, singleEnv, tc.opts)
				l := limit.Limit{Rate: 1, Period: time.Hour, Burst: 1}
				req := []backend.Request{{Key: "hot", Limit: l, Cost: 1}}
				be.Decide(context.Background(), req, make([]backend.Decision, 1))
				b.ReportAllocs()
				benchClients(b, clients, func(int64) {
					out := make([]backend.Decision, 1)
					ok, err := be.Decide(context.Background(), req, out)
					if err != nil || ok {
						b.Fatalf("admitted=%v err=%v", ok, err)
					}
				})
			})
		}
	}
}

// BenchmarkDecideBatch measures five-descriptor requests, which a Cluster splits over slots.
func BenchmarkDecideBatch(b *testing.B) {
	for _, topo := range []struct{ name, env string }{{"single", singleEnv}, {"cluster", clusterEnv}} {
		b.Run(topo.name, func(b *testing.B) {
			be := newTestBackend(b, topo.env, Options{})
			l := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
			b.ReportAllocs()
			benchClients(b, 8, func(i int64) {
				reqs := make([]backend.Request, 5)
				for k := range reqs {
					reqs[k] = backend.Request{Key: fmt.Sprintf("batch-%d-%d", i%1000, k), Limit: l, Cost: 1}
				}
				out := make([]backend.Decision, len(reqs))
				if ok, err := be.Decide(context.Background(), reqs, out); err != nil || !ok {
					b.Fatalf("admitted=%v err=%v", ok, err)
				}
			})
		})
	}
}

// BenchmarkScript measures Redis's own time in the script (INFO commandstats usec) per
// decision: a lone one-key call, and merged calls of one-key batches as coalescing sends them
// under load. It resets the server's command statistics.
func BenchmarkScript(b *testing.B) {
	for _, n := range []int{1, 14, 64} {
		b.Run(fmt.Sprintf("merged=%d", n), func(b *testing.B) {
			be := newTestBackend(b, singleEnv, Options{})
			ctx := context.Background()
			l := limit.Limit{Rate: 1_000_000, Period: time.Second, Burst: 1_000_000}
			calls := make([]*call, n)
			for i := range calls {
				calls[i] = &call{}
			}
			if err := be.rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			var decisions int64
			for r := 0; b.Loop(); r++ {
				for i, c := range calls {
					c.reset()
					req := backend.Request{Limit: l, Cost: 1}
					c.add(fmt.Sprintf("%sk%d-%d", be.prefix, r%1000, i), &req, 0)
				}
				args := decideArgs(script.Hash(), 0, calls[0])
				if n > 1 {
					args = mergedArgs(script.Hash(), 0, calls)
				}
				if err := be.rdb.Do(ctx, be.callArgs(args)...).Err(); err != nil {
					b.Fatal(err)
				}
				decisions += int64(n)
			}
			b.ReportMetric(scriptUsec(b, be)/float64(decisions), "redis-µs/decision")
		})
	}
}

// minimalGCRA is the baseline for BenchmarkScript: the least a GCRA script can do per key in
// integer microseconds (one burst, cost 1, no state format, no other algorithm, no batch rules):
// TIME once, the keys' TATs with one MGET, then per key the decision and, when admitted, a SET
// with its expiry. ARGV[1] is the emission interval and ARGV[2] the burst's tolerance, in us.
const minimalGCRA = `
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2])
local tats = redis.call("MGET", unpack(KEYS))
local out = {}
for i = 1, #KEYS do
  local tat = tonumber(tats[i]) or now
  if tat < now then tat = now end
  local new = tat + interval
  if new - now > tolerance then
    out[i] = 0
  else
    redis.call("SET", KEYS[i], new, "PX", math.ceil((new - now) / 1000))
    out[i] = 1
  end
end
return out
`

// BenchmarkScriptBaseline measures what BenchmarkScript does, for the same calls, with the
// least script (minimalGCRA) and with a bare INCR and PEXPIRE per key (the least any limiter
// that stores per-key state with an expiry asks of Redis): the baselines for rls's script's time
// on the machine at hand, measured in the same run.
func BenchmarkScriptBaseline(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1, 14, 64} {
		b.Run(fmt.Sprintf("minimal/merged=%d", n), func(b *testing.B) {
			be := newTestBackend(b, singleEnv, Options{})
			sha, err := be.rdb.ScriptLoad(ctx, minimalGCRA).Result()
			if err != nil {
				b.Fatal(err)
			}
			keys := make([]string, n)
			if err := be.rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			var decisions int64
			for r := 0; b.Loop(); r++ {
				for i := range keys {
					keys[i] = fmt.Sprintf("%sm%d-%d", be.prefix, r%1000, i)
				}
				// 1 us per request, a burst of 10^6: every call is admitted, as in BenchmarkScript.
				if err := be.rdb.EvalSha(ctx, sha, keys, 1, 1_000_000).Err(); err != nil {
					b.Fatal(err)
				}
				decisions += int64(n)
			}
			b.ReportMetric(scriptUsec(b, be)/float64(decisions), "redis-µs/decision")
		})
	}
	b.Run("incr+pexpire", func(b *testing.B) {
		be := newTestBackend(b, singleEnv, Options{})
		if err := be.rdb.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		var decisions int64
		for r := 0; b.Loop(); r++ {
			key := fmt.Sprintf("%si%d", be.prefix, r%1000)
			if err := be.rdb.Do(ctx, "INCR", key).Err(); err != nil {
				b.Fatal(err)
			}
			if err := be.rdb.Do(ctx, "PEXPIRE", key, 1000).Err(); err != nil {
				b.Fatal(err)
			}
			decisions++
		}
		b.ReportMetric(commandUsec(b, be, "cmdstat_incr:", "cmdstat_pexpire:")/float64(decisions), "redis-µs/decision")
	})
}

// callArgs makes args, a call of the script, a call as exec sends it: FCALL while the library is
// loaded.
func (b *Backend) callArgs(args []any) []any {
	if b.lib.fcall.Load() {
		args[0], args[1] = "fcall", functionName
	}
	return args
}

// scriptUsec returns the microseconds Redis spent in the script (EVALSHA, EVAL, FCALL) since its statistics were
// reset.
func scriptUsec(b *testing.B, be *Backend) float64 {
	return commandUsec(b, be, "cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_fcall:")
}

// commandUsec returns the microseconds Redis spent in the commands whose INFO commandstats
// lines start with one of prefixes since its statistics were reset.
func commandUsec(b *testing.B, be *Backend, prefixes ...string) float64 {
	return commandStat(b, be, "usec", prefixes...)
}

// commandStat returns the sum of field (calls, usec) of the INFO commandstats lines that start
// with one of prefixes, since Redis's statistics were reset.
func commandStat(tb testing.TB, be *Backend, field string, prefixes ...string) float64 {
	tb.Helper()
	info, err := be.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(line, p) }) {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(f, field+"="); ok {
				u, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatal(err)
				}
				total += u
			}
		}
	}
	return total
}

// BenchmarkAlgorithms measures, per algorithm, Redis's own time in the script per one-key
// decision (INFO commandstats usec, as BenchmarkScript) and the memory a key takes (MEMORY USAGE,
// averaged over the keys at the end). sliding_log's cost grows with the hits its log holds:
// held is how many each key holds before the loop; the loop adds one per decision, over 100
// keys. The limits admit 10,000 per hour, above limit.MaxLogRate for sliding_log: held=9000
// shows what the bound keeps out. It resets the server's command statistics.
func BenchmarkAlgorithms(b *testing.B) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		b.Fatal(err)
	}
	const rate = 10 * limit.MaxLogRate
	limitOf := func(alg limit.Algorithm) limit.Limit {
		return limit.Limit{Rate: rate, Period: time.Hour, Burst: rate, Algorithm: alg}
	}
	month := limitOf(limit.FixedWindow)
	month.Period, month.Window = 30*24*time.Hour, limit.Window{Calendar: limit.Month, Every: 1, Location: tokyo}
	for n, tc := range []struct {
		name string
		l    limit.Limit
		held int
	}{
		{"gcra", limitOf(limit.GCRA), 0},
		{"fixed_window", limitOf(limit.FixedWindow), 0},
		{"fixed_window-month-tokyo", month, 0},
		{"sliding_window", limitOf(limit.SlidingWindow), 0},
		{"sliding_log/held=1", limitOf(limit.SlidingLog), 1},
		{"sliding_log/held=100", limitOf(limit.SlidingLog), 100},
		{"sliding_log/held=1000", limitOf(limit.SlidingLog), 1000},
		{"sliding_log/held=9000", limitOf(limit.SlidingLog), 9000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			be := newTestBackend(b, singleEnv, Options{})
			ctx := context.Background()
			keys := make([]string, 100)
			now := time.Now().UnixMicro()
			for i := range keys {
				keys[i] = fmt.Sprintf("%salg-%d-%02d", be.prefix, n, i) // one length for all: bytes/key compare
				s := backend.State{Alg: tc.l.Algorithm, Rate: rate, Period: int64(time.Hour / time.Microsecond)}
				for k := range tc.held {
					s.Log = append(s.Log, now-int64(tc.held-k)*1000, 1)
				}
				if tc.held > 0 {
					if err := be.rdb.Set(ctx, keys[i], encodeState(s), time.Hour).Err(); err != nil {
						b.Fatal(err)
					}
				}
			}
			c := &call{}
			decide := func(key string) {
				c.reset()
				c.add(key, &backend.Request{Limit: tc.l, Cost: 1}, time.Now().UnixMicro())
				if err := be.rdb.Do(ctx, be.callArgs(decideArgs(script.Hash(), 0, c))...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			for _, k := range keys {
				decide(k)
			}
			if err := be.rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			var decisions int64
			for r := 0; b.Loop(); r++ {
				decide(keys[r%len(keys)])
				decisions++
			}
			b.ReportMetric(scriptUsec(b, be)/float64(decisions), "redis-µs/decision")
			var bytes int64
			for _, k := range keys {
				n, err := be.rdb.MemoryUsage(ctx, k).Result()
				if err != nil {
					b.Fatal(err)
				}
				bytes += n
			}
			b.ReportMetric(float64(bytes)/float64(len(keys)), "redis-bytes/key")
		})
	}
}
