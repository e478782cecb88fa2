package reload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// testDebounce is short so the tests are quick; waits are many times longer, so a slow machine
// does not fail them.
const testDebounce = 50 * time.Millisecond

// waitFor is how long a test waits for a reload it expects.
const waitFor = 10 * time.Second

// recorder is an Apply that records what the rules at path read when it ran.
type recorder struct {
	t       *testing.T
	path    string
	loads   chan string
	running atomic.Int32
	overlap atomic.Bool // two Applies ran at once
	hold    time.Duration
}

func newRecorder(t *testing.T, path string) *recorder {
	return &recorder{t: t, path: path, loads: make(chan string, 1000)}
}

func (r *recorder) apply() error {
	if r.running.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.running.Add(-1)
	time.Sleep(r.hold)
	got := readRules(r.path)
	r.loads <- got
	if strings.Contains(got, "invalid") {
		return fmt.Errorf("%s: invalid", r.path)
	}
	return nil
}

// readRules reads a rule file, or a directory's rule files in name order, following symlinks.
func readRules(path string) string {
	info, err := os.Stat(path)
	if err != nil {
		return "error: " + err.Error()
	}
	if !info.IsDir() {
		b, err := os.ReadFile(path)
		if err != nil {
			return "error: " + err.Error()
		}
		return string(b)
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return "error: " + err.Error()
	}
	var parts []string
	for _, e := range entries {
		if !isRuleFile(e.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(path, e.Name()))
		if err != nil {
			return "error: " + err.Error()
		}
		parts = append(parts, string(b))
	}
	return strings.Join(parts, "+")
}

// until waits for a load that read want, and returns how many loads came before it.
func (r *recorder) until(want string) int {
	r.t.Helper()
	timeout := time.After(waitFor)
	var seen []string
	for {
		select {
		case got := <-r.loads:
			if got == want {
				return len(seen)
			}
			seen = append(seen, got)
		case <-timeout:
			r.t.Fatalf("no reload read %q within %v; loads read %q", want, waitFor, seen)
		}
	}
}

// none fails if a load happens within d.
func (r *recorder) none(d time.Duration, why string) {
	r.t.Helper()
	select {
	case got := <-r.loads:
		r.t.Fatalf("%s: a reload read %q", why, got)
	case <-time.After(d):
	}
}

