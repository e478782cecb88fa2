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
	"github.com/rls-project/rls/internal/redistest"
)

const (
	singleEnv  = redistest.SingleEnv
	clusterEnv = redistest.ClusterEnv
)

// newTestBackend connects to the Redis in env with a timeout generous enough for the race
// detector on a small machine; opts fields that are set are kept.
func newTestBackend(t testing.TB, env string, opts Options) *Backend {
	t.Helper()
	target, err := ParseURL(redistest.URL(t, env))
	if err != nil {
		t.Fatal(err)
	}
	opts.Target = target
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.ReadTimeout == 0 {
		opts.ReadTimeout = 5 * time.Second
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

// startSentinel starts a Redis Sentinel on a free loopback port monitoring master (host:port)
// under the name "rlsmaster", stopped when the test ends, and returns its address.
func startSentinel(t testing.TB, master string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(master)
	dir := t.TempDir()
	p := redistest.FreePort(t)
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

// keysOnTwoMasters returns two keys named prefix and a number whose Cluster masters differ.
func keysOnTwoMasters(t *testing.T, b *Backend, prefix string) (string, string) {
	t.Helper()
	cc := b.rdb.(*goredis.ClusterClient)
	var ka, addrA string
	for i := 0; ; i++ {
		k := prefix + strconv.Itoa(i)
		n, err := cc.MasterForKey(context.Background(), storedKey(b.prefix, k))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case ka == "":
			ka, addrA = k, n.Options().Addr
		case n.Options().Addr != addrA:
			return ka, k
		}
	}
}

// callPtrs returns j's calls, as a node's sender takes them.
func (j *job) callPtrs() []*call {
	calls := make([]*call, len(j.calls))
	for k := range j.calls {
		calls[k] = &j.calls[k]
	}
	return calls
}
