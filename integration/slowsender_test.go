package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// slowSender is one connection of a slow-sender flood: it opens calls that send their headers
// and the first bytes of a message declared larger than what follows, then hold, and records
// how each call ended (grpc-status from its trailers, or a reset).
type slowSender struct {
	conn net.Conn
	fr   *http2.Framer
	wmu  sync.Mutex

	mu    sync.Mutex
	ended map[uint32]string // stream → grpc-status, or "reset"
	last  time.Time         // when the last call ended
	done  chan struct{}     // the reader is over
}

func dialSlowSender(t *testing.T, addr string) *slowSender {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s := &slowSender{conn: conn, fr: http2.NewFramer(conn, conn), ended: map[uint32]string{}, done: make(chan struct{})}
	s.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := s.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go s.read()
	t.Cleanup(func() { conn.Close(); <-s.done })
	return s
}

// open starts n calls, each with HEADERS and one DATA frame of 100 bytes: a gRPC length prefix
// declaring 65,000 bytes and 95 of them.
func (s *slowSender) open(t *testing.T, n int) {
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "rls"},
		{":path", "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			t.Fatal(err)
		}
	}
	data := make([]byte, 100)
	binary.BigEndian.PutUint32(data[1:5], 65000)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for i := range n {
		id := uint32(2*i + 1)
		if err := s.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := s.fr.WriteData(id, false, data); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *slowSender) read() {
	defer close(s.done)
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				s.wmu.Lock()
				_ = s.fr.WriteSettingsAck()
				s.wmu.Unlock()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				s.wmu.Lock()
				_ = s.fr.WritePing(true, f.Data)
				s.wmu.Unlock()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				s.end(f.StreamID, f.PseudoValue("status")+"/"+grpcStatusOf(f))
			}
		case *http2.RSTStreamFrame:
			s.end(f.StreamID, "reset")
		}
	}
}

func grpcStatusOf(f *http2.MetaHeadersFrame) string {
	for _, hf := range f.Fields {
		if hf.Name == "grpc-status" {
			return hf.Value
		}
	}
	return "none"
}

// end records how a stream ended: the first of its trailers and its reset.
func (s *slowSender) end(id uint32, how string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ended[id]; !ok {
		s.ended[id] = how
		s.last = time.Now()
	}
}

// outcomes counts the calls ended by how they ended.
func (s *slowSender) outcomes(into map[string]int) (ended int, last time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, how := range s.ended {
		into[how]++
	}
	return len(s.ended), s.last
}