// run starts a Watcher for opts and stops it when the test ends, failing the test if Run does
// not return.
func run(t *testing.T, opts Options) *Watcher {
	t.Helper()
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	w, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		w.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
	return w
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replace writes content to a temporary file next to path and renames it over path, as editors
// that save atomically do.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	write(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// configMap lays out dir as the kubelet lays out a ConfigMap volume holding files: each file a
// symlink through ..data into a timestamped directory. Later calls update it as the kubelet does:
// a new timestamped directory, ..data swapped by a rename, the old directory removed.
func configMap(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	stamp := fmt.Sprintf("..2026_11_30_05_00_00.%d", time.Now().UnixNano())
	for name, content := range files {
		write(t, filepath.Join(dir, stamp, name), content)
	}
	symlink(t, stamp, filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); os.IsNotExist(err) {
			symlink(t, filepath.Join("..data", name), filepath.Join(dir, name))
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReloadsOnChange(t *testing.T) {
	tests := []struct {
		name string
		// setup lays out root and returns the path to watch.
		setup func(t *testing.T, root string) string
		// changes are made one after another, each awaited: a reload that reads want.
		changes []func(t *testing.T, root string)
		want    []string
	}{
		{
			name: "file edited in place",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "rules.yaml"), "v1")
				return filepath.Join(root, "rules.yaml")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules.yaml"), "v2") },
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules.yaml"), "v3") },
			},
			want: []string{"v2", "v3"},
		},
		{
			name: "file replaced by rename, then edited in place",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "rules.yaml"), "v1")
				return filepath.Join(root, "rules.yaml")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) { replace(t, filepath.Join(root, "rules.yaml"), "v2") },
				func(t *testing.T, root string) { replace(t, filepath.Join(root, "rules.yaml"), "v3") },
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules.yaml"), "v4") },
			},
			want: []string{"v2", "v3", "v4"},
		},
		{
			name: "file removed, then written again",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "rules.yaml"), "v1")
				return filepath.Join(root, "rules.yaml")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) { os.Remove(filepath.Join(root, "rules.yaml")) },
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules.yaml"), "v2") },
			},
			want: []string{"error: stat " + "ROOT/rules.yaml: no such file or directory", "v2"},
		},
		{
			name: "file behind a symlink into another directory, edited in place",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "real", "rules.yaml"), "v1")
				symlink(t, filepath.Join(root, "real", "rules.yaml"), filepath.Join(root, "rules.yaml"))
				return filepath.Join(root, "rules.yaml")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) { write(t, filepath.Join(root, "real", "rules.yaml"), "v2") },
			},
			want: []string{"v2"},
		},
		{
			name: "directory: files edited, added, replaced and removed",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "rules", "a.yaml"), "a1")
				return filepath.Join(root, "rules")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules", "a.yaml"), "a2") },
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules", "b.yml"), "b1") },
				func(t *testing.T, root string) { replace(t, filepath.Join(root, "rules", "b.yml"), "b2") },
				func(t *testing.T, root string) { os.Remove(filepath.Join(root, "rules", "a.yaml")) },
			},
			want: []string{"a2", "a2+b1", "a2+b2", "b2"},
		},
		{
			name: "ConfigMap directory: ..data swapped",
			setup: func(t *testing.T, root string) string {
				configMap(t, filepath.Join(root, "rules"), map[string]string{"api.yaml": "api1", "web.yaml": "web1"})
				return filepath.Join(root, "rules")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) {
					configMap(t, filepath.Join(root, "rules"), map[string]string{"api.yaml": "api2", "web.yaml": "web2"})
				},
				func(t *testing.T, root string) {
					configMap(t, filepath.Join(root, "rules"), map[string]string{"api.yaml": "api3", "web.yaml": "web3"})
				},
			},
			want: []string{"api2+web2", "api3+web3"},
		},
		{
			name: "ConfigMap file: ..data swapped",
			setup: func(t *testing.T, root string) string {
				configMap(t, filepath.Join(root, "rules"), map[string]string{"api.yaml": "api1"})
				return filepath.Join(root, "rules", "api.yaml")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) {
					configMap(t, filepath.Join(root, "rules"), map[string]string{"api.yaml": "api2"})
				},
				func(t *testing.T, root string) {
					configMap(t, filepath.Join(root, "rules"), map[string]string{"api.yaml": "api3"})
				},
			},
			want: []string{"api2", "api3"},
		},
		{
			name: "directory replaced by rename, then its new files edited",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "rules", "a.yaml"), "a1")
				return filepath.Join(root, "rules")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) {
					write(t, filepath.Join(root, "next", "a.yaml"), "a2")
					if err := os.Rename(filepath.Join(root, "rules"), filepath.Join(root, "old")); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(filepath.Join(root, "next"), filepath.Join(root, "rules")); err != nil {
						t.Fatal(err)
					}
				},
				func(t *testing.T, root string) { write(t, filepath.Join(root, "rules", "a.yaml"), "a3") },
			},
			want: []string{"a2", "a3"},
		},
		{
			name: "directory symlink swapped, then its new target edited",
			setup: func(t *testing.T, root string) string {
				write(t, filepath.Join(root, "release1", "a.yaml"), "a1")
				symlink(t, "release1", filepath.Join(root, "rules"))
				return filepath.Join(root, "rules")
			},
			changes: []func(*testing.T, string){
				func(t *testing.T, root string) {
					write(t, filepath.Join(root, "release2", "a.yaml"), "a2")
					symlink(t, "release2", filepath.Join(root, "rules.tmp"))
					if err := os.Rename(filepath.Join(root, "rules.tmp"), filepath.Join(root, "rules")); err != nil {
						t.Fatal(err)
					}
				},
				func(t *testing.T, root string) { write(t, filepath.Join(root, "release2", "a.yaml"), "a3") },
				func(t *testing.T, root string) { write(t, filepath.Join(root, "release2", "b.yaml"), "b1") },
			},
			want: []string{"a2", "a3", "a3+b1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			path := tc.setup(t, root)
			r := newRecorder(t, path)
			run(t, Options{Path: path, Debounce: testDebounce, Apply: r.apply})
			for i, change := range tc.changes {
				change(t, root)
				r.until(strings.ReplaceAll(tc.want[i], "ROOT", root))
			}
		})
	}
}

