package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/rlstest"
)

func TestFailurePolicy(t *testing.T) {
	lim := limit.Limit{Rate: 2, Period: time.Minute, Burst: 2}
	allowed := backend.Decision{Allowed: true}
	denied := backend.Decision{RetryAfter: 30 * time.Second, ResetAfter: time.Minute}
	tests := []struct {
		name        string
		fail        []FailureMode
		mode        []backend.Mode
		stands      bool
		local       bool
		via         []FailureMode
		dec         []backend.Decision
		costOfLocal int64 // the cost left on local items
	}{
		{"allow", []FailureMode{FailAllow, FailAllow}, nil, true, false, []FailureMode{FailAllow, FailAllow}, []backend.Decision{allowed, allowed}, 1},
		{"deny", []FailureMode{FailDeny}, nil, true, false, []FailureMode{FailDeny}, []backend.Decision{denied}, 1},
		{"error first", []FailureMode{FailError, FailAllow, FailDeny}, nil, false, false, []FailureMode{FailError, FailError, FailError}, make([]backend.Decision, 3), 1},
		{"error last marks every item", []FailureMode{FailAllow, FailDeny, FailLocal, FailError}, nil, false, false, []FailureMode{FailError, FailError, FailError, FailError}, make([]backend.Decision, 4), 1},
		{"local", []FailureMode{FailLocal, FailAllow}, nil, true, true, []FailureMode{FailLocal, FailAllow}, []backend.Decision{{}, allowed}, 1},
		{"local beside an enforced deny only checks", []FailureMode{FailLocal, FailDeny}, nil, true, true, []FailureMode{FailLocal, FailDeny}, []backend.Decision{{}, denied}, 0},
		{"local beside a shadow deny charges", []FailureMode{FailLocal, FailDeny}, []backend.Mode{backend.Enforce, backend.Shadow}, true, true, []FailureMode{FailLocal, FailDeny}, []backend.Decision{{}, denied}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			items := make([]item, len(tc.fail))
			for k, f := range tc.fail {
				items[k] = item{desc: k, fail: f, req: backend.Request{Limit: lim, Cost: 1}, dec: backend.Decision{Allowed: true, Remaining: 99}}
				if tc.mode != nil {
					items[k].req.Mode = tc.mode[k]
				}
			}
			stands, local := failurePolicy(items)
			if stands != tc.stands || local != tc.local {
				t.Fatalf("stands, local = %v, %v; want %v, %v", stands, local, tc.stands, tc.local)
			}
			for k := range items {
				if items[k].via != tc.via[k] || items[k].dec != tc.dec[k] {
					t.Errorf("item %d: via %v, %+v; want %v, %+v", k, items[k].via, items[k].dec, tc.via[k], tc.dec[k])
				}
				if items[k].via == FailLocal && items[k].req.Cost != tc.costOfLocal {
					t.Errorf("item %d: local cost %d, want %d", k, items[k].req.Cost, tc.costOfLocal)
				}
			}
		})
	}
}

// erring is a backend that fails every call with err.
type erring struct{ err error }

func (e erring) Decide(context.Context, []backend.Request, []backend.Decision) (bool, error) {
	return false, e.err
}
func (erring) Close() error { return nil }

// logBuffer is a logger writing text into a buffer, at every level.
func logBuffer() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})), &b
}

