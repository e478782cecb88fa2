// Package rlstest runs the real rls binary for tests: it builds cmd/rls once per test process,
// starts it on loopback ports the kernel picks, reads the bound addresses from its "rls serving"
// log line, and stops it when the test ends.
//
// The binary is built without the race detector even under go test -race: the tests that use
// this package check rls's callers, not rls (the integration package runs rls under -race), and
// a plain build is several times faster to build and to run.
package rlstest

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/redistest"
)

// builds are the binaries built so far in this test process, by race detector on or off.
var builds struct {
	mu   sync.Mutex
	path map[bool]string
	err  map[bool]error
}

// moduleRoot is the module root, two levels above this package.
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Binary builds cmd/rls once per test process, into a temporary directory, and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	return BuildBinary(t, false)
}

// BuildBinary builds cmd/rls, with the race detector when race is set, once per test process
// for each, and returns its path.
func BuildBinary(t testing.TB, race bool) string {
	t.Helper()
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.path == nil {
		builds.path, builds.err = map[bool]string{}, map[bool]error{}
	}
	if p, ok := builds.path[race]; ok {
		return p
	}
	if err := builds.err[race]; err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "rlstest-bin-")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "rls")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/rls")...)
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		builds.err[race] = fmt.Errorf("go build ./cmd/rls: %v\n%s", err, out)
		t.Fatal(builds.err[race])
	}
	builds.path[race] = bin
	return bin
}

// Buffer collects a process's output; it is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// servingAddr matches an address in rls's "rls serving" log line, text or JSON.
var servingAddr = regexp.MustCompile(`"?(grpc|http|debug_http|metrics_http)"?[=:]"?(127\.0\.0\.1:[0-9]+)`)

// ServingAddrs reads the addresses rls reports having bound from its "rls serving" log line in
// output, by listener: "grpc", "http", "debug_http", "metrics_http". It is empty until the line
// is out.
func ServingAddrs(output string) map[string]string {
	addrs := map[string]string{}
	for _, line := range strings.Split(output, "\n") {
		if !strings.Contains(line, "rls serving") {
			continue
		}
		for _, m := range servingAddr.FindAllStringSubmatch(line, -1) {
			addrs[m[1]] = m[2]
		}
	}
	return addrs
}

// RedisURL is the URL of the single Redis that scripts/test starts; it fails the test, saying
// how to set it, when it is missing.
func RedisURL(t testing.TB) string {
	t.Helper()
	return redistest.URL(t, redistest.SingleEnv)
}

// Options says how to start rls.
type Options struct {
	// Args are rls serve flags. --grpc-addr and --http-addr are added on 127.0.0.1:0 unless
	// given; --debug-addr is turned off unless given.
	Args []string
	// Env is added to the process environment.
	Env []string
	// Rules, when set, is written to a rule file passed as --config (unless Args has --config).
	Rules string
}

// Proc is one running rls process.
type Proc struct {
	GRPCAddr  string // host:port
	HTTPAddr  string // host:port
	DebugAddr string // host:port of the debug listener; "" when it is off

	cmd     *exec.Cmd
	out     *Buffer
	done    chan struct{}
	exitErr error
	mu      sync.Mutex
	stopped bool // SIGSTOP sent and not yet resumed
	httpTLS bool // --http-tls-cert given: the HTTP listener speaks TLS
}