func TestIgnoresOtherFiles(t *testing.T) {
	tests := []struct {
		name  string
		path  string // relative to the test's directory
		names []string
	}{
		{"directory", "rules", []string{".a.yaml.swp", "a.yaml~", "notes.txt", ".#a.yaml", "4913"}},
		{"file", "rules/a.yaml", []string{"b.yaml", ".a.yaml.swp", "a.yaml~"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			write(t, filepath.Join(root, "rules", "a.yaml"), "a1")
			r := newRecorder(t, filepath.Join(root, tc.path))
			run(t, Options{Path: filepath.Join(root, tc.path), Debounce: testDebounce, Apply: r.apply})
			for _, name := range tc.names {
				write(t, filepath.Join(root, "rules", name), "x")
			}
			if err := os.Chmod(filepath.Join(root, "rules", "a.yaml"), 0o600); err != nil {
				t.Fatal(err)
			}
			r.none(10*testDebounce, "after writing only files that are not rules, and a chmod")
			// The watch works: the same wait catches a real change.
			write(t, filepath.Join(root, "rules", "a.yaml"), "a2")
			if n := r.until("a2"); n != 0 {
				t.Errorf("%d reload(s) before the one for the change", n)
			}
		})
	}
}

func TestDebounceCoalesces(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, dir string, i int)
	}{
		{"in-place writes", func(t *testing.T, dir string, i int) {
			write(t, filepath.Join(dir, "a.yaml"), fmt.Sprint("v", i))
		}},
		{"renames", func(t *testing.T, dir string, i int) {
			replace(t, filepath.Join(dir, "a.yaml"), fmt.Sprint("v", i))
		}},
		{"ConfigMap swaps", func(t *testing.T, dir string, i int) {
			configMap(t, dir, map[string]string{"a.yaml": fmt.Sprint("v", i)})
		}},
	}
	const debounce = 300 * time.Millisecond
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "rules")
			tc.change(t, dir, 0)
			r := newRecorder(t, dir)
			run(t, Options{Path: dir, Debounce: debounce, Apply: r.apply})
			for i := 1; i <= 20; i++ {
				tc.change(t, dir, i)
			}
			if n := r.until("v20"); n != 0 {
				t.Errorf("%d reload(s) before the one that read the last write", n)
			}
			r.none(3*debounce, "after the burst's reload")
		})
	}
}