func TestBackendErrorKinds(t *testing.T) {
	timeout := &net.OpError{Op: "read", Net: "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50012},
		Addr:   &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 16379}, Err: os.ErrDeadlineExceeded}
	tests := []struct {
		name     string
		err      error
		mode     FailureMode
		want     string // codes of the answer, or the gRPC code and message
		kind     string // the rls_backend_errors_total kind counted, or ""
		overload float64
		logged   string // logged at Error
	}{
		{"timeout, addresses kept from the client", fmt.Errorf("%w: redis: %w", backend.ErrUnavailable, timeout), FailError,
			"Unavailable: rate limit backend unavailable: timeout", "unavailable", 0, ""},
		{"unavailable, failure mode allow", fmt.Errorf("%w: redis: NOAUTH Authentication required.", backend.ErrUnavailable), FailAllow,
			"OK OK OK", "unavailable", 0, ""},
		{"deadline", fmt.Errorf("%w: %w", backend.ErrUnavailable, context.DeadlineExceeded), FailError,
			"Unavailable: rate limit backend unavailable: timeout", "timeout", 0, ""},
		{"the caller left: not the backend failing", fmt.Errorf("%w: %w", backend.ErrUnavailable, context.Canceled), FailError,
			"Unavailable: rate limit backend unavailable: canceled", "canceled", 0, ""},
		{"overload is answered by the failure mode, counted apart", fmt.Errorf("%w: shed", backend.ErrOverloaded), FailDeny,
			"OVER_LIMIT OVER_LIMIT OVER_LIMIT", "", 1, ""},
		{"overload, mode error", backend.ErrOverloaded, FailError,
			"Unavailable: rate limit backend unavailable: overloaded", "", 1, ""},
		{"another error is INTERNAL whatever the failure mode", errors.New("redis backend: 1 decisions for 2 requests at 10.1.2.3:6379"), FailAllow,
			"Internal: rate limit backend error", "other", 0, "10.1.2.3:6379"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, buf := logBuffer()
			f := newFixture(t, Options{Backend: erring{tc.err}, FailureMode: tc.mode, Logger: log})
			resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "k"), desc("ip", "1")}})
			got := ""
			if err != nil {
				got = status.Code(err).String() + ": " + status.Convert(err).Message()
			} else {
				got = codesOf(resp)
			}
			if got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if strings.Contains(got, "127.0.0.1") || strings.Contains(got, "NOAUTH") || strings.Contains(got, "10.1.2.3") {
				t.Fatalf("the client sees internals: %q", got)
			}
			for _, k := range []string{"timeout", "unavailable", "canceled", "other"} {
				want := 0.0
				if k == tc.kind {
					want = 1
				}
				if n := rlstest.CounterValue(t, f.svc.metrics.errors.WithLabelValues(k)); n != want {
					t.Errorf("rls_backend_errors_total{kind=%q} = %v, want %v", k, n, want)
				}
			}
			if n := rlstest.CounterValue(t, f.svc.metrics.overload); n != tc.overload {
				t.Errorf("rls_overload_shed_total = %v, want %v", n, tc.overload)
			}
			errorLines := 0
			for _, line := range strings.Split(buf.String(), "\n") {
				if strings.Contains(line, "level=ERROR") {
					errorLines++
					if !strings.Contains(line, tc.logged) {
						t.Errorf("logged %q, want the error %q", line, tc.logged)
					}
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.logged != ""]; errorLines != want {
				t.Errorf("%d lines at Error, want %d:\n%s", errorLines, want, buf)
			}
			if !strings.Contains(buf.String(), "level=DEBUG msg=\"backend failed\"") {
				t.Errorf("the full error is not logged at Debug:\n%s", buf)
			}
		})
	}
}

// TestErrorLogRateLimited: backend errors other than unavailability are logged at Error
// through a logthrottle, the first at once and the others summed up at the interval's end.
func TestErrorLogRateLimited(t *testing.T) {
	log, buf := logBuffer()
	f := newFixture(t, Options{Backend: erring{errors.New("boom")}, Logger: log})
	f.svc.errLog = logthrottle.New(log, time.Hour) // only Flush ends the interval
	for range 3 {
		if _, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "k")}}); status.Code(err) != codes.Internal {
			t.Fatalf("err %v, want Internal", err)
		}
	}
	if n := strings.Count(buf.String(), `level=ERROR msg="backend error" err=boom`); n != 1 {
		t.Fatalf("3 errors within the interval logged %d times at Error, want 1:\n%s", n, buf)
	}
	buf.Reset()
	f.svc.errLog.Flush()
	if got := buf.String(); !strings.Contains(got, `level=ERROR msg="backend error" err=boom suppressed=2`) {
		t.Fatalf("the interval's end logged %q, want the 2 others summed up", got)
	}
}
