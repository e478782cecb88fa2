package redis

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestSendCtx holds a sendCtx to a deadline's contract through reuse: its done channel closes
// at the deadline and Err says so, a released context's timer closes nothing of the next use,
// and the lead mark is the pipeline's own.
func TestSendCtx(t *testing.T) {
	c := newSendCtx(time.Now().Add(5*time.Millisecond), true)
	if d, ok := c.Deadline(); !ok || d.IsZero() {
		t.Fatal("no deadline")
	}
	if c.Value(leadKey{}) == nil || c.Value("other") != nil {
		t.Fatal("a leader's context does not say so")
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("done did not close at the deadline")
	}
	if c.Err() != context.DeadlineExceeded {
		t.Fatalf("err %v after the deadline", c.Err())
	}
	c.release()

	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 200 {
				// Deadlines just passed, just ahead and far: a timer of an earlier use may fire late.
				d := time.Duration(i%3-1) * time.Millisecond
				if i%5 == 0 {
					d = time.Hour
				}
				c := newSendCtx(time.Now().Add(d), false)
				if c.Value(leadKey{}) != nil {
					t.Error("a follower's context says it leads")
				}
				if d == time.Hour {
					select {
					case <-c.Done():
						t.Error("done closed an hour before its deadline")
					default:
					}
					if c.Err() != nil {
						t.Errorf("err %v an hour before the deadline", c.Err())
					}
				}
				c.release()
			}
		})
	}
	wg.Wait()
}
