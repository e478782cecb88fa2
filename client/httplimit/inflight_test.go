package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/httplimit"
)

// slots is a client.Acquirer playing rls's concurrency limit of max slots.
type slots struct {
	mu                 sync.Mutex
	max, held          int
	acquired, releases int
	checks             int
}

func (s *slots) Check(ctx context.Context, descs ...client.Descriptor) (client.Decision, error) {
	s.mu.Lock()
	s.checks++
	s.mu.Unlock()
	return client.NewDecision(client.Status{Descriptor: descs[0]}), nil
}

func (s *slots) Acquire(ctx context.Context, descs ...client.Descriptor) (client.Decision, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held >= s.max {
		return client.NewDecision(client.Status{Descriptor: descs[0], OverLimit: true}), func() {}, nil
	}
	s.held++
	s.acquired++
	var once sync.Once
	return client.NewDecision(client.Status{Descriptor: descs[0]}), func() {
		once.Do(func() {
			s.mu.Lock()
			s.held--
			s.releases++
			s.mu.Unlock()
		})
	}, nil
}

func (s *slots) state() (held, acquired, releases int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held, s.acquired, s.releases
}

// TestInFlight: with Options.InFlight a request holds its slot while its handler runs, a
// request past the limit is denied 429, and the slot is released when the handler returns,
// when it panics, and when the request's context is cancelled.
func TestInFlight(t *testing.T) {
	t.Parallel()
	s := &slots{max: 1}
	lim := httplimit.New(s, httplimit.Options{InFlight: true})
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	mode := "block"
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode {
		case "block":
			entered <- struct{}{}
			<-release
		case "panic":
			panic("handler failed")
		case "cancel":
			entered <- struct{}{}
			<-r.Context().Done()
		}
	}), httplimit.By(httplimit.Static("generic_key", "llm")))

	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}()
	<-entered
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("second in flight: %d, want 429", w.Code)
	}
	close(release)
	<-done
	if held, acquired, releases := s.state(); held != 0 || acquired != 1 || releases != 1 {
		t.Fatalf("after the handler returned: held %d, acquired %d, released %d", held, acquired, releases)
	}

	mode = "panic"
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not reach the server")
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}()
	if held, _, _ := s.state(); held != 0 {
		t.Fatal("a panicking handler kept its slot")
	}

	mode = "cancel"
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	}()
	<-entered
	cancel()
	<-done
	if held, acquired, releases := s.state(); held != 0 || acquired != 3 || releases != 3 {
		t.Fatalf("after cancellation: held %d, acquired %d, released %d", held, acquired, releases)
	}
	if s.checks != 0 {
		t.Fatal("Check asked under InFlight")
	}
}

// TestInFlightNeedsAcquirer: InFlight with a Checker that cannot hold slots is refused at New.
func TestInFlightNeedsAcquirer(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted InFlight with a CheckerFunc")
		}
	}()
	httplimit.New(client.CheckerFunc(func(context.Context, ...client.Descriptor) (client.Decision, error) {
		return client.Decision{}, nil
	}), httplimit.Options{InFlight: true})
}
