package server

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/logthrottle"
)

// Defaults: Envoy opens a connection or two per worker thread to each rls replica, so a mesh of
// hundreds of proxies stays under the cap. An idle connection holds about 23 kB (measured: 1,000
// idle connections after a call each took rls from 28.8 to 51.6 MB of RSS), so the cap bounds
// what idle connections hold to about 47 MB. Envoy reconnects by itself after an idle GOAWAY,
// on its next call.
//
// One address may hold half the connections: a fleet of Envoys behind one NAT address (a
// connection per worker thread: 256 proxies of 4 workers) still connects, and one source alone
// cannot take every connection. An IPv6 source is its /64, which one host usually holds whole.
//
// A connection must finish its handshake (TLS, then HTTP/2's preface and SETTINGS) within
// 5 s: a client completes it in a round trip or two; gRPC's own default is 120 s.
//
// A connection carries at most 1024 calls at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS),
// as many as --grpc-max-calls allows in all: Envoy's pool opens another connection past it,
// but a gRPC-Go client queues its calls on the one it has, so a lower bound made a Go caller's
// calls on healthy keys wait behind those on a failed Redis master until their deadline.
const (
	defaultGRPCMaxConnections       = 2048
	defaultGRPCMaxConnsPerSource    = defaultGRPCMaxConnections / 2
	defaultGRPCMaxConnectionIdle    = 5 * time.Minute
	defaultGRPCHandshakeTimeout     = 5 * time.Second
	defaultGRPCMaxConcurrentStreams = 1024
)

// connLimits are the bounds limitConns applies.
type connLimits struct {
	max       int // connections at once; 0: no bound
	perSource int // connections at once from one source address; 0: no bound
}

// limitConns returns l bounded to --grpc-max-connections connections at once: Accept waits while
// that many are open, so the next connection stays in the kernel's listen queue, unserved,
// until one closes. A connection from a source that has --grpc-max-connections-per-source open
// already is closed as it is accepted. The connections open are the gauge rls_grpc_connections
// on reg, those closed at the per-source cap rls_grpc_connections_refused_total, those that did
// not finish their handshake within --grpc-handshake-timeout (gRPC's deadline on it, seen as a
// read past it before the handshake cleared it) rls_grpc_handshake_timeouts_total; each is a
// throttled warning on warn.
func limitConns(l net.Listener, lim connLimits, reg prometheus.Registerer, warn *logthrottle.Throttle) net.Listener {
	cl := &capListener{
		Listener: l,
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rls_grpc_connections", Help: "gRPC connections open (at most --grpc-max-connections).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_grpc_connections_refused_total",
			Help: "gRPC connections closed as they were accepted: their source address had --grpc-max-connections-per-source open.",
		}),
		handshakeTimeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_grpc_handshake_timeouts_total",
			Help: "gRPC connections closed for not finishing their handshake (TLS, HTTP/2 preface and SETTINGS) within --grpc-handshake-timeout.",
		}),
		perSource: lim.perSource, sources: map[string]int{}, warn: warn,
	}
	reg.MustRegister(cl.open, cl.refused, cl.handshakeTimeouts)
	if lim.max > 0 {
		cl.sem, cl.done = make(chan struct{}, lim.max), make(chan struct{})
		cl.full = func() {
			warn.Warn("grpc connection cap", "gRPC connection cap reached: further connections wait unserved until one closes",
				"max_connections", lim.max)
		}
	}
	return cl
}

// capListener counts the connections it accepted that are still open and, with sem, accepts
// at most cap(sem) at once, and at most perSource from one source.
type capListener struct {
	net.Listener
	open              prometheus.Gauge
	refused           prometheus.Counter
	handshakeTimeouts prometheus.Counter
	sem               chan struct{} // nil: no bound
	done              chan struct{} // closed by Close
	closeOnce         sync.Once
	full              func()
	warn              *logthrottle.Throttle

	perSource int // 0: no bound
	mu        sync.Mutex
	sources   map[string]int // connections open by source, with perSource
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		if l.sem != nil {
			select {
			case l.sem <- struct{}{}:
			default:
				l.full()
				select {
				case l.sem <- struct{}{}:
				case <-l.done:
					// Closed: the listener's own error, as an unbounded listener returns it.
					c, err := l.Listener.Accept()
					if err == nil {
						c.Close()
						err = net.ErrClosed
					}
					return nil, err
				}
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.release()
			return nil, err
		}
		src, ok := l.takeSource(c)
		if !ok {
			c.Close()
			l.release()
			continue
		}
		l.open.Inc()
		return &capConn{Conn: c, l: l, release: sync.OnceFunc(func() {
			l.open.Dec()
			l.giveSource(src)
			l.release()
		})}, nil
	}
}

// takeSource counts c against its source's connections; false, counted and logged, when the
// source has perSource open already.
func (l *capListener) takeSource(c net.Conn) (string, bool) {
	if l.perSource == 0 {
		return "", true
	}
	src := sourceOf(c.RemoteAddr())
	l.mu.Lock()
	n := l.sources[src]
	if n >= l.perSource {
		l.mu.Unlock()
		l.refused.Inc()
		l.warn.Warn("grpc connection cap per source", "gRPC connections from one source address at their cap: further ones are closed as they are accepted",
			"max_connections_per_source", l.perSource)
		return "", false
	}
	l.sources[src] = n + 1
	l.mu.Unlock()
	return src, true
}

func (l *capListener) giveSource(src string) {
	if l.perSource == 0 {
		return
	}
	l.mu.Lock()
	if l.sources[src] <= 1 {
		delete(l.sources, src)
	} else {
		l.sources[src]--
	}
	l.mu.Unlock()
}

// sourceOf is the source a connection counts against: its IPv4 address, or its IPv6 /64.
func sourceOf(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if v4 := ta.IP.To4(); v4 != nil {
		return v4.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

func (l *capListener) release() {
	if l.sem != nil {
		<-l.sem
	}
}

func (l *capListener) Close() error {
	err := l.Listener.Close()
	if l.done != nil {
		l.closeOnce.Do(func() { close(l.done) })
	}
	return err
}

// capConn gives its slot back when closed, once, and notices a handshake that timed out: gRPC
// sets a deadline on the connection for the handshake (--grpc-handshake-timeout) and clears
// it once done, so a read past a deadline before it was cleared is a handshake too slow.
type capConn struct {
	net.Conn
	l          *capListener
	release    func()
	handshaken atomic.Bool
	timedOut   atomic.Bool
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

func (c *capConn) SetDeadline(t time.Time) error {
	if t.IsZero() {
		c.handshaken.Store(true)
	}
	return c.Conn.SetDeadline(t)
}

func (c *capConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil && !c.handshaken.Load() && errors.Is(err, os.ErrDeadlineExceeded) && c.timedOut.CompareAndSwap(false, true) {
		c.l.handshakeTimeouts.Inc()
		c.l.warn.Warn("grpc handshake timeout", "gRPC connections closed: no HTTP/2 handshake within --grpc-handshake-timeout")
	}
	return n, err
}
