package redis

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Topology is how Redis is deployed.
type Topology string

// The topologies a URL can name.
const (
	Single   Topology = "single"
	Sentinel Topology = "sentinel"
	Cluster  Topology = "cluster"
)

// Target is a parsed Redis URL. Its String hides the password.
type Target struct {
	Topology Topology
	Addrs    []string // host:port of the node, the sentinels or the cluster seed nodes
	Master   string   // Sentinel: the monitored master's name
	DB       int
	TLS      bool
	Username string
	Password string
	// SentinelUsername and SentinelPassword authenticate to the sentinels themselves.
	SentinelUsername string
	SentinelPassword string
	// TLSConfig, when TLS is set, replaces the default: the system's roots, verifying the
	// server name of the first address. A ServerName left empty is filled in the same way.
	TLSConfig *tls.Config
	single    *goredis.Options
}

// String describes t without its passwords.
func (t Target) String() string {
	s := fmt.Sprintf("%s %s", t.Topology, strings.Join(t.Addrs, ","))
	if t.Master != "" {
		s += " master " + t.Master
	}
	if t.DB != 0 {
		s += fmt.Sprintf(" db %d", t.DB)
	}
	if t.TLS {
		s += " tls"
	}
	return s
}

// ParseURL parses a Redis URL, one scheme per topology:
//
//	redis://[user:password@]host:port[/db]                single node (rediss:// with TLS)
//	unix://[user:password@]/path/to/socket[?db=N]         single node on a unix socket
//	redis-sentinel://[user:password@]host:port,host:port/master[/db][?sentinel_username=u&sentinel_password=p]
//	                                                      Sentinel (rediss-sentinel:// with TLS)
//	redis-cluster://[user:password@]host:port,host:port   Cluster seed nodes (rediss-cluster:// with TLS)
//
// user and password authenticate to the Redis nodes; in redis:// URLs any query parameter of
// go-redis's ParseURL is accepted too. Every address needs a host and a port from 1 to 65535
// (the default port when none is given): an address that can never be dialed is refused here
// rather than found failing at every probe. An error shows the URL as RedactURL does, and
// never a part of a password.
func ParseURL(raw string) (Target, error) {
	shown := RedactURL(raw)
	t, err := parseURL(raw, shown)
	if err != nil {
		return Target{}, err
	}
	for _, a := range t.Addrs {
		if t.single != nil && t.single.Network == "unix" {
			break
		}
		if err := checkAddr(a); err != nil {
			return Target{}, fmt.Errorf("redis url %q: %w", shown, err)
		}
	}
	return t, nil
}

// checkAddr says what is wrong with a host:port that cannot be dialed.
func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("address %q: want host:port (an IPv6 host in brackets: [::1]:6379)", a)
	}
	if host == "" {
		return fmt.Errorf("address %q: no host", a)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("address %q: port %q: want a number from 1 to 65535", a, port)
	}
	return nil
}

// errUserInfo is the error of a user info that does not parse: it says nothing of the text,
// which holds a password.
var errUserInfo = errors.New("user info (user:password@) is not valid in a URL: percent-encode the characters :@/?#% and spaces of the user name and password")

