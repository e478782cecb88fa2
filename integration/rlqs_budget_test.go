package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/internal/redistest"
)

// largeReport is a report of at most size bytes on the wire, and close to it: one-pair
// buckets, as many as fit, which cost rls the most to decode per byte.
func largeReport(size int) []byte {
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs"}
	for n, i := proto.Size(m), 0; ; i++ {
		u := usage(map[string]string{"flood": fmt.Sprintf("b%07d", i)}, 1, 0, time.Second)
		// The field's tag and length prefix: 1 byte each (a usage is under 128 bytes).
		if n += 2 + proto.Size(u); n > size {
			break
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, u)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// rawCodec sends a []byte as the message it encodes, so that a test sends a large report
// marshalled once rather than once a stream; it decodes answers as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// rawStream opens an RLQS stream on conn whose reports are sent as bytes.
func rawStream(ctx context.Context, conn *grpc.ClientConn) (grpc.ClientStream, error) {
	return conn.NewStream(ctx, &rlqspb.RateLimitQuotaService_ServiceDesc.Streams[0],
		rlqspb.RateLimitQuotaService_StreamRateLimitQuotas_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// TestRLQSReportBudget: 512 streams each send one report of the largest size rls accepts
// (--rlqs-max-report-bytes, 1 MiB: 36,157 buckets) at once. Every stream ends with
// RESOURCE_EXHAUSTED (at a bound on buckets, or finding no room in --rlqs-report-budget-bytes),
// and rls's peak RSS stays within what docs/rlqs.md states for it. Before the budget, 64 such
// streams took rls from 29 MB to 1,562 MB.
func TestRLQSReportBudget(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules)
	streams, scale := envInt("RLQS_STREAMS", 512), 1.0
	if raceEnabled {
		// The race detector's shadow memory and its allocator's slack cost several times what
		// each report does: fewer streams, within a bound scaled alike.
		streams, scale = 128, 4
	}
	const size = 1 << 20
	report := largeReport(size)
	const conns = 8 // 64 calls each, within the 100 a connection may carry
	cs := make([]*grpc.ClientConn, conns)
	for i := range cs {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		cs[i] = conn
	}
	rss0, _ := p.Memory(t)
	p.ResetPeakMemory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		ends = map[string]int{}
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := rawStream(ctx, cs[i%conns])
			if err == nil {
				<-start
				_ = s.SendMsg(report) // a stream ended says EOF; RecvMsg has its status
				err = s.RecvMsg(new(rlqspb.RateLimitQuotaResponse))
			}
			st := status.Convert(err)
			end := st.Code().String()
			switch msg := st.Message(); {
			case strings.Contains(msg, "--rlqs-report-budget-bytes"), strings.Contains(msg, "--rlqs-max-total-buckets"):
				end += " " + msg[strings.Index(msg, "(--")+1:len(msg)-1]
			case strings.Contains(msg, "buckets on one stream"):
				end += " --rlqs-max-buckets"
			}
			if end == st.Code().String() {
				end += ": " + st.Message()
			}
			mu.Lock()
			ends[end]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	_, peak := p.Memory(t)
	t.Logf("%d streams of a %d-byte report: RSS %.1f MB before, peak %.1f MB (+%.1f MB); ends: %v",
		streams, len(report), float64(rss0)/1e6, float64(peak)/1e6, float64(peak-rss0)/1e6, ends)
	for end := range ends {
		if !strings.HasPrefix(end, codes.ResourceExhausted.String()+" --") {
			t.Errorf("%d streams ended %s, want RESOURCE_EXHAUSTED at a bound", ends[end], end)
		}
	}
	if n := ends[codes.ResourceExhausted.String()+" --rlqs-report-budget-bytes"]; n == 0 {
		t.Errorf("no report refused for --rlqs-report-budget-bytes")
	}
	if v := metric(t, p.HTTPAddr, "rls_rlqs_refused_total", `{reason="report_budget"}`); v < 1 {
		t.Errorf("rls_rlqs_refused_total{reason=\"report_budget\"} %v, want ≥ 1", v)
	}
	if bound := int64(scale * float64(rlqsReportBound(streams, size))); peak-rss0 > bound {
		t.Errorf("peak RSS %.1f MB above its %.1f MB before: more than the %.1f MB docs/rlqs.md states", float64(peak)/1e6, float64(rss0)/1e6, float64(bound)/1e6)
	}
}

// TestRLQSChurn: proxies that open streams and drop them at once, mid-decision, 64 at a time
// for a few seconds, against Redis: a stream whose proxy went away is not a store failure, so
// rls_rlqs_store_errors_total stays 0 and rls logs no warning for them. (Before, 64 workers for
// 30 s added 919,292 store errors and wrote 9,586 WARN lines.)
func TestRLQSChurn(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	prefix := fmt.Sprintf("rlqs-churn-%d:", time.Now().UnixNano())
	p := startRLS(t, nil, "--rlqs", "--config", writeRules(t, map[string]string{"rlqs.yaml": rlqsRules}),
		"--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix)
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := rlqspb.NewRateLimitQuotaServiceClient(conn)
	const workers, buckets = 64, 10
	churn := time.Duration(envInt("RLQS_CHURN_SECONDS", 3)) * time.Second
	var opened, answered atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(churn)
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				ctx, cancel := context.WithCancel(context.Background())
				s, err := c.StreamRateLimitQuotas(ctx)
				if err != nil {
					cancel()
					continue
				}
				opened.Add(1)
				m := &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs"}
				for b := range buckets {
					// Buckets of the 5/s rule, shared by the workers' streams.
					m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"api_key": fmt.Sprintf("k%d", (w+b)%200)}, 1, 0, time.Second))
				}
				_ = s.Send(m)
				if i%2 == 0 {
					// Half the streams are dropped once answered, half mid-decision.
					if _, err := s.Recv(); err == nil {
						answered.Add(1)
					}
				} else {
					time.Sleep(time.Duration(i%5) * time.Millisecond)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// The streams' ends are taken in (their shares released) within a second or two.
	for start := time.Now(); metric(t, p.HTTPAddr, "rls_rlqs_streams", "") > 0 && time.Since(start) < 10*time.Second; {
		time.Sleep(50 * time.Millisecond)
	}
	errs := metric(t, p.HTTPAddr, "rls_rlqs_store_errors_total", "")
	warns := 0
	for _, line := range strings.Split(p.Output(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, `"level":"WARN"`) {
			warns++
		}
	}
	t.Logf("%v of churn: %d streams opened (%d answered before they were dropped); rls_rlqs_store_errors_total %v; %d WARN lines",
		churn, opened.Load(), answered.Load(), errs, warns)
	if opened.Load() < workers {
		t.Fatalf("%d streams opened, want at least %d", opened.Load(), workers)
	}
	if errs != 0 {
		t.Errorf("rls_rlqs_store_errors_total %v after streams dropped by their proxies, want 0", errs)
	}
	if warns > 0 {
		t.Errorf("%d WARN lines for streams dropped by their proxies, want none: %s", warns, first(p.Output(), 2000))
	}
}

func first(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// rlqsReportBound is what docs/rlqs.md states reports cost rls at most above its size before,
// when streams streams each send a report of size bytes at once, on the default budget (2 MiB):
// 2 bytes per byte being read (gRPC reads a report whole, in frames, and its codec copies it
// into one buffer, before rls can count it) and 25 bytes per byte of the budget (decoded).
func rlqsReportBound(streams, size int) int64 {
	return 2*int64(streams)*int64(size) + 25*(2<<20)
}
