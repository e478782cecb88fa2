// Package integration runs the real rls binary over real gRPC and HTTP.
package integration

import (
	"bytes"
	"context"
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

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// repoRoot is the module root, one level above this package.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// rlsBinary builds cmd/rls once per test run and returns its path.
func rlsBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rls-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "rls")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/rls")...)
		cmd.Dir = repoRoot()
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/rls: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// rlsProc is one running rls process.
type rlsProc struct {
	GRPCAddr  string
	HTTPAddr  string // host:port
	DebugAddr string // host:port of the debug listener; "" when args turned it off
	cmd       *exec.Cmd
	out       *syncBuffer
	done      chan struct{}
	exitErr   error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRLS starts the rls binary with args (plus --grpc-addr, --http-addr and --debug-addr on
// loopback port 0 unless args set them, the ports rls then reports having bound), waits until
// /readyz answers 200 and stops the process when the test ends. env is added to the process
// environment. Port 0 leaves the choice to the kernel at bind time: a port picked free
// beforehand may be taken by another test's server before rls binds it.
func startRLS(t testing.TB, env []string, args ...string) *rlsProc {
	t.Helper()
	p := launchRLS(t, env, args...)
	p.waitReady(t)
	return p
}

// launchRLS is startRLS without waiting for readiness: it returns once rls serves.
func launchRLS(t testing.TB, env []string, args ...string) *rlsProc {
	t.Helper()
	bin := rlsBinary(t)
	p := &rlsProc{out: &syncBuffer{}, done: make(chan struct{})}
	joined := strings.Join(args, " ")
	wanted := map[string]*string{}
	for flag, addr := range map[string]*string{"--grpc-addr": &p.GRPCAddr, "--http-addr": &p.HTTPAddr, "--debug-addr": &p.DebugAddr} {
		if !strings.Contains(joined, flag) {
			args = append(args, flag, "127.0.0.1:0")
			wanted[flag] = addr
		}
	}
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("rls exited early: %v\n%s", p.exitErr, p.out.String())
		default:
		}
		if len(wanted) > 0 {
			p.boundAddrs(wanted)
		}
		if len(wanted) == 0 && strings.Contains(p.out.String(), "rls serving") {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("rls not serving after 30s\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReady waits until /readyz answers 200.
func (p *rlsProc) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("rls exited early: %v\n%s", p.exitErr, p.out.String())
		default:
		}
		if p.HTTPAddr != "" {
			resp, err := http.Get("http://" + p.HTTPAddr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rls not ready after 30s\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// servingAddr matches an address in rls's "rls serving" log line, text or JSON.
var servingAddr = regexp.MustCompile(`"?(grpc|http|debug_http)"?[=:]"?(127\.0\.0\.1:[0-9]+)`)

// boundAddrs fills the addresses wanted (by flag) from the "rls serving" line once it is out,
// removing each it found.
func (p *rlsProc) boundAddrs(wanted map[string]*string) {
	for _, line := range strings.Split(p.out.String(), "\n") {
		if !strings.Contains(line, "rls serving") {
			continue
		}
		for _, m := range servingAddr.FindAllStringSubmatch(line, -1) {
			flag := map[string]string{"grpc": "--grpc-addr", "http": "--http-addr", "debug_http": "--debug-addr"}[m[1]]
			if addr, ok := wanted[flag]; ok {
				*addr = m[2]
				delete(wanted, flag)
			}
		}
	}
}

// Stop sends SIGTERM and waits for the process to exit; it fails the test on a non-zero exit.
func (p *rlsProc) Stop(t testing.TB) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
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
func (p *rlsProc) Output() string { return p.out.String() }

// client dials the process over gRPC.
func (p *rlsProc) client(t testing.TB) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// writeRules writes files (name → content) into a new directory and returns it.
func writeRules(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
