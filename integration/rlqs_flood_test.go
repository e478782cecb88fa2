package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// rlsPid finds the rls process whose command line names marker (a path unique to the test).
func rlsPid(t testing.TB, marker string) int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), marker) || !strings.Contains(string(cmdline), "--grpc-addr") {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err == nil {
			return pid
		}
	}
	t.Fatalf("no rls process names %s", marker)
	return 0
}

// procStatus reads a "kB" field of /proc/<pid>/status (VmHWM, VmRSS) in bytes.
func procStatus(t testing.TB, pid int, field string) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// procCPU is the CPU time, user and system, process pid has used so far.
func procCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // clock ticks (USER_HZ)
}

// largestBucket is bucket i with the largest id rls accepts: 8 pairs of 128-byte keys and
// 512-byte values.
func largestBucket(i int) map[string]string {
	m := make(map[string]string, 8)
	for k := range 8 {
		key := fmt.Sprintf("k%d-", k) + strings.Repeat("k", 125)
		m[key[:128]] = (fmt.Sprintf("%d-%d-", i, k) + strings.Repeat("v", 512))[:512]
	}
	return m
}

// TestRLQSFlood: a hostile RLQS client opens more streams than rls allows and reports more and
// larger buckets than it allows, on rls's default bounds; it is refused at each bound with
// RESOURCE_EXHAUSTED and the bound's flag, counted by reason and logged a few lines only, while
// peak RSS stays within 64 MiB of idle and an ordinary proxy's stream, open beside the flood,
// goes on being answered with its share. Once the flood's streams end, their buckets and ids
// are released.
func TestRLQSFlood(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	args := []string{"--rlqs", "--config", rules}
	maxStreams := 512 // the defaults
	var bound int64 = 64 << 20
	if raceEnabled {
		// The race detector multiplies what every goroutine and allocation costs several times
		// over (a stream costs 150 KB rather than 27 KB, and the garbage of decoding the flood's
		// reports is shadowed too): the same flood against bounds a fifth of the defaults or
		// less, within a wider margin.
		maxStreams, bound = 100, 96<<20
		args = append(args, "--rlqs-max-streams", "100", "--rlqs-max-total-buckets", "2000", "--rlqs-max-bucket-bytes", "524288")
	}
	p := startRLS(t, nil, args...)
	pid := rlsPid(t, rules)

	ordinary := startOrdinaryProxy(t, p.GRPCAddr)
	ordinary.check(t, "before the flood")
	idle := procStatus(t, pid, "VmHWM")

	// Connections enough for the streams (a connection carries up to 100 calls,
	// --grpc-max-concurrent-streams; gRPC's client queues a stream past it).
	const conns = 8
	streams := maxStreams + 76
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clients := make([]rlqspb.RateLimitQuotaServiceClient, conns)
	for i := range clients {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients[i] = rlqspb.NewRateLimitQuotaServiceClient(conn)
	}
	type refusal struct {
		code codes.Code
		msg  string
	}
	var (
		mu       sync.Mutex
		refusals = map[string]int{} // by the bound's flag named
		open     []rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
		ends     []context.CancelFunc // of open, in its order
		others   []refusal
	)
	refused := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		st := status.Convert(err)
		for _, flag := range []string{"--rlqs-max-streams", "--rlqs-max-bucket-bytes", "--rlqs-max-total-buckets"} {
			if st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), flag) {
				refusals[flag]++
				return
			}
		}
		others = append(others, refusal{st.Code(), st.Message()})
	}
	// send reports m on s and reads its answer, reporting whether the stream still serves.
	send := func(s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, m *rlqspb.RateLimitQuotaUsageReports) bool {
		_ = s.Send(m) // a stream ended says EOF here and its status at Recv
		resp, err := s.Recv()
		if err != nil {
			refused(err)
			return false
		}
		if n := len(resp.GetBucketAction()); n != len(m.GetBucketQuotaUsages()) {
			t.Errorf("%d actions for a report of %d buckets", n, len(m.GetBucketQuotaUsages()))
		}
		return true
	}

	// 1. More streams than --rlqs-max-streams.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range streams {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sctx, end := context.WithCancel(ctx)
			s, err := clients[i%conns].StreamRateLimitQuotas(sctx)
			if err != nil {
				end()
				refused(err)
				return
			}
			if send(s, &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				usage(map[string]string{"flood": strconv.Itoa(i)}, 1, 0, time.Second)}}) {
				mu.Lock()
				open, ends = append(open, s), append(ends, end)
				mu.Unlock()
				return
			}
			end()
		}()
	}
	wg.Wait()
	t.Logf("%d of %d flood streams open; peak RSS %.1f MB", len(open), streams, float64(procStatus(t, pid, "VmHWM"))/1e6)

	// 2. The largest ids, 50 a report, until a report passes --rlqs-max-bucket-bytes (at most
	// 200 reports, 10,000 ids of 5 KiB).
	// A stream a report each.
	next, used := 0, 0
	for used < len(open) && used < 200 {
		m := &rlqspb.RateLimitQuotaUsageReports{}
		for range 50 {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(largestBucket(next), 1, 0, time.Second))
			next++
		}
		ok := send(open[used], m)
		used++
		if !ok && refusals["--rlqs-max-bucket-bytes"] >= 3 {
			break
		}
	}
	t.Logf("largest ids reported; peak RSS %.1f MB", float64(procStatus(t, pid, "VmHWM"))/1e6)
	// Those streams end, releasing their ids.
	for _, end := range ends[:used] {
		end()
	}
	// 3. Small ids, 1,000 a report, on the other streams until --rlqs-max-total-buckets (at most
	// 80 reports).
	for n := 0; used < len(open) && n < 80; n++ {
		m := &rlqspb.RateLimitQuotaUsageReports{}
		for range 1000 {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"flood": "b" + strconv.Itoa(next)}, 1, 0, time.Second))
			next++
		}
		ok := send(open[used], m)
		used++
		if !ok && refusals["--rlqs-max-total-buckets"] >= 3 {
			break
		}
	}
	// The streams left open hold the flood's buckets: what they cost while open.
	cpu0, at := procCPU(t, pid), time.Now()
	time.Sleep(3 * time.Second)
	cpu := float64(procCPU(t, pid)-cpu0) / float64(time.Since(at))
	peak := procStatus(t, pid, "VmHWM")
	t.Logf("peak RSS: idle %.1f MB, after the flood %.1f MB (+%.1f MB); CPU with the flood's streams open: %.2f core; refusals %v",
		float64(idle)/1e6, float64(peak)/1e6, float64(peak-idle)/1e6, cpu, refusals)

	// The ordinary proxy, beside it all, is answered as before.
	ordinary.check(t, "beside the flood")
	for _, flag := range []string{"--rlqs-max-streams", "--rlqs-max-bucket-bytes", "--rlqs-max-total-buckets"} {
		if refusals[flag] == 0 {
			t.Errorf("nothing refused at %s", flag)
		}
	}
	if len(others) > 0 {
		t.Errorf("%d streams ended otherwise, first: %v", len(others), others[0])
	}
	if peak > idle+bound {
		t.Errorf("peak RSS %.1f MB, more than idle (%.1f MB) + %d MiB", float64(peak)/1e6, float64(idle)/1e6, bound>>20)
	}
	for _, reason := range []string{"too_many_streams", "bucket_id_bytes", "too_many_buckets_total"} {
		if v := metric(t, p.HTTPAddr, "rls_rlqs_refused_total", `{reason="`+reason+`"}`); v < 1 {
			t.Errorf("rls_rlqs_refused_total{reason=%q} %v, want ≥ 1", reason, v)
		}
	}
	// Warnings a client causes are throttled: a line per cause per interval, not one per stream.
	if n := strings.Count(p.Output(), "rlqs: stream refused"); n == 0 || n > 6 {
		t.Errorf("%d log lines for the refusals, want one per cause (3) or a few more", n)
	}

	// /debug/rlqs lists what it is asked for, not every bucket, and says so.
	var list struct {
		Buckets     int               `json:"buckets"`
		Truncated   bool              `json:"truncated"`
		Assignments []json.RawMessage `json:"assignments"`
	}
	getJSON(t, "http://"+p.DebugAddr+"/debug/rlqs?limit=5", &list)
	if len(list.Assignments) != 5 || !list.Truncated || list.Buckets < 1000 {
		t.Errorf("/debug/rlqs?limit=5 beside the flood: %d assignments, truncated %v, buckets %d", len(list.Assignments), list.Truncated, list.Buckets)
	}

	// The flood ends: its buckets and their ids are released at once.
	cancel()
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		b, by := metric(t, p.HTTPAddr, "rls_rlqs_stream_buckets", ""), metric(t, p.HTTPAddr, "rls_rlqs_bucket_id_bytes", "")
		if b == 1 && by == float64(len(streamKey("rlqs", "api_key", "shared"))) {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("10 s after the flood ended: %v buckets and %v bytes of ids kept, want the ordinary proxy's 1", b, by)
		}
	}
	ordinary.check(t, "after the flood")
}

