// Package redistest starts redis-server processes for tests that must kill and restart Redis
// themselves, and Redis Clusters of their own for tests that kill, stop and fail over their
// nodes (StartCluster), and hands out the shared Redis and Cluster that scripts/test starts.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The environment variables scripts/test sets to the Redis it started for the whole run.
const (
	SingleEnv  = "RLS_TEST_REDIS_URL"         // redis://host:port
	ClusterEnv = "RLS_TEST_REDIS_CLUSTER_URL" // redis-cluster://host:port,host:port,host:port
)

// URL returns the Redis URL in the environment variable env (SingleEnv or ClusterEnv), failing
// the test, with how to set it, when it is missing.
func URL(t testing.TB, env string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		t.Fatalf("%s is not set: run the tests with scripts/test, which starts a single Redis and a Redis Cluster "+
			"(or start them yourself and set %s=redis://127.0.0.1:6379 and "+
			"%s=redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002)", env, SingleEnv, ClusterEnv)
	}
	return u
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Server is a redis-server on a loopback port, without persistence: Kill loses its data and
// Start brings it back empty on the same port.
type Server struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	args []string // more redis-server arguments
}

// Start starts a redis-server on a free loopback port, killed when the test ends. It fails the
// test, saying how to install it, when redis-server is missing.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t)
}

// StartWith is Start with more redis-server arguments (e.g. "--rename-command", "FCALL", "x").
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: run the tests with scripts/test, which installs it (Debian: apt-get install -y redis-server)")
	}
	s := &Server{t: t, dir: t.TempDir(), args: args}
	// A port free a moment ago may be taken by another test's server before redis-server binds
	// it; redis-server then exits, and another port is tried.
	for attempt := 0; ; attempt++ {
		s.port = FreePort(t)
		if s.start() {
			break
		}
		if attempt == 4 {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			t.Fatalf("redis-server did not start on 5 free ports:\n%s", log)
		}
	}
	t.Cleanup(s.Kill)
	return s
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Start restarts the server on its port and waits until it answers.
func (s *Server) Start() {
	s.t.Helper()
	if !s.start() {
		log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		s.t.Fatalf("redis-server on %s did not start:\n%s", s.Addr(), log)
	}
}

// start starts the server and waits until it answers as itself (its process id), or exits.
func (s *Server) start() bool {
	s.t.Helper()
	args := append([]string{"--bind", "127.0.0.1", "--port", strconv.Itoa(s.port), "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(s.cmd, s.done)
	deadline := time.Now().Add(10 * time.Second)
	for s.pid() != s.cmd.Process.Pid {
		select {
		case <-s.done:
			return false
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// pid returns the process id of the Redis answering on the server's port, or 0.
func (s *Server) pid() int {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	fmt.Fprint(c, "INFO server\r\n")
	r := bufio.NewReader(c)
	header, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(header, "$") {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(header[1:]))
	if err != nil || n <= 0 {
		return 0
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0
	}
	for _, line := range strings.Split(string(body), "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, _ := strconv.Atoi(v)
			return pid
		}
	}
	return 0
}

// Signal sends sig to the server (SIGSTOP and SIGCONT make it stall and resume).
func (s *Server) Signal(sig os.Signal) error {
	if s.cmd == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr())
	}
	return s.cmd.Process.Signal(sig)
}

// Kill stops the server at once, losing its data.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}
