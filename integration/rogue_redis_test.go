package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// rogueRedis is a TCP server that speaks just enough RESP to pass for Redis (HELLO, CLIENT,
// PING, SELECT, READONLY, AUTH) and answers every other command whose name hostile picks with
// reply, then holds the connection open sending nothing more, as a rogue or corrupted Redis
// would. Other commands get an error reply.
type rogueRedis struct {
	ln      net.Listener
	hostile func(cmd string) bool
	reply   string
	sent    atomic.Int64 // hostile replies written
	mu      sync.Mutex
	conns   []net.Conn
}

func startRogueRedis(t *testing.T, reply string, hostile func(cmd string) bool) *rogueRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rogueRedis{ln: ln, hostile: hostile, reply: reply}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.conns = append(r.conns, c)
			r.mu.Unlock()
			go r.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.conns {
			c.Close()
		}
	})
	return r
}

func (r *rogueRedis) addr() string { return r.ln.Addr().String() }

// helloReply is HELLO 3's answer: a RESP3 map, as Redis 7 sends it.
const helloReply = "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n$5\r\nproto\r\n:3\r\n" +
	"$2\r\nid\r\n:1\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"

func (r *rogueRedis) serve(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReader(c)
	for {
		args, err := readCommand(rd)
		if err != nil {
			return
		}
		name := strings.ToUpper(args[0])
		if len(args) > 1 && (name == "CLUSTER" || name == "SCRIPT" || name == "FUNCTION" || name == "CLIENT") {
			name += " " + strings.ToUpper(args[1])
		}
		var out string
		switch {
		case name == "HELLO":
			out = helloReply
		case strings.HasPrefix(name, "CLIENT"), name == "SELECT", name == "READONLY", name == "AUTH":
			out = "+OK\r\n"
		case name == "SENTINEL" && len(args) > 1 && strings.EqualFold(args[1], "get-master-addr-by-name"):
			// As a sentinel: the master is this server itself.
			host, port, _ := net.SplitHostPort(r.addr())
			out = fmt.Sprintf("*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(host), host, len(port), port)
		case name == "SENTINEL":
			out = "*0\r\n"
		case r.hostile(name):
			r.sent.Add(1)
			if _, err := io.WriteString(c, r.reply); err != nil {
				return
			}
			// Hold the connection: a client that believed the reply waits for its bytes.
			_, _ = io.Copy(io.Discard, rd)
			return
		case name == "PING":
			out = "+PONG\r\n"
		default:
			out = "-ERR unknown command '" + name + "'\r\n"
		}
		if _, err := io.WriteString(c, out); err != nil {
			return
		}
	}
}

// readCommand reads one command as clients send them: an array of bulk strings.
func readCommand(rd *bufio.Reader) ([]string, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("command %q: want an array", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 || n > 1<<16 {
		return nil, fmt.Errorf("command %q", line)
	}
	args := make([]string, n)
	for i := range args {
		line, err := rd.ReadString('\n')
		if err != nil {
			return nil, err
		}
		m, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if err != nil || m < 0 || m > 64<<20 {
			return nil, fmt.Errorf("argument %q", line)
		}
		b := make([]byte, m+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:m])
	}
	return args, nil
}

const rogueRules = `
domain: rogue
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100}
`

// TestRogueRedisRepliesBounded: a Redis whose replies declare more than any reply rls reads
// (a Cluster node answering CLUSTER SLOTS with *2147483000, a single node answering every
// command after the handshake with $2147483000, a Sentinel's master answering =2147483000)
// fails its connections, not the process: rls
// stays up, its memory does not grow with what was declared, Redis counts as failing
// (rls_backend_up 0, decisions answered by the failure mode and counted as backend errors), and
// the refusal is logged.
func TestRogueRedisRepliesBounded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		scheme  string
		reply   string
		hostile func(cmd string) bool
	}{
		{"cluster slots", "redis-cluster://", "*2147483000\r\n",
			func(cmd string) bool { return cmd == "CLUSTER SLOTS" || cmd == "CLUSTER SHARDS" }},
		{"single node", "redis://", "$2147483000\r\n",
			func(string) bool { return true }},
		{"sentinel's master", "redis-sentinel://", "=2147483000\r\n",
			func(string) bool { return true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rogue := startRogueRedis(t, tc.reply, tc.hostile)
			url := tc.scheme + rogue.addr()
			if tc.scheme == "redis-sentinel://" {
				url += "/mymaster"
			}
			p := launchRLS(t, nil, "--config", writeRules(t, map[string]string{"rogue.yaml": rogueRules}),
				"--backend", "redis", "--redis-url", url, "--failure-mode", "deny", "--redis-health-interval", "100ms", "--redis-read-timeout", "100ms",
				"--log-format", "text")
			p.WaitReady(t)
			client := p.client(t)
			ctx := ctxT(t)
			// Three seconds of decisions: rls dials again after each refused connection, and the
			// probe asks on connections of its own.
			deadline := time.Now().Add(3 * time.Second)
			var answered, denied int
			for time.Now().Before(deadline) {
				resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rogue",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: strconv.Itoa(answered)}}}}})
				if err != nil {
					select {
					case <-p.Done():
						t.Fatalf("rls exited: %v\n%s", p.ExitErr(), tail(p.Output(), 40))
					default:
					}
					t.Fatalf("decision %d: %v", answered, err)
				}
				answered++
				if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
					denied++
				}
				time.Sleep(20 * time.Millisecond)
			}
			select {
			case <-p.Done():
				t.Fatalf("rls exited: %v\n%s", p.ExitErr(), tail(p.Output(), 40))
			default:
			}
			rss, peak := p.Memory(t)
			vals := metricValues(t, p.HTTPAddr)
			up := metricNumber(t, vals, "rls_backend_up")
			unavailable := metricNumber(t, vals, `rls_backend_errors_total{kind="unavailable"}`)
			refusals := strings.Count(p.Output(), "redis reply refused")
			t.Logf("%s answered %q %d times: rls alive, RSS %d MB (peak %d MB); %d decisions, %d denied by the failure mode; rls_backend_up %v, backend errors (unavailable) %v; %d log lines name the refusal",
				tc.name, strings.TrimSpace(tc.reply), rogue.sent.Load(), rss>>20, peak>>20, answered, denied, up, unavailable, refusals)
			if rogue.sent.Load() == 0 {
				t.Fatal("rls never sent the command the rogue Redis answers: the test tests nothing")
			}
			if peak > 400<<20 {
				t.Errorf("peak RSS %d MB: rls allocated what the reply declared", peak>>20)
			}
			if denied != answered {
				t.Errorf("%d of %d decisions denied: want all answered by --failure-mode deny", denied, answered)
			}
			if up != 0 {
				t.Errorf("rls_backend_up %v with every Redis reply refused, want 0", up)
			}
			if unavailable == 0 {
				t.Error("no decision counted as backend unavailable")
			}
			if refusals == 0 {
				t.Errorf("no log line names the refusal (\"redis reply refused\")\n%s", tail(p.Output(), 20))
			}
		})
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
