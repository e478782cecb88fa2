// Package breaker is a circuit breaker: after a number of consecutive failures it opens, and
// callers fail fast instead of waiting on a service that is down; a probe then tries the
// service every cooldown and closes the breaker at its first success. It knows nothing of what
// it guards: the probe and the change callback are its caller's.
package breaker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Breaker is a circuit breaker. It is safe for concurrent use.
type Breaker struct {
	threshold int64
	cooldown  time.Duration
	probe     func(ctx context.Context) error
	onChange  func(healthy bool, cause error)

	open     atomic.Bool
	failures atomic.Int64

	mu      sync.Mutex // guards stopped and the probe goroutine's start
	stopped bool
	stop    chan struct{}
	wg      sync.WaitGroup
}

// New returns a closed breaker that opens after threshold consecutive failures. While open,
// probe runs every cooldown (with a timeout of the cooldown, at least a second) until it
// succeeds, which closes the breaker. onChange, when not nil, is told every change, with the
// failure that opened it; it runs under the breaker's lock and must not call Trip.
func New(threshold int, cooldown time.Duration, probe func(context.Context) error, onChange func(healthy bool, cause error)) *Breaker {
	return &Breaker{threshold: int64(threshold), cooldown: cooldown, probe: probe, onChange: onChange, stop: make(chan struct{})}
}

// Allow reports whether a call may go to the service: the breaker is closed.
func (br *Breaker) Allow() bool { return !br.open.Load() }

// Success counts a call the service answered: the consecutive failures start over.
func (br *Breaker) Success() {
	if br.failures.Load() != 0 {
		br.failures.Store(0)
	}
}

// Failure counts a failure of the service; cause says what failed.
func (br *Breaker) Failure(cause error) {
	if br.failures.Add(1) >= br.threshold {
		br.Trip(cause)
	}
}

// Trip opens the breaker and starts probing, unless it is open already or closed for good.
func (br *Breaker) Trip(cause error) {
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.stopped || !br.open.CompareAndSwap(false, true) {
		return
	}
	if br.onChange != nil {
		br.onChange(false, cause)
	}
	br.wg.Add(1)
	go br.probeLoop()
}

func (br *Breaker) probeLoop() {
	defer br.wg.Done()
	t := time.NewTimer(br.cooldown)
	defer t.Stop()
	for {
		select {
		case <-br.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(br.cooldown, time.Second))
		err := br.probe(ctx)
		cancel()
		if err == nil {
			br.mu.Lock()
			br.failures.Store(0)
			br.open.Store(false)
			if br.onChange != nil && !br.stopped {
				br.onChange(true, nil)
			}
			br.mu.Unlock()
			return
		}
		t.Reset(br.cooldown)
	}
}

// Close stops the probe and waits for it; the breaker never opens again.
func (br *Breaker) Close() {
	br.mu.Lock()
	if !br.stopped {
		br.stopped = true
		close(br.stop)
	}
	br.mu.Unlock()
	br.wg.Wait()
}
