package reload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	// fsnotify is the maintained cross-platform wrapper of inotify (Linux), kqueue (BSD, macOS),
	// ReadDirectoryChangesW (Windows) and FEN (illumos); the standard library has none of them.
	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is the debounce when Options.Debounce is zero: it spans an editor's save and
// a ConfigMap update, which are a handful of events within milliseconds, and is short enough that
// an operator sees a change in force at once.
const DefaultDebounce = 200 * time.Millisecond

// Options configures a Watcher.
type Options struct {
	// Path is the rule file or directory. Empty watches nothing: only Signals reload.
	Path string
	// Debounce is how long the files must stay quiet before a reload; zero means DefaultDebounce.
	Debounce time.Duration
	// Signals reload at once, without the debounce; nil means none.
	Signals <-chan os.Signal
	// Apply loads the whole rule set and swaps it in, or keeps the running one and returns why.
	// It logs its own result; the Watcher logs only trouble with watching.
	Apply func() error
	// Log defaults to slog.Default().
	Log *slog.Logger
}

// Watcher reloads rules when they change. Create it with New and run it with Run.
type Watcher struct {
	path     string // absolute; empty when nothing is watched
	debounce time.Duration
	signals  <-chan os.Signal
	apply    func() error
	log      *slog.Logger
	fsw      *fsnotify.Watcher // nil when nothing is watched
	dirs     map[string]watched
}

// watched is one watched directory: which of its entries matter, and the directory as it was
// when the watch was added, to tell when the path names another directory since.
type watched struct {
	rules bool            // every rule file
	names map[string]bool // these entries
	info  os.FileInfo     // nil when the watch could not be added
}

// New returns a Watcher for opts. The watches are in place when New returns, so a change made
// after that is seen. When the path cannot be watched New logs why and returns a Watcher that
// reloads on Signals only; it fails only for invalid options. Run must be called to release the
// watches.
func New(opts Options) (*Watcher, error) {
	if opts.Apply == nil {
		return nil, errors.New("reload: Options.Apply is nil")
	}
	if opts.Debounce < 0 {
		return nil, fmt.Errorf("reload: debounce %v must not be negative", opts.Debounce)
	}
	if opts.Debounce == 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	w := &Watcher{debounce: opts.Debounce, signals: opts.Signals, apply: opts.Apply, log: opts.Log}
	if opts.Path == "" {
		return w, nil
	}
	path, err := filepath.Abs(opts.Path)
	if err == nil {
		w.fsw, err = fsnotify.NewWatcher()
	}
	if err != nil {
		w.log.Warn("rules not watched; SIGHUP reloads them", "rules", opts.Path, "err", err)
		return w, nil
	}
	w.path = path
	w.rewatch()
	return w, nil
}

// Run reloads on changes and signals until ctx ends, then releases the watches. Reloads run in
// the calling goroutine, one at a time.
func (w *Watcher) Run(ctx context.Context) {
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w.fsw != nil {
		defer w.fsw.Close()
		events, errs = w.fsw.Events, w.fsw.Errors
	}
	debounce := time.NewTimer(w.debounce)
	debounce.Stop()
	defer debounce.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// Permission and timestamp changes alone do not change rules; some tools
			// (indexers, virus scanners) make many.
			if ev.Op == fsnotify.Chmod || !w.relevant(ev.Name) {
				continue
			}
			debounce.Reset(w.debounce)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.log.Warn("watching rules", "rules", w.path, "err", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) { // events were lost: one may be a change
				debounce.Reset(w.debounce)
			}
		case <-debounce.C:
			w.reload("change")
		case <-w.signals:
			// This reload reads what any pending one would.
			debounce.Stop()
			w.reload("signal")
		}
	}
}

func (w *Watcher) reload(cause string) {
	if w.fsw != nil {
		w.rewatch()
	}
	w.log.Debug("reloading rules", "cause", cause)
	_ = w.apply() // Apply logs its own result
}

// relevant reports whether an event on name may change the rules.
func (w *Watcher) relevant(name string) bool {
	if _, ok := w.dirs[name]; ok { // a watched directory itself: removed or renamed
		return true
	}
	d, ok := w.dirs[filepath.Dir(name)]
	if !ok {
		return false
	}
	base := filepath.Base(name)
	// ".." names are the kubelet's ConfigMap machinery (..data, ..data_tmp, ..2026_…).
	return strings.HasPrefix(base, "..") || d.names[base] || d.rules && isRuleFile(base)
}

// isRuleFile reports whether descriptors.Load reads a directory entry named name. Others, such
// as editors' swap and backup files, would otherwise reload on every keystroke.
func isRuleFile(name string) bool {
	return !strings.HasPrefix(name, ".") && (strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"))
}

// rewatch points the watches at what the path names now: a directory that was replaced, or that
// a swapped symlink now points to, is another inode, which the old watch does not see.
func (w *Watcher) rewatch() {
	want := wantWatched(w.path)
	for dir, old := range w.dirs {
		if _, ok := want[dir]; !ok && old.info != nil {
			w.unwatch(dir)
		}
	}
	for dir, d := range want {
		info, err := os.Stat(dir)
		if err != nil {
			w.log.Warn("watching rules", "rules", w.path, "err", err)
			continue
		}
		if old := w.dirs[dir]; old.info != nil {
			if os.SameFile(old.info, info) {
				d.info = old.info
				want[dir] = d
				continue
			}
			w.unwatch(dir)
		}
		if err := w.fsw.Add(dir); err != nil {
			w.log.Warn("watching rules", "rules", w.path, "err", err)
			continue
		}
		d.info = info
		want[dir] = d
	}
	w.dirs = want
}

func (w *Watcher) unwatch(dir string) {
	// The watch is already gone when the directory was deleted.
	if err := w.fsw.Remove(dir); err != nil && !errors.Is(err, fsnotify.ErrNonExistentWatch) {
		w.log.Warn("watching rules", "rules", w.path, "err", err)
	}
}

// wantWatched returns the directories to watch for path, an absolute rule file or directory
// (which may not exist yet), with the entries of each that matter.
func wantWatched(path string) map[string]watched {
	dirs := map[string]watched{}
	add := func(dir, name string, rules bool) {
		d := dirs[dir]
		if d.names == nil {
			d.names = map[string]bool{}
		}
		d.rules = d.rules || rules
		if name != "" {
			d.names[name] = true
		}
		dirs[dir] = d
	}
	parent := filepath.Dir(path)
	if info, err := os.Stat(path); err == nil && info.IsDir() {
		add(path, "", true)
		if parent != path {
			add(parent, filepath.Base(path), false)
		}
		return dirs
	}
	add(parent, filepath.Base(path), false)
	if real, err := filepath.EvalSymlinks(path); err == nil && filepath.Dir(real) != parent {
		add(filepath.Dir(real), filepath.Base(real), false)
	}
	return dirs
}
