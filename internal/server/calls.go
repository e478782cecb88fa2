package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/rls-project/rls/internal/logthrottle"
)

// defaultGRPCMaxCalls is the default of --grpc-max-calls: 1024 calls whose messages are
// arriving hold at most 1024 × --max-request-bytes (64 MiB by default). Counting them is a tap
// and a lock as each call opens, where it was once a stats handler's work on every event of
// every call.
const defaultGRPCMaxCalls = 1024

// defaultGRPCMessageTimeout is the default of --grpc-message-timeout: Envoy sends a request's
// few hundred bytes with its headers, so a second is already generous; five leave room for a
// congested link.
const defaultGRPCMessageTimeout = 5 * time.Second

// evictAfter is how long a call must have been waiting for its message before a new call may
// take its place at --grpc-max-calls. An ordinary caller's message follows its headers within
// a round trip; a call still without its message after a second is a slow sender's.
const evictAfter = time.Second

// callGate watches every unary call from its headers until it ends. gRPC reads a call's message
// whole before any handler or interceptor runs, and nothing in gRPC bounds how long that may
// take, so a client that sends headers and part of a message holds the call, its goroutine and
// what it sent for as long as it likes. The gate:
//
//   - cancels a call whose whole message has not arrived --grpc-message-timeout after its
//     headers (rls_grpc_slow_calls_total{reason="message_timeout"});
//   - with --grpc-max-calls, counts a ShouldRateLimit call open from its headers (the tap, on the
//     connection's reader, before gRPC starts the call) to its end, or to its cancellation at
//     the message deadline, so the bound is never passed. At the bound a new call takes the
//     place of the oldest call still waiting for its message after evictAfter, which is
//     cancelled (reason="evicted"); with none, the new call is refused UNAVAILABLE
//     (rls_grpc_calls_refused_total), which Envoy answers with its failure_mode_deny. Slow
//     senders therefore cannot hold every place while ordinary callers, whose messages arrive
//     with their headers, are refused.
//
// A call counts as arrived when the first unary interceptor runs, once gRPC has read and
// decoded its message.
type callGate struct {
	timeout time.Duration // 0: no deadline for messages
	max     int64         // 0: no bound on calls
	warn    *logthrottle.Throttle

	// unary are the full names of the unary methods served: the gate watches their calls only
	// (a stream's messages come when its client has something to say). Set once every service
	// is registered, before serving.
	unary map[string]bool

	mu       sync.Mutex
	open     int64 // calls holding a place, at most max
	arriving calls // listed calls (see call.listed) still waiting for their message, oldest first
	// sweep runs at the deadline of the oldest call on arriving (armed), or a little
	// earlier: one timer for the gate rather than one a call.
	sweep *time.Timer
	armed bool

	refused prometheus.Counter
	slow    *prometheus.CounterVec
}

// newCallGate returns the gate and registers its metrics on reg.
func newCallGate(timeout time.Duration, max int64, reg prometheus.Registerer, warn *logthrottle.Throttle) (*callGate, error) {
	g := &callGate{
		timeout: timeout, max: max, warn: warn,
		slow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_grpc_slow_calls_total",
			Help: "gRPC calls cancelled while their request message was arriving: message_timeout, not whole --grpc-message-timeout after their headers; evicted, at --grpc-max-calls, waiting over a second, to make room for a new call.",
		}, []string{"reason"}),
	}
	g.slow.WithLabelValues(reasonTimeout)
	g.slow.WithLabelValues(reasonEvicted)
	g.sweep = time.AfterFunc(time.Hour, g.expire)
	g.sweep.Stop()
	cs := []prometheus.Collector{g.slow}
	if max > 0 {
		g.refused = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_grpc_calls_refused_total",
			Help: "ShouldRateLimit calls refused as they opened because --grpc-max-calls were open already, none of them waiting for its message over a second.",
		})
		open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_grpc_calls_open", Help: "ShouldRateLimit calls open, from their headers (at most --grpc-max-calls).",
		}, func() float64 { g.mu.Lock(); defer g.mu.Unlock(); return float64(g.open) })
		cs = append(cs, g.refused, open)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return g, nil
}

const (
	reasonTimeout = "message_timeout"
	reasonEvicted = "evicted"
)

// options are the gate's server options: the tap that sees each call at its headers.
func (g *callGate) options() []grpc.ServerOption {
	if g.timeout == 0 && g.max == 0 {
		return nil
	}
	return []grpc.ServerOption{grpc.InTapHandle(g.tap)}
}

// serve records which methods of s are unary; call it once every service is registered.
func (g *callGate) serve(s *grpc.Server) {
	unary := map[string]bool{}
	for name, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			if !m.IsClientStream && !m.IsServerStream {
				unary["/"+name+"/"+m.Name] = true
			}
		}
	}
	g.unary = unary
}

// errTooManyCalls is the answer to a call past the bound.
var errTooManyCalls = status.Error(codes.Unavailable, "rls overloaded: too many calls open (--grpc-max-calls)")

// The causes a slow call's context is cancelled with.
var (
	errSlowMessage = errors.New("request message not received within --grpc-message-timeout")
	errEvicted     = errors.New("request message not received, and its place at --grpc-max-calls taken by a new call")
)

// call is one unary call the gate watches, and the context the gate gives it: its stream's,
// which the gate may cancel, and which holds the call itself under callKey (see Value).
type call struct {
	context.Context
	g      *callGate
	start  time.Time // when its headers came; set under the gate's mutex, in list order
	cancel context.CancelCauseFunc
	// stopEnd unregisters end from the call's stream's context; true when end will not run.
	stopEnd func() bool

	// state is arriving, then arrived, expired or evicted; the gate's mutex guards the list and
	// open, state moves by compare-and-swap out of arriving.
	state   atomic.Int32
	counted bool // holds a place in the bound (set in tap, before the call is shared)
	// listed: on the gate's list while its message arrives, for the message deadline or the
	// bound's eviction (set in tap, before the call is shared); onList says whether it is
	// there still.
	listed     bool
	prev, next *call
	onList     bool
}