// parseURL is ParseURL without the address checks; shown is raw as its errors show it.
func parseURL(raw, shown string) (Target, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Target{}, fmt.Errorf("redis url: %q has no scheme: want redis://, rediss://, redis-sentinel:// or redis-cluster://", shown)
	}
	var t Target
	switch scheme {
	case "redis", "rediss", "unix":
		o, err := parseSingle(raw, shown)
		if err != nil {
			return Target{}, fmt.Errorf("redis url %q: %v", shown, err)
		}
		return Target{Topology: Single, Addrs: []string{o.Addr}, DB: o.DB, TLS: o.TLSConfig != nil,
			Username: o.Username, Password: o.Password, single: o}, nil
	case "redis-sentinel", "rediss-sentinel":
		t.Topology = Sentinel
	case "redis-cluster", "rediss-cluster":
		t.Topology = Cluster
	default:
		return Target{}, fmt.Errorf("redis url %q: scheme %q: want redis, rediss, redis-sentinel, rediss-sentinel, redis-cluster or rediss-cluster", shown, scheme)
	}
	t.TLS = strings.HasPrefix(scheme, "rediss")
	rest, query, _ := strings.Cut(rest, "?")
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		u, err := url.Parse("x://" + rest[:at+1] + "h")
		if err != nil || u.User == nil {
			return Target{}, fmt.Errorf("redis url %q: %w", shown, errUserInfo)
		}
		t.Username = u.User.Username()
		t.Password, _ = u.User.Password()
		rest = rest[at+1:]
	}
	hosts, path, _ := strings.Cut(rest, "/")
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return Target{}, fmt.Errorf("redis url %q: empty host", shown)
		}
		if !strings.Contains(h, ":") {
			port := "6379"
			if t.Topology == Sentinel {
				port = "26379"
			}
			h += ":" + port
		}
		t.Addrs = append(t.Addrs, h)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		// The error quotes the query, which may hold sentinel_password.
		return Target{}, fmt.Errorf("redis url %q: query is not valid: percent-encode %% and & in its values", shown)
	}
	var segs []string
	if path != "" {
		segs = strings.Split(path, "/")
	}
	var errs []error
	switch t.Topology {
	case Sentinel:
		if len(segs) == 0 || segs[0] == "" {
			return Target{}, fmt.Errorf("redis url %q: want the master name as the path: redis-sentinel://host:26379/mymaster", shown)
		}
		t.Master = segs[0]
		switch len(segs) {
		case 1:
		case 2:
			if t.DB, err = strconv.Atoi(segs[1]); err != nil {
				errs = append(errs, fmt.Errorf("path %q: want /master or /master/db", path))
			}
		default:
			errs = append(errs, fmt.Errorf("path %q: want /master or /master/db", path))
		}
		if v := q.Get("db"); v != "" {
			if t.DB, err = strconv.Atoi(v); err != nil {
				errs = append(errs, fmt.Errorf("db %q: want a number", v))
			}
		}
		t.SentinelUsername, t.SentinelPassword = q.Get("sentinel_username"), q.Get("sentinel_password")
		q.Del("db")
		q.Del("sentinel_username")
		q.Del("sentinel_password")
	case Cluster:
		if len(segs) > 0 && segs[0] != "" {
			errs = append(errs, fmt.Errorf("path %q: a Cluster has no databases", path))
		}
	}
	for k := range q {
		errs = append(errs, fmt.Errorf("unknown parameter %q", k))
	}
	if err := errors.Join(errs...); err != nil {
		return Target{}, fmt.Errorf("redis url %q: %w", shown, err)
	}
	return t, nil
}

// parseSingle parses a redis://, rediss:// or unix:// URL with go-redis. Its errors may quote
// the URL or parts of it, password included, so a URL that holds one is parsed again with the
// password replaced, and the error shown is of that parse, or errUserInfo when that one
// succeeds (then the password itself is what does not parse).
func parseSingle(raw, shown string) (*goredis.Options, error) {
	o, err := goredis.ParseURL(raw)
	if err == nil {
		if o.Network == "tcp" {
			if u, perr := url.Parse(raw); perr == nil && u.Hostname() == "" {
				// go-redis would dial localhost: an empty host is a mistake (a variable
				// left unset in a template), not a wish for the default.
				return nil, errors.New("no host: want redis://host:port")
			}
		}
		return o, nil
	}
	if shown != raw {
		if _, serr := goredis.ParseURL(shown); serr != nil {
			err = serr
		} else {
			return nil, errUserInfo
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // without the URL it quotes whole
	}
	return nil, err
}

// RedactURL returns raw, a Redis URL or a host list that may not parse, with its passwords
// replaced by xxx: the password of the user info (the whole user info when it has no ':'), and
// any query parameter whose name holds "password". When the user info cannot be told from the
// query (an '@' after the first '?'), everything after the scheme is hidden.
func RedactURL(raw string) string {
	prefix := ""
	rest := raw
	if scheme, r, ok := strings.Cut(raw, "://"); ok {
		prefix, rest = scheme+"://", r
	}
	q := strings.IndexByte(rest, '?')
	at := strings.LastIndexByte(rest, '@')
	if q >= 0 && at > q {
		return prefix + "xxx"
	}
	query, hasQuery := "", q >= 0
	if hasQuery {
		rest, query = rest[:q], rest[q+1:]
	}
	if at >= 0 {
		if user, _, hasPass := strings.Cut(rest[:at], ":"); hasPass {
			rest = user + ":xxx" + rest[at:]
		} else {
			rest = "xxx" + rest[at:]
		}
	}
	if !hasQuery {
		return prefix + rest
	}
	v, err := url.ParseQuery(query)
	if err != nil {
		return prefix + rest + "?xxx"
	}
	for k := range v {
		if strings.Contains(strings.ToLower(k), "password") {
			v.Set(k, "xxx")
		}
	}
	return prefix + rest + "?" + v.Encode()
}
