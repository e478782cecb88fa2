package redis

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/rls-project/rls/internal/respguard"
)

// The one builder of go-redis clients: every client rls opens to Redis (the decisions', the
// probes', the topology's control and admin clients, and RLQS's through NewClient) is built
// here, with the same settings: no command retried, one dial per attempt, maintenance
// notifications off, replies bounded (guardedDialer).

// clientOptions are the connection settings of every topology.
type clientOptions struct {
	poolSize    int
	dialTimeout time.Duration
	readTimeout time.Duration
	// contextTimeout: a context's deadline bounds socket reads and writes too (a read cut short
	// closes the connection). Otherwise it bounds waiting for a connection and dialing only,
	// and reads and writes are bounded by readTimeout.
	contextTimeout bool
}

// NewClient is go-redis's client of t, for a user of Redis other than the decisions (the RLQS
// shares), with the settings every client of this package holds: no command retried, one dial
// per attempt, maintenance notifications off, replies bounded (guardedDialer). On a Cluster,
// go-redis keeps the slot map itself.
func NewClient(t Target, dialTimeout, readTimeout time.Duration) goredis.UniversalClient {
	c := clientOptions{dialTimeout: dialTimeout, readTimeout: readTimeout}
	if t.Topology == Cluster {
		return newClusterClient(t, c, nil)
	}
	return newClient(t, c)
}

// newClient connects to t, a single node or Sentinel. Commands are never retried by go-redis: a
// script whose reply was lost may have run, and running it again would charge twice. Nor are
// dials: go-redis's default of five dials 100 ms apart would spend a decision's whole budget
// asleep when Redis refuses connections, and the decision would count as overload rather than
// as Redis failing. The circuit breaker and its probe are the retries.
func newClient(t Target, c clientOptions) goredis.UniversalClient {
	tlsConf := t.tls()
	if t.Topology == Sentinel {
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName: t.Master, SentinelAddrs: t.Addrs, SentinelUsername: t.SentinelUsername,
			SentinelPassword: t.SentinelPassword, Username: t.Username, Password: t.Password, DB: t.DB,
			TLSConfig: tlsConf, PoolSize: c.poolSize, DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout,
			WriteTimeout: c.readTimeout, ContextTimeoutEnabled: c.contextTimeout, MaxRetries: -1, DialerRetries: 1,
			DisableIdentity: true, Dialer: guardedDialer(c.dialTimeout, tlsConf),
		})
	}
	var o *goredis.Options
	if t.single != nil {
		cp := *t.single
		if cp.TLSConfig != nil && t.TLSConfig != nil {
			cp.TLSConfig = tlsConf
		}
		o = &cp
	} else {
		o = &goredis.Options{Addr: t.Addrs[0], Username: t.Username, Password: t.Password, DB: t.DB, TLSConfig: tlsConf}
	}
	return goredis.NewClient(nodeOptions(o, c))
}

// newNodeClient connects to one node of the Cluster t, at addr, with the settings of newClient:
// no retries, one dial per attempt.
func newNodeClient(t Target, addr string, c clientOptions) goredis.UniversalClient {
	o := &goredis.Options{Addr: addr, Username: t.Username, Password: t.Password, TLSConfig: t.tls()}
	return goredis.NewClient(nodeOptions(o, c))
}

// nodeOptions sets c, no retries and one dial per attempt in o.
func nodeOptions(o *goredis.Options, c clientOptions) *goredis.Options {
	o.PoolSize = c.poolSize
	o.DialTimeout = c.dialTimeout
	o.ReadTimeout = c.readTimeout
	o.WriteTimeout = c.readTimeout
	o.ContextTimeoutEnabled = c.contextTimeout
	o.MaxRetries = -1
	o.DialerRetries = 1
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.Dialer = guardedDialer(o.DialTimeout, o.TLSConfig)
	return o
}

// guardedDialer dials as go-redis does by default (TCP keep-alives; TLS with tlsConf when not
// nil) and guards each connection's reads with respguard: a reply that declares a string or an
// aggregate past its bounds fails that connection's read, as a broken connection does, before
// go-redis allocates what was declared. A rogue or corrupted Redis then fails its calls (Redis
// unavailable, to the breaker and the failure mode), and cannot make the process allocate
// gigabytes with a few bytes. Every client of every topology dials through it.
func guardedDialer(timeout time.Duration, tlsConf *tls.Config) func(context.Context, string, string) (net.Conn, error) {
	dial := goredis.NewDialer(&goredis.Options{DialTimeout: timeout, TLSConfig: tlsConf})
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return respguard.Wrap(c), nil
	}
}

// newClusterClient is go-redis's client of the Cluster t, with the slot map slots gives. It
// carries no decision (each master's node does: see topology.go), only keys' administration,
// whose commands may be sent again: no retry on a network error, and a redirect followed once.
func newClusterClient(t Target, c clientOptions, slots func(context.Context) ([]goredis.ClusterSlot, error)) *goredis.ClusterClient {
	return goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: t.Addrs, Username: t.Username, Password: t.Password, TLSConfig: t.tls(),
		PoolSize: c.poolSize, DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout,
		WriteTimeout: c.readTimeout, ContextTimeoutEnabled: c.contextTimeout, MaxRetries: -1, MaxRedirects: 1,
		DialerRetries: 1, DisableIdentity: true, ClusterSlots: slots, Dialer: guardedDialer(c.dialTimeout, t.tls()),
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// probePoolSize is the probe client's pool size. The probe holds at most two connections (the
// breaker's probe and kickProbe's, one each), but go-redis also takes the pool size as the
// number of failed dials after which a pool stops dialling: it then answers with its last dial
// error and dials only in the background, once a second. A pool of one would stop after the
// first refused probe, and a Redis that came back would be found a second later rather than
// at the next probe.
const probePoolSize = 1024

// probeOptions are the settings of a node's probe client: its own connections, their reads
// bounded by the probe's deadline.
func probeOptions(c clientOptions) clientOptions {
	return clientOptions{poolSize: probePoolSize, dialTimeout: c.dialTimeout, readTimeout: c.readTimeout, contextTimeout: true}
}

// newControlClient is the client a fetch of the slot map asks the node at addr with: one
// connection, its reads bounded by the fetch's deadline.
func newControlClient(t Target, addr string, c clientOptions) *goredis.Client {
	return newNodeClient(t, addr, clientOptions{poolSize: 2, dialTimeout: min(c.dialTimeout, fetchTimeout),
		readTimeout: c.readTimeout, contextTimeout: true}).(*goredis.Client)
}

// tls returns the TLS configuration of t's connections, nil without TLS: t.TLSConfig or the
// default, with the server name of the first address when it has none.
func (t Target) tls() *tls.Config {
	if !t.TLS || len(t.Addrs) == 0 {
		return nil
	}
	host := t.Addrs[0]
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	if t.TLSConfig == nil {
		return &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	conf := t.TLSConfig.Clone()
	if conf.ServerName == "" {
		conf.ServerName = host
	}
	return conf
}
