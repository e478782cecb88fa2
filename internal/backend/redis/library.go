package redis

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// libraryUse is how script calls go: as FCALL while every master holds the library of Redis
// Functions (see librarySource), as EVALSHA otherwise. It is one part, shared by the backend and
// its nodes: a node's send path reads fcall and tells the library what a call found; the library
// loads itself again in the background through loadAll, which the backend hands it (the single
// node's probe, or the Cluster's masters).
type libraryUse struct {
	fcall          atomic.Bool  // calls go as FCALL: every master holds the library
	evalOnly       bool         // tests: calls stay on EVALSHA
	libraryRefused atomic.Bool  // for good: calls stay on EVALSHA
	libraryNext    atomic.Int64 // mono: no background load before
	reloading      atomic.Bool

	mono    func() int64
	log     *slog.Logger
	work    *background   // where background loads run, until Close
	timeout time.Duration // of one background load
	// loadAll loads the script and the library into every master that answers, on the probe's
	// connections (see load), wanting the library or not.
	loadAll func(ctx context.Context, wanted bool) (loaded bool, refusal error, err error)
}

// libraryWanted says whether calls should go by the library: not in tests that keep to
// EVALSHA, nor once Redis refused it for good.
func (l *libraryUse) libraryWanted() bool { return !l.evalOnly && !l.libraryRefused.Load() }

// useLibrary records what load found: calls go as FCALL when every master holds the library;
// otherwise it is loaded again after libraryRetry, unless it was refused for good.
func (l *libraryUse) useLibrary(loaded bool, refusal error) {
	if refusal != nil {
		l.refuseLibrary(refusal)
		return
	}
	if !loaded {
		l.libraryNext.Store(l.mono() + int64(libraryRetry))
	}
	l.fcall.Store(loaded && l.libraryWanted())
}

// refuseLibrary keeps calls on EVALSHA until the process ends, and says why once.
func (l *libraryUse) refuseLibrary(why error) {
	l.fcall.Store(false)
	if !l.libraryRefused.Swap(true) {
		l.log.Info("redis: Redis Functions refused; deciding with EVALSHA", "err", why)
	}
}

// reloadLibrary loads the library in the background, once at a time and not after Close: after
// a call found it missing, or libraryRetry after a load that failed. Calls go as EVALSHA
// meanwhile.
func (l *libraryUse) reloadLibrary() {
	l.fcall.Store(false)
	l.libraryNext.Store(l.mono() + int64(libraryRetry))
	if !l.reloading.CompareAndSwap(false, true) {
		return
	}
	started := l.work.spawn(func(ctx context.Context) {
		defer l.reloading.Store(false)
		ctx, cancel := context.WithTimeout(ctx, l.timeout)
		defer cancel()
		loaded, refusal, err := l.loadAll(ctx, l.libraryWanted())
		if err != nil {
			l.log.Debug("redis: loading the library failed; calls go by EVALSHA until it loads", "err", err)
			return
		}
		l.useLibrary(loaded, refusal)
	})
	if !started {
		l.reloading.Store(false)
	}
}

// loadMasters loads the script and the library into the masters of the slot map, each on its
// own probe connection, leaving out those that are down (their breakers' probes load them on
// their return).
func (t *clusterTopo) loadMasters(ctx context.Context, wanted bool) (loaded bool, refusal error, err error) {
	m := t.Load()
	if m == nil {
		return false, nil, errNoSlotMap
	}
	type result struct {
		loaded  bool
		refusal error
		err     error
	}
	results := make([]result, len(m.masters))
	var wg sync.WaitGroup
	for i, n := range m.masters {
		if !n.br.allow() {
			results[i].loaded = true
			continue
		}
		wg.Go(func() {
			r := &results[i]
			r.loaded, r.refusal, r.err = load(ctx, n.probe, wanted)
		})
	}
	wg.Wait()
	loaded = wanted
	for _, r := range results {
		loaded = loaded && r.loaded
		if refusal == nil {
			refusal = r.refusal
		}
		if err == nil {
			err = r.err
		}
	}
	return loaded, refusal, err
}
