package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// breaker is a circuit breaker: after threshold consecutive failures it opens, and calls fail
// fast instead of waiting on a Redis that is down; a background probe then tries Redis every
// cooldown and closes the breaker on the first success. It is safe for concurrent use.
type breaker struct {
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

func newBreaker(threshold int, cooldown time.Duration, probe func(context.Context) error, onChange func(healthy bool, cause error)) *breaker {
	return &breaker{threshold: int64(threshold), cooldown: cooldown, probe: probe, onChange: onChange, stop: make(chan struct{})}
}

// allow reports whether a call may go to Redis.
func (br *breaker) allow() bool { return !br.open.Load() }

func (br *breaker) success() {
	if br.failures.Load() != 0 {
		br.failures.Store(0)
	}
}

// failure counts a failure of Redis; cause says what failed.
func (br *breaker) failure(cause error) {
	if br.failures.Add(1) >= br.threshold {
		br.trip(cause)
	}
}

// trip opens the breaker and starts probing, unless it is open already.
func (br *breaker) trip(cause error) {
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

func (br *breaker) probeLoop() {
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

// close stops the probe and waits for it.
func (br *breaker) close() {
	br.mu.Lock()
	if !br.stopped {
		br.stopped = true
		close(br.stop)
	}
	br.mu.Unlock()
	br.wg.Wait()
}