// The figure: 20 connections × 100 ShouldRateLimit calls, each sending its headers and
// 100 bytes of a message declared as 65,000 bytes, then holding, against --grpc-max-calls 1024
// (as the manifests set). Before, every place was held for as long as the sender held and an
// ordinary caller got no answer but UNAVAILABLE. Now a held call past its first second gives
// its place to a new call, and every held call is cancelled --grpc-message-timeout after its
// headers and counted; goroutines and memory stay within the bound meanwhile.
func TestSlowSendersLeaveCallersAnswered(t *testing.T) {
	const (
		conns, perConn = 20, 100
		messageTimeout = 3 * time.Second
	)
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}),
		"--grpc-max-calls", "1024", "--grpc-message-timeout", messageTimeout.String())
	c := p.client(t)
	ask := func(ip string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("ip", ip)}})
		return err
	}
	if err := ask("warm"); err != nil {
		t.Fatal(err)
	}
	before := metricValues(t, p.HTTPAddr)
	baseGoroutines, _ := strconv.Atoi(before["go_goroutines"])
	rssBefore, _ := p.Memory(t)

	start := time.Now()
	var senders []*slowSender
	for range conns {
		s := dialSlowSender(t, p.GRPCAddr)
		s.open(t, perConn)
		senders = append(senders, s)
	}

	// An ordinary caller, four at a time, each call with a deadline of 1 s, while the flood
	// holds and until every held call should have been cancelled.
	type answer struct {
		at   time.Duration
		code codes.Code
	}
	var (
		amu     sync.Mutex
		answers []answer
		n       atomic.Int64
	)
	var wg sync.WaitGroup
	stopAt := start.Add(messageTimeout + 1500*time.Millisecond)
	for w := range 4 {
		wg.Go(func() {
			for time.Now().Before(stopAt) {
				err := ask("legit-" + strconv.Itoa(w) + "-" + strconv.FormatInt(n.Add(1), 10))
				amu.Lock()
				answers = append(answers, answer{time.Since(start), status.Code(err)})
				amu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	// Goroutines and open calls while the flood holds.
	var peakGoroutines, peakOpen int
	for time.Now().Before(start.Add(messageTimeout - 500*time.Millisecond)) {
		m := metricValues(t, p.HTTPAddr)
		g, _ := strconv.Atoi(m["go_goroutines"])
		o, _ := strconv.Atoi(m["rls_grpc_calls_open"])
		peakGoroutines, peakOpen = max(peakGoroutines, g), max(peakOpen, o)
		time.Sleep(100 * time.Millisecond)
	}
	_, peakRSS := p.Memory(t)
	wg.Wait()

	// Every call of the flood ends: refused at the bound, or cancelled.
	var (
		ended int
		last  time.Time
		how   = map[string]int{}
	)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ended, last = 0, time.Time{}
		clear(how)
		for _, s := range senders {
			e, l := s.outcomes(how)
			ended += e
			if l.After(last) {
				last = l
			}
		}
		if ended == conns*perConn || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	after := metricValues(t, p.HTTPAddr)

	ok, early, earlyOK := 0, 0, 0
	codesSeen := map[codes.Code]int{}
	for _, a := range answers {
		codesSeen[a.code]++
		if a.code == codes.OK {
			ok++
		}
		// While every held call is still held, past the first second a held call is evictable.
		if a.at > 1500*time.Millisecond && a.at < messageTimeout-200*time.Millisecond {
			early++
			if a.code == codes.OK {
				earlyOK++
			}
		}
	}
	goroutinesAfter, _ := strconv.Atoi(after["go_goroutines"])
	t.Logf("ordinary calls: %d OK of %d (%v); while the flood held (1.5-%.1f s): %d OK of %d",
		ok, len(answers), codesSeen, (messageTimeout - 200*time.Millisecond).Seconds(), earlyOK, early)
	t.Logf("flood: %d of %d calls ended %v, the last %.2f s after the first opened; peak open calls %d",
		ended, conns*perConn, how, last.Sub(start).Seconds(), peakOpen)
	t.Logf("goroutines: %d before, peak %d, %d after; RSS %.1f MB before, peak %.1f MB",
		baseGoroutines, peakGoroutines, goroutinesAfter, float64(rssBefore)/1e6, float64(peakRSS)/1e6)
	t.Logf("metrics: refused %s, slow calls cancelled: message_timeout %s, evicted %s; open after %s",
		after["rls_grpc_calls_refused_total"], after[`rls_grpc_slow_calls_total{reason="message_timeout"}`],
		after[`rls_grpc_slow_calls_total{reason="evicted"}`], after["rls_grpc_calls_open"])

	if early == 0 || earlyOK < early*9/10 {
		t.Errorf("while the slow senders held: %d OK of %d ordinary calls, want at least 90%%", earlyOK, early)
	}
	if ended != conns*perConn {
		t.Errorf("%d of %d slow calls ended, want all (cancelled or refused)", ended, conns*perConn)
	}
	if last.Sub(start) > messageTimeout+3*time.Second {
		t.Errorf("the last slow call ended %.2f s after the flood began, want about --grpc-message-timeout (%v)", last.Sub(start).Seconds(), messageTimeout)
	}
	refused, _ := strconv.Atoi(after["rls_grpc_calls_refused_total"])
	timedOut, _ := strconv.Atoi(after[`rls_grpc_slow_calls_total{reason="message_timeout"}`])
	evicted, _ := strconv.Atoi(after[`rls_grpc_slow_calls_total{reason="evicted"}`])
	if timedOut == 0 || timedOut+evicted+refused < conns*perConn {
		t.Errorf("slow calls counted: %d timed out, %d evicted, %d refused; want the %d held and refused",
			timedOut, evicted, refused, conns*perConn)
	}
	if after["rls_grpc_calls_open"] != "0" {
		t.Errorf("rls_grpc_calls_open %s once the flood was cancelled, want 0", after["rls_grpc_calls_open"])
	}
	// A goroutine per open call at most, and the bound holds them to 1024.
	if peakOpen > 1024 || peakGoroutines > baseGoroutines+1024+200 {
		t.Errorf("peak open calls %d, goroutines %d (from %d): want at most 1024 calls and a goroutine each", peakOpen, peakGoroutines, baseGoroutines)
	}
	if goroutinesAfter > baseGoroutines+100 {
		t.Errorf("goroutines %d after the flood was cancelled, from %d before", goroutinesAfter, baseGoroutines)
	}
	// About 24 MB measured without the race detector (1,024 goroutines and what they read);
	// the race detector shadows every goroutine and allocation several times over (about
	// 120 MB).
	var rssBound int64 = 64 << 20
	if raceEnabled {
		rssBound = 256 << 20
	}
	if grew := peakRSS - rssBefore; grew > rssBound {
		t.Errorf("peak RSS grew by %.1f MB during the flood, want at most %d MiB", float64(grew)/1e6, rssBound>>20)
	}
}

// A connection that sends nothing is closed --grpc-handshake-timeout after it was accepted and
// counted; gRPC's own default waits 120 s.
func TestSlowHandshakeClosed(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}), "--grpc-handshake-timeout", "300ms")
	conn, err := net.DialTimeout("tcp", p.GRPCAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// The server's SETTINGS, then the end of the connection.
	buf := make([]byte, 4096)
	for {
		if _, err := conn.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the connection was still open after 20 s")
			}
			break
		}
	}
	waitFor(t, 10*time.Second, func() bool { return metricValues(t, p.HTTPAddr)["rls_grpc_handshake_timeouts_total"] == "1" },
		func() string {
			return "rls_grpc_handshake_timeouts_total " + metricValues(t, p.HTTPAddr)["rls_grpc_handshake_timeouts_total"] + ", want 1"
		})
	// An ordinary client is not held to it once connected.
	if _, err := p.client(t).ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("ip", "1")}}); err != nil {
		t.Fatal(err)
	}
}

