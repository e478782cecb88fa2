package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// SentinelMaster is the name under which a Sentinel started here monitors its master.
const SentinelMaster = "rlsmaster"

// Sentinel is a Redis master with one replica, watched by one Redis Sentinel (quorum 1) that
// fails over to the replica within about a second of the master stopping to answer.
type Sentinel struct {
	t       testing.TB
	Master  *Server // the master when started; after a failover, see MasterAddr
	Replica *Server
	addr    string // the Sentinel's host:port
	dir     string
	cmd     *exec.Cmd
	done    chan struct{}
}

// StartSentinel starts a master, its replica and a Sentinel monitoring them, each on a free
// loopback port and killed when the test ends; args are more redis-server arguments for the
// master and the replica. It returns once the replica is in sync and the Sentinel knows both.
func StartSentinel(t testing.TB, args ...string) *Sentinel {
	t.Helper()
	// A replica syncs at once (not after the 5 s diskless-sync delay), so does a master demoted
	// after a failover.
	args = append([]string{"--repl-diskless-sync-delay", "0"}, args...)
	master := StartWith(t, args...)
	host, port := "127.0.0.1", strconv.Itoa(master.port)
	replica := StartWith(t, append(append([]string(nil), args...), "--replicaof", host, port)...)
	s := &Sentinel{t: t, Master: master, Replica: replica, dir: t.TempDir()}
	sentinelWait(t, 10*time.Second, "the replica in sync with its master", func() bool {
		return sentinelInfo(replica.Addr(), "replication", "master_link_status") == "up"
	})
	for attempt := 0; ; attempt++ {
		if s.start(host, port) {
			break
		}
		if attempt == 4 {
			log, _ := os.ReadFile(filepath.Join(s.dir, "sentinel.log"))
			t.Fatalf("redis-server --sentinel did not start on 5 free ports:\n%s", log)
		}
	}
	t.Cleanup(func() { s.cmd.Process.Kill(); <-s.done })
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: s.addr, MaxRetries: -1})
	defer sc.Close()
	sentinelWait(t, 10*time.Second, "the Sentinel to know the master and its replica", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		replicas, err := sc.Replicas(ctx, SentinelMaster).Result()
		if err != nil {
			return false
		}
		for _, r := range replicas {
			if r["name"] == replica.Addr() && !strings.Contains(r["flags"], "down") {
				return true
			}
		}
		return false
	})
	return s
}

// start starts the Sentinel on a free port, monitoring host:port, and waits until it answers
// or exits.
func (s *Sentinel) start(host, port string) bool {
	s.t.Helper()
	p := FreePort(s.t)
	conf := filepath.Join(s.dir, "sentinel.conf")
	body := fmt.Sprintf("bind 127.0.0.1\nport %d\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %[4]s 500\n"+
		"sentinel failover-timeout %[4]s 10000\n"+
		"sentinel parallel-syncs %[4]s 1\n",
		p, s.dir, filepath.Join(s.dir, "sentinel.log"), SentinelMaster, host, port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = exec.Command("redis-server", conf, "--sentinel")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	s.addr = "127.0.0.1:" + strconv.Itoa(p)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-s.done:
			return false
		default:
		}
		if sentinelInfo(s.addr, "server", "redis_mode") == "sentinel" {
			return true
		}
		if time.Now().After(deadline) {
			s.cmd.Process.Kill()
			<-s.done
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Addr is the Sentinel's host:port.
func (s *Sentinel) Addr() string { return s.addr }

// URL is the redis-sentinel:// URL of the master through the Sentinel.
func (s *Sentinel) URL() string { return "redis-sentinel://" + s.addr + "/" + SentinelMaster }

// MasterAddr is the master's host:port as the Sentinel reports it now.
func (s *Sentinel) MasterAddr() string {
	s.t.Helper()
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: s.addr, MaxRetries: -1})
	defer sc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	a, err := sc.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil || len(a) != 2 {
		s.t.Fatalf("sentinel %s: master %s: %v %v", s.addr, SentinelMaster, a, err)
	}
	return a[0] + ":" + a[1]
}

// WaitFailover waits until the Sentinel reports as master a node other than old and that node
// answers as a master, and returns its host:port; it fails the test after timeout.
func (s *Sentinel) WaitFailover(old string, timeout time.Duration) string {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		now := s.MasterAddr()
		if now != old && sentinelInfo(now, "replication", "role") == "master" {
			return now
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("no failover away from %s within %v; the Sentinel's log:\n%s", old, timeout, s.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Log is the Sentinel's log so far.
func (s *Sentinel) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "sentinel.log"))
	return string(b)
}

// ServerAt returns the Server (Master or Replica) listening on addr, or nil.
func (s *Sentinel) ServerAt(addr string) *Server {
	for _, srv := range []*Server{s.Master, s.Replica} {
		if srv.Addr() == addr {
			return srv
		}
	}
	return nil
}

// sentinelInfo returns field of INFO section on addr, or "" when it does not answer.
func sentinelInfo(addr, section, field string) string {
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// sentinelWait polls cond every 20 ms until it holds, failing the test with what after timeout.
func sentinelWait(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