func TestSignalReloadsAtOnce(t *testing.T) {
	tests := []struct {
		name string
		path string // "" watches nothing; "file" is written in place before the signal
	}{
		{"no path", ""},
		{"path changed within a long debounce", "file"},
		{"path in a directory that does not exist", "missing/rules.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			path := ""
			if tc.path != "" {
				path = filepath.Join(root, tc.path)
			}
			loads := make(chan string, 10)
			apply := func() error {
				loads <- readRules(path)
				return nil
			}
			sig := make(chan os.Signal, 1)
			var logs bytes.Buffer
			var mu sync.Mutex
			run(t, Options{Path: path, Debounce: time.Hour, Signals: sig, Apply: apply,
				Log: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))})
			if tc.path == "file" {
				write(t, path, "v2")
			}
			for i := range 3 {
				start := time.Now()
				sig <- syscall.SIGHUP
				select {
				case got := <-loads:
					if tc.path == "file" && got != "v2" {
						t.Errorf("signal %d: reload read %q, want v2", i+1, got)
					}
				case <-time.After(waitFor):
					t.Fatalf("signal %d: no reload within %v", i+1, waitFor)
				}
				if d := time.Since(start); d > waitFor/2 {
					t.Errorf("signal %d: reload after %v", i+1, d)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.path == "missing/rules.yaml" && !strings.Contains(logs.String(), "no such file") {
				t.Errorf("no warning about the missing path; logs:\n%s", logs.String())
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestMissingPathIsWatchedOnceItAppears(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "rules")
	r := newRecorder(t, dir)
	run(t, Options{Path: dir, Debounce: testDebounce, Apply: r.apply})
	write(t, filepath.Join(root, "rules.new", "a.yaml"), "a1")
	if err := os.Rename(filepath.Join(root, "rules.new"), dir); err != nil {
		t.Fatal(err)
	}
	r.until("a1")
	write(t, filepath.Join(dir, "a.yaml"), "a2")
	r.until("a2")
}

func TestReloadsNeverOverlap(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "v0")
	r := newRecorder(t, dir)
	r.hold = 20 * time.Millisecond
	sig := make(chan os.Signal, 1)
	run(t, Options{Path: dir, Debounce: time.Millisecond, Signals: sig, Apply: r.apply})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 30 {
			sig <- syscall.SIGHUP
		}
	})
	for i := 1; i <= 30; i++ {
		write(t, filepath.Join(dir, "a.yaml"), fmt.Sprint("v", i))
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	r.until("v30")
	if r.overlap.Load() {
		t.Error("two reloads ran at once")
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), "v1")
	var calls atomic.Int32
	w, err := New(Options{Path: dir, Debounce: testDebounce, Apply: func() error { calls.Add(1); return nil },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		w.Run(ctx)
		close(done)
	}()
	write(t, filepath.Join(dir, "a.yaml"), "v2")
	deadline := time.Now().Add(waitFor)
	for calls.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if calls.Load() == 0 {
		t.Fatal("no reload before the context ended")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	before := calls.Load()
	write(t, filepath.Join(dir, "a.yaml"), "v3")
	time.Sleep(5 * testDebounce)
	if n := calls.Load(); n != before {
		t.Errorf("%d reload(s) after Run returned", n-before)
	}
	if got := w.fsw.WatchList(); len(got) != 0 {
		t.Errorf("watches left after Run returned: %q", got)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no apply", Options{}, "Apply is nil"},
		{"negative debounce", Options{Apply: func() error { return nil }, Debounce: -time.Second}, "debounce -1s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestWantWatched(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "dir", "a.yaml"), "")
	write(t, filepath.Join(root, "elsewhere", "r.yaml"), "")
	symlink(t, filepath.Join(root, "elsewhere", "r.yaml"), filepath.Join(root, "dir", "link.yaml"))
	type want struct {
		dir   string
		rules bool
		names []string
	}
	tests := []struct {
		name string
		path string
		want []want
	}{
		{"directory", "dir", []want{{"", false, []string{"dir"}}, {"dir", true, nil}}},
		{"file", "dir/a.yaml", []want{{"dir", false, []string{"a.yaml"}}}},
		{"missing file", "dir/none.yaml", []want{{"dir", false, []string{"none.yaml"}}}},
		{"symlinked file", "dir/link.yaml", []want{{"dir", false, []string{"link.yaml"}}, {"elsewhere", false, []string{"r.yaml"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := wantWatched(filepath.Join(root, tc.path))
			if len(got) != len(tc.want) {
				t.Fatalf("watching %d directories, want %d: %v", len(got), len(tc.want), got)
			}
			for _, w := range tc.want {
				d, ok := got[filepath.Join(root, w.dir)]
				if !ok {
					t.Fatalf("%q not watched: %v", w.dir, got)
				}
				var names []string
				for n := range d.names {
					names = append(names, n)
				}
				slices.Sort(names)
				if d.rules != w.rules || !slices.Equal(names, w.names) {
					t.Errorf("%q: rules %v names %q, want %v %q", w.dir, d.rules, names, w.rules, w.names)
				}
			}
		})
	}
}