// One source address holds at most --grpc-max-connections-per-source connections: one more is
// closed as it is accepted and counted, and a place given back is taken again.
func TestConnectionsPerSource(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}), "--grpc-max-connections-per-source", "2")
	held := []*h2Conn{dialH2(t, p.GRPCAddr), dialH2(t, p.GRPCAddr)}
	waitFor(t, 10*time.Second, func() bool { return metricValues(t, p.HTTPAddr)["rls_grpc_connections"] == "2" },
		func() string {
			return "rls_grpc_connections " + metricValues(t, p.HTTPAddr)["rls_grpc_connections"] + ", want 2"
		})
	conn, err := net.DialTimeout("tcp", p.GRPCAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 64)); err == nil {
		t.Fatalf("a third connection from one address read %d bytes, want it closed", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a third connection from one address was left open")
	}
	if got := metricValues(t, p.HTTPAddr)["rls_grpc_connections_refused_total"]; got != "1" {
		t.Fatalf("rls_grpc_connections_refused_total %s, want 1", got)
	}
	held[0].closed.Store(true)
	held[0].conn.Close()
	waitFor(t, 10*time.Second, func() bool { return metricValues(t, p.HTTPAddr)["rls_grpc_connections"] == "1" },
		func() string {
			return "rls_grpc_connections " + metricValues(t, p.HTTPAddr)["rls_grpc_connections"] + ", want 1"
		})
	if _, err := p.client(t).ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("ip", "1")}}); err != nil {
		t.Fatalf("with a place given back: %v", err)
	}
}
