package server

import (
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/logthrottle"
)

// Defaults: Envoy opens a connection or two per worker thread to each rls replica, so a mesh of
// hundreds of proxies stays under the cap. An idle connection holds about 23 kB (measured: 1,000
// idle connections after a call each took rls from 28.8 to 51.6 MB of RSS), so the cap bounds
// what idle connections hold to about 47 MB. Envoy reconnects by itself after an idle GOAWAY,
// on its next call.
const (
	defaultGRPCMaxConnections    = 2048
	defaultGRPCMaxConnectionIdle = 5 * time.Minute
)

// limitConns returns l bounded to --grpc-max-connections connections at once: Accept waits while
// that many are open, so the next connection stays in the kernel's listen queue, unserved,
// until one closes. The connections open are the gauge rls_grpc_connections on reg; reaching
// the cap is a warning on warn.
func limitConns(l net.Listener, maxConns int, reg prometheus.Registerer, warn *logthrottle.Throttle) net.Listener {
	open := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rls_grpc_connections", Help: "gRPC connections open (at most --grpc-max-connections).",
	})
	reg.MustRegister(open)
	if maxConns == 0 {
		return &capListener{Listener: l, open: open}
	}
	return &capListener{
		Listener: l, open: open, sem: make(chan struct{}, maxConns), done: make(chan struct{}),
		full: func() {
			warn.Warn("grpc connection cap", "gRPC connection cap reached: further connections wait unserved until one closes",
				"max_connections", maxConns)
		},
	}
}

// capListener counts the connections it accepted that are still open and, with sem, accepts
// at most cap(sem) at once.
type capListener struct {
	net.Listener
	open      prometheus.Gauge
	sem       chan struct{} // nil: no bound
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	full      func()
}

func (l *capListener) Accept() (net.Conn, error) {
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
	l.open.Inc()
	return &capConn{Conn: c, release: sync.OnceFunc(func() { l.open.Dec(); l.release() })}, nil
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

// capConn gives its slot back when closed, once.
type capConn struct {
	net.Conn
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
