package integration

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// h2Conn is a bare HTTP/2 client connection (h2c), so the test controls every frame: gRPC's own
// client paces its pings by the server's policy and would hide a policy that rejects Envoy's.
type h2Conn struct {
	t      *testing.T
	conn   net.Conn
	fr     *http2.Framer
	wmu    sync.Mutex  // the Framer is not safe for concurrent writes; the reader writes acks
	gone   atomic.Bool // a GOAWAY arrived: the server may close the connection at any moment
	closed atomic.Bool // the test is over and closed the connection

	acks      chan uint64 // payloads of PING acks
	goaway    chan goaway
	trailers  chan map[string]string // header fields of a stream's last HEADERS frame
	readerEnd chan struct{}
}

type goaway struct {
	code  http2.ErrCode
	debug string
}

func dialH2(t *testing.T, addr string) *h2Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := &h2Conn{
		t: t, conn: conn, fr: http2.NewFramer(conn, conn),
		acks: make(chan uint64, 256), goaway: make(chan goaway, 1),
		trailers: make(chan map[string]string, 1), readerEnd: make(chan struct{}),
	}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	// The connection preface (the magic string, then our SETTINGS) goes out before the reader
	// starts: the server sends its SETTINGS as soon as it accepts, and a reader already running
	// could ack them ahead of the preface, which the server answers by closing the connection
	// without a GOAWAY.
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go c.read()
	t.Cleanup(func() {
		c.closed.Store(true)
		conn.Close()
		<-c.readerEnd
	})
	return c
}

func (c *h2Conn) write(f func() error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := f(); err != nil && !c.gone.Load() && !c.closed.Load() {
		c.t.Errorf("writing a frame: %v", err)
	}
}

// read answers the server as any HTTP/2 client must (SETTINGS and PING acks) and reports what
// the test looks for, until the connection closes.
func (c *h2Conn) read() {
	defer close(c.readerEnd)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if f.IsAck() {
				select { // never blocks the reader: the test sends far fewer pings
				case c.acks <- binary.BigEndian.Uint64(f.Data[:]):
				default:
				}
			} else {
				c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.GoAwayFrame:
			c.gone.Store(true)
			// DebugData is only valid until the next read.
			select {
			case c.goaway <- goaway{f.ErrCode, string(f.DebugData())}:
			default:
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				fields := map[string]string{}
				for _, hf := range f.Fields {
					fields[hf.Name] = hf.Value
				}
				select {
				case c.trailers <- fields:
				default:
				}
			}
		}
	}
}

// pingsLike pings n times the way Envoy's connection_keepalive does: a PING, its ACK awaited
// (Envoy's keepalive timeout), then interval before the next. It stops at a GOAWAY and returns
// it, or nil. Waiting for each ACK also means the server never closes a connection with a ping
// still unread, which would turn its close into a reset and could discard the GOAWAY before the
// test reads it.
func (c *h2Conn) pingsLike(n int, interval time.Duration, first uint64) *goaway {
	c.t.Helper()
	for i := range uint64(n) {
		var data [8]byte
		binary.BigEndian.PutUint64(data[:], first+i)
		c.write(func() error { return c.fr.WritePing(false, data) })
		timeout := time.After(5 * time.Second)
	wait:
		for {
			select {
			case id := <-c.acks:
				if id == first+i {
					break wait
				}
			case g := <-c.goaway:
				return &g
			case <-timeout:
				c.t.Fatalf("ping %d: no ACK within 5s (Envoy would close the connection)", first+i)
			}
		}
		// Sleeping after the ACK makes every gap at least interval, whatever the scheduler does.
		time.Sleep(interval)
	}
	return nil
}

// openCall starts a ShouldRateLimit call on stream 1 and sends nothing more, so the stream stays
// open until finishCall.
func (c *h2Conn) openCall() {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "rls"},
		{":path", "/" + rlsv3.RateLimitService_ServiceDesc.ServiceName + "/ShouldRateLimit"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			c.t.Fatal(err)
		}
	}
	c.write(func() error {
		return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: buf.Bytes(), EndHeaders: true})
	})
}

// finishCall sends the request message and returns the call's grpc-status.
func (c *h2Conn) finishCall(req *rlsv3.RateLimitRequest) string {
	msg, err := proto.Marshal(req)
	if err != nil {
		c.t.Fatal(err)
	}
	body := append([]byte{0, 0, 0, 0, 0}, msg...)
	binary.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	c.write(func() error { return c.fr.WriteData(1, true, body) })
	select {
	case tr := <-c.trailers:
		return tr["grpc-status"]
	case <-time.After(10 * time.Second):
		c.t.Fatal("no trailers for the call")
		return ""
	}
}

func TestKeepalivePingsLikeEnvoy(t *testing.T) {
	t.Parallel()
	rules := writeRules(t, map[string]string{"keepalive.yaml": `
domain: keepalive
descriptors:
  - key: generic_key
    rate_limit: {unit: second, requests_per_unit: 100}
`})
	// Envoy pings every 30s against rls's 10s default minimum; scaled down, the same margin is
	// pings every 250ms against a 100ms minimum. The last case shows that the test sees the
	// GOAWAY a stricter policy sends.
	const interval = 250 * time.Millisecond
	tests := []struct {
		name       string
		minTime    string
		wantGoaway bool
	}{
		{"pings within the policy, idle and during a call", "100ms", false},
		{"pings faster than the policy allows", "5s", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := startRLS(t, nil, "--config", rules, "--grpc-keepalive-min-time", tt.minTime)
			c := dialH2(t, p.GRPCAddr)

			// No stream open for 3s: Envoy keeps its connection to rls between requests.
			ga := c.pingsLike(int(3*time.Second/interval), interval, 0)
			if tt.wantGoaway {
				if ga == nil {
					t.Fatalf("no GOAWAY after pings %v apart against a %s minimum", interval, tt.minTime)
				}
				if ga.code != http2.ErrCodeEnhanceYourCalm || ga.debug != "too_many_pings" {
					t.Errorf("GOAWAY %v %q, want ENHANCE_YOUR_CALM too_many_pings", ga.code, ga.debug)
				}
				return
			}
			if ga != nil {
				t.Fatalf("GOAWAY %v %q while idle", ga.code, ga.debug)
			}
			// Then with a call in flight.
			c.openCall()
			if ga := c.pingsLike(6, interval, 100); ga != nil {
				t.Fatalf("GOAWAY %v %q during a call", ga.code, ga.debug)
			}
			status := c.finishCall(&rlsv3.RateLimitRequest{
				Domain:      "keepalive",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "x"}}}},
			})
			if status != "0" {
				t.Errorf("call during the pings: grpc-status %q", status)
			}
			select {
			case ga := <-c.goaway:
				t.Errorf("GOAWAY %v %q after the call", ga.code, ga.debug)
			default:
			}
		})
	}
}