const (
	callArriving int32 = iota
	callArrived
	callExpired
	callEvicted
)

type callKey struct{}

// tap runs as a call's headers arrive, on its connection's reader, before gRPC reads the
// message.
func (g *callGate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !g.unary[info.FullMethodName] {
		return ctx, nil
	}
	stream := ctx
	c := &call{g: g}
	c.Context, c.cancel = context.WithCancelCause(ctx)
	c.counted = g.max > 0 && info.FullMethodName == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName
	c.listed = c.counted || g.timeout > 0
	if c.listed {
		admitted, victim := g.admit(c)
		if !admitted {
			c.cancel(errTooManyCalls)
			g.refused.Inc()
			return nil, errTooManyCalls
		}
		if victim != nil {
			victim.cancel(errEvicted)
			g.slowCall(reasonEvicted)
		}
	}
	// The stream's context ends with the call, however it ends (answered, reset, its
	// connection closed, or given up by gRPC once the call's context is cancelled). end is
	// registered on it rather than on the call's context, which would then need a channel and a
	// map of children of its own.
	c.stopEnd = context.AfterFunc(stream, c.end)
	return c, nil
}

// Value returns the call under callKey, and otherwise its stream's values.
func (c *call) Value(key any) any {
	if key == (callKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// admit lists c, a listed call. A counted one first takes a place in the bound: a free one, or
// the place of the oldest call waiting for its message for at least evictAfter, returned to be
// cancelled; false when there is neither.
func (g *callGate) admit(c *call) (admitted bool, victim *call) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now() // under the mutex, so that the list stays in the order of start
	c.start = now
	if c.counted {
		if g.open >= g.max {
			// The list holds calls still arriving, oldest first, but for one whose message or
			// deadline came a moment ago and that has not taken itself off yet.
			for o := g.arriving.head; o != nil && now.Sub(o.start) >= evictAfter; o = o.next {
				if o.counted && o.state.CompareAndSwap(callArriving, callEvicted) {
					victim = o
					break
				}
			}
			if victim == nil {
				return false, nil
			}
			g.arriving.remove(victim)
			g.open-- // its place is c's: its end gives back none
		}
		g.open++
	}
	g.arriving.push(c)
	if g.timeout > 0 && !g.armed {
		g.armed = true
		g.sweep.Reset(g.timeout)
	}
	return true, victim
}

// arrived is called once the call's message has been read: the deadline no longer applies and
// the call can no longer be evicted.
func (c *call) arrived() {
	if !c.state.CompareAndSwap(callArriving, callArrived) {
		return
	}
	if c.listed {
		c.g.mu.Lock()
		c.g.arriving.remove(c)
		c.g.mu.Unlock()
	}
}

// expire runs at the message deadline of the oldest listed call, or a little earlier: the calls
// still waiting for their message --grpc-message-timeout after their headers are cancelled, and
// the sweep is armed again for the oldest call left.
func (g *callGate) expire() {
	var late []*call
	g.mu.Lock()
	now := time.Now()
	for c := g.arriving.head; c != nil && now.Sub(c.start) >= g.timeout; c = g.arriving.head {
		g.arriving.remove(c)
		if c.state.CompareAndSwap(callArriving, callExpired) {
			late = append(late, c)
			if c.counted {
				g.open-- // given back here: its end, when its stream ends, gives back none
			}
		}
	}
	if c := g.arriving.head; c != nil {
		g.sweep.Reset(c.start.Add(g.timeout).Sub(now))
	} else {
		g.armed = false
	}
	g.mu.Unlock()
	for _, c := range late {
		g.slowCall(reasonTimeout) // counted by the time its call sees it
		c.cancel(errSlowMessage)
	}
}

// end runs once when the call's stream ends, or when its handler returns: it gives back its
// place, unless the gate took it back already (expired) or gave it to another call (evicted).
func (c *call) end() {
	if !c.listed {
		return
	}
	g := c.g
	g.mu.Lock()
	g.arriving.remove(c)
	if st := c.state.Load(); c.counted && st != callEvicted && st != callExpired {
		g.open--
	}
	g.mu.Unlock()
}

// slowCall counts a slow call cancelled, and says so at most once per --log-repeat-interval.
func (g *callGate) slowCall(reason string) {
	g.slow.WithLabelValues(reason).Inc()
	if g.warn != nil {
		g.warn.Warn("grpc slow call "+reason, "gRPC calls cancelled: their request message did not arrive in time",
			"reason", reason, "message_timeout", g.timeout, "max_calls", g.max)
	}
}

// interceptor is the first unary interceptor: the call's message has arrived. A call's place is
// given back as its handler returns.
func (g *callGate) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil {
		return handler(ctx, req)
	}
	c.arrived()
	defer func() {
		if c.stopEnd() {
			c.end()
		}
	}()
	return handler(ctx, req)
}

// calls is a list of calls, in the order they were pushed; the gate's mutex guards it.
type calls struct{ head, tail *call }

func (l *calls) push(c *call) {
	c.prev, c.next, c.onList = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = c
	} else {
		l.head = c
	}
	l.tail = c
}

func (l *calls) remove(c *call) {
	if !c.onList {
		return
	}
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		l.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		l.tail = c.prev
	}
	c.prev, c.next, c.onList = nil, nil, false
}