// ordinaryProxy is a proxy as Envoy's filter is: it reports its bucket (api_key=shared, 100
// requests a second) every 300 ms and applies every assignment that arrives.
type ordinaryProxy struct {
	mu       sync.Mutex
	rate     uint32 // of the last assignment
	answered int    // assignments received
	err      error  // the stream's end, if it ended
}

func startOrdinaryProxy(t *testing.T, addr string) *ordinaryProxy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := rlqsClient(t, addr).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o := &ordinaryProxy{}
	report := func() error {
		return s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"api_key": "shared"}, 30, 0, 300*time.Millisecond)}})
	}
	go func() {
		for {
			resp, err := s.Recv()
			o.mu.Lock()
			if err != nil {
				if ctx.Err() == nil {
					o.err = err
				}
				o.mu.Unlock()
				return
			}
			for _, a := range resp.GetBucketAction() {
				o.rate = a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue()
				o.answered++
			}
			o.mu.Unlock()
		}
	}()
	go func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			if report() != nil {
				return
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	return o
}

// check waits up to 5 s for the proxy to be answered again, and checks that it holds the whole
// limit less its reserve (969 of 1,000/s: no other proxy reports its bucket).
func (o *ordinaryProxy) check(t *testing.T, when string) {
	t.Helper()
	o.mu.Lock()
	from := o.answered
	o.mu.Unlock()
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(20 * time.Millisecond) {
		o.mu.Lock()
		rate, answered, err := o.rate, o.answered, o.err
		o.mu.Unlock()
		if err != nil {
			t.Fatalf("ordinary proxy %s: stream ended: %v", when, err)
		}
		if answered > from {
			if rate != 969 {
				t.Errorf("ordinary proxy %s: rate %d, want 969", when, rate)
			}
			return
		}
	}
	t.Errorf("ordinary proxy %s: not answered within 5 s", when)
}

// streamKey is the length of rls's key for a one-pair bucket (see internal/rlqs bucketID.key).
func streamKey(domain, k, v string) string {
	return fmt.Sprintf("%d:%s|%d:%s=%d:%s", len(domain), domain, len(k), k, len(v), v)
}
