// Package integration runs the real rls binary over real gRPC and HTTP.
package integration

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rls-project/rls/internal/rlstest"
)

// repoRoot is the module root, one level above this package.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// rlsBinary builds cmd/rls once per test run, with the race detector when the tests run with
// it, and returns its path.
func rlsBinary(t testing.TB) string {
	t.Helper()
	return rlstest.BuildBinary(t, raceEnabled)
}

// rlsProc is one running rls process.
type rlsProc struct {
	GRPCAddr  string
	HTTPAddr  string // host:port
	DebugAddr string // host:port of the debug listener; "" when args turned it off
	cmd       *exec.Cmd
	out       *rlstest.Buffer
	done      chan struct{}
	exitErr   error
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
	p := &rlsProc{out: &rlstest.Buffer{}, done: make(chan struct{})}
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

// boundAddrs fills the addresses wanted (by flag) from the "rls serving" line once it is out,
// removing each it found.
func (p *rlsProc) boundAddrs(wanted map[string]*string) {
	listener := map[string]string{"--grpc-addr": "grpc", "--http-addr": "http", "--debug-addr": "debug_http"}
	addrs := rlstest.ServingAddrs(p.out.String())
	for flag, addr := range wanted {
		if a, ok := addrs[listener[flag]]; ok {
			*addr = a
			delete(wanted, flag)
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
