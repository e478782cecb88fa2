package redis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// redisURL returns the URL in the environment variable name, which scripts/test sets after
// starting Redis, and fails the test when it is missing.
func redisURL(t testing.TB, name string) string {
	t.Helper()
	u := os.Getenv(name)
	if u == "" {
		t.Fatalf("%s is not set: run the tests with scripts/test, which starts a single Redis and a Redis Cluster "+
			"(or start them yourself and set RLS_TEST_REDIS_URL=redis://127.0.0.1:6379 and "+
			"RLS_TEST_REDIS_CLUSTER_URL=redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002)", name)
	}
	return u
}

const (
	singleEnv  = "RLS_TEST_REDIS_URL"
	clusterEnv = "RLS_TEST_REDIS_CLUSTER_URL"
)

// newTestBackend connects to the Redis in env with a timeout generous enough for the race
// detector on a small machine; opts fields that are set are kept.
func newTestBackend(t testing.TB, env string, opts Options) *Backend {
	t.Helper()
	target, err := ParseURL(redisURL(t, env))
	if err != nil {
		t.Fatal(err)
	}
	opts.Target = target
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = fmt.Sprintf("test-%d:", time.Now().UnixNano())
	}
	b, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if !b.Healthy() {
		t.Fatalf("Redis at %s is not answering", target)
	}
	return b
}

// commandCounter counts the commands a go-redis client sends, by name.
type commandCounter struct {
	calls chan string
}

func (c *commandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *commandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		c.calls <- cmd.Name()
		return next(ctx, cmd)
	}
}

func (c *commandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			c.calls <- cmd.Name()
		}
		return next(ctx, cmds)
	}
}

func (c *commandCounter) count() int {
	n := 0
	for {
		select {
		case <-c.calls:
			n++
		default:
			return n
		}
	}
}

// ownRedis is a redis-server this test started, so that it can kill and restart it.
type ownRedis struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startOwnRedis starts a redis-server on a free loopback port, stopped when the test ends.
func startOwnRedis(t testing.TB) *ownRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed: run the tests with scripts/test, which installs it (Debian: apt-get install -y redis-server)")
	}
	r := &ownRedis{t: t, port: freePort(t), dir: t.TempDir()}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *ownRedis) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *ownRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(r.port), "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(r.dir, "redis.log"))
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(r.cmd, r.done)
	c := goredis.NewClient(&goredis.Options{Addr: r.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("redis-server on %s did not start:\n%s", r.addr(), log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill stops the server at once, losing its data.
func (r *ownRedis) kill() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// startSentinel starts a Redis Sentinel on a free loopback port monitoring master (host:port)
// under the name "rlsmaster", stopped when the test ends, and returns its address.
func startSentinel(t testing.TB, master string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(master)
	dir := t.TempDir()
	p := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("bind 127.0.0.1\nport %d\ndir %s\nlogfile %s\nsentinel monitor rlsmaster %s %s 1\n",
		p, dir, filepath.Join(dir, "sentinel.log"), host, port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("redis-server", conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := "127.0.0.1:" + strconv.Itoa(p)
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	defer sc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if a, err := sc.GetMasterAddrByName(context.Background(), "rlsmaster").Result(); err == nil && len(a) == 2 {
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
			t.Fatalf("sentinel on %s does not know the master:\n%s", addr, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