// Start starts rls with opts, waits until /readyz answers 200, and stops the process when the
// test ends. It fails the test when rls exits early or is not ready within 30 s.
func Start(t testing.TB, opts Options) *Proc {
	t.Helper()
	args := append([]string(nil), opts.Args...)
	joined := strings.Join(args, " ")
	if opts.Rules != "" && !strings.Contains(joined, "--config") {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(path, []byte(opts.Rules), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	for _, flag := range []string{"--grpc-addr", "--http-addr"} {
		if !strings.Contains(joined, flag) {
			args = append(args, flag, "127.0.0.1:0")
		}
	}
	if !strings.Contains(joined, "--debug-addr") {
		args = append(args, "--debug-addr", "")
	}
	args = append(args, "--log-format", "text")
	p := Launch(t, Binary(t), opts.Env, args...)
	p.httpTLS = strings.Contains(joined, "--http-tls-cert")
	p.WaitReady(t)
	return p
}

// Launch runs the rls binary bin with args, env added to the process environment, and stops
// it when the test ends. It returns once rls has logged "rls serving", with the addresses that
// line reports; it fails the test when rls exits before or does not serve within 30 s.
func Launch(t testing.TB, bin string, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{out: &Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.exitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.Stop(t) })
	p.await(t, "serving", func() bool {
		addrs := ServingAddrs(p.out.String())
		if len(addrs) == 0 {
			return false
		}
		p.GRPCAddr, p.HTTPAddr, p.DebugAddr = addrs["grpc"], addrs["http"], addrs["debug_http"]
		return true
	})
	return p
}

// WaitReady waits until /readyz answers 200; it fails the test when rls exits before or is not
// ready within 30 s.
func (p *Proc) WaitReady(t testing.TB) {
	t.Helper()
	p.await(t, "ready", p.ready)
}

// await polls cond until it holds, failing the test when the process exits first or after 30 s.
func (p *Proc) await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("rls exited early: %v\n%s", p.exitErr, p.out.String())
		default:
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rls not %s after 30s\n%s", what, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Proc) ready() bool {
	if p.HTTPAddr == "" {
		return false
	}
	c := http.Client{Timeout: time.Second}
	scheme := "http"
	if p.httpTLS {
		// As a kubelet's probe: over TLS, the server's certificate not verified.
		scheme = "https"
		c.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	}
	resp, err := c.Get(scheme + "://" + p.HTTPAddr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Done is closed once the process has exited; ExitErr then says how.
func (p *Proc) Done() <-chan struct{} { return p.done }

// ExitErr is the process's exit error (nil for a zero exit), once Done is closed.
func (p *Proc) ExitErr() error {
	<-p.done
	return p.exitErr
}

// Pause stops the process with SIGSTOP: it keeps its sockets open and answers nothing, like a
// process stalled by its host, until Resume.
func (p *Proc) Pause(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	p.stopped = true
	// The signal is delivered asynchronously: wait until every thread is stopped, so that no
	// call made after Pause returns is answered.
	deadline := time.Now().Add(10 * time.Second)
	for !p.allStopped() {
		if time.Now().After(deadline) {
			t.Fatal("rls did not stop within 10s of SIGSTOP")
		}
		time.Sleep(time.Millisecond)
	}
}

// allStopped reports whether every thread of the process is in state T (stopped), as Linux's
// /proc shows it; elsewhere it reports true at once.
func (p *Proc) allStopped() bool {
	dir := fmt.Sprintf("/proc/%d/task", p.cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			continue
		}
		// The state follows the command name, which is in parentheses and may hold spaces.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}

// Resume continues a paused process with SIGCONT.
func (p *Proc) Resume(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resumeLocked()
}

func (p *Proc) resumeLocked() {
	if p.stopped {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		p.stopped = false
	}
}

// Stop resumes the process if paused, sends SIGTERM and waits for it to exit; it fails the test
// when rls does not exit within 20 s or exits non-zero. Stopping twice is a no-op.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	p.mu.Lock()
	p.resumeLocked()
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Errorf("rls did not stop within 20s after SIGTERM\n%s", p.out.String())
		return
	}
	if p.exitErr != nil {
		t.Errorf("rls exited with %v\n%s", p.exitErr, p.out.String())
	}
}

// Output is what the process has printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Pid is the process's id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Memory reads the process's resident set size now and its peak (VmRSS and VmHWM of
// /proc/PID/status), in bytes.
func (p *Proc) Memory(t testing.TB) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		var kb int64
		if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err != nil {
			t.Fatalf("/proc/%d/status: %s: %v", p.Pid(), line, err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return rss, peak
}

// ResetPeakMemory sets the process's peak resident set size (VmHWM) to its size now, so that
// a later Memory reports the peak since.
func (p *Proc) ResetPeakMemory(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.Pid()), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
}

// CounterValue reads a Prometheus counter of this process.
func CounterValue(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
