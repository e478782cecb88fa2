package grpclimit_test

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/grpclimit"
)

// slots is a client.Acquirer playing rls's concurrency limit of max slots.
type slots struct {
	mu                 sync.Mutex
	max, held          int
	acquired, releases int
}

func (s *slots) Check(ctx context.Context, descs ...client.Descriptor) (client.Decision, error) {
	panic("Check asked under InFlight")
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

// stream is a grpc.ServerStream of a context, whose headers go nowhere.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s stream) Context() context.Context     { return s.ctx }
func (s stream) SetHeader(metadata.MD) error  { return nil }
func (s stream) SendHeader(metadata.MD) error { return nil }
func (s stream) SetTrailer(metadata.MD)       {}

// TestInFlight: with Options.InFlight a call holds its slot while its handler runs, a call past
// the limit ends RESOURCE_EXHAUSTED, and the slot is released when the handler returns, panics,
// or the call is cancelled; for unary calls and streams alike.
func TestInFlight(t *testing.T) {
	t.Parallel()
	s := &slots{max: 1}
	lim := grpclimit.New(s, grpclimit.Options{InFlight: true}, grpclimit.By(grpclimit.Method()))
	unary, streamed := lim.Unary(), lim.Stream()
	info := &grpc.UnaryServerInfo{FullMethod: "/llm.Chat/Complete"}
	sinfo := &grpc.StreamServerInfo{FullMethod: "/llm.Chat/Stream"}
	ctx := context.Background()

	entered, leave := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := unary(ctx, nil, info, func(ctx context.Context, req any) (any, error) {
			close(entered)
			<-leave
			return nil, nil
		})
		done <- err
	}()
	<-entered
	if _, err := unary(ctx, nil, info, func(context.Context, any) (any, error) { return nil, nil }); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second in flight: %v, want RESOURCE_EXHAUSTED", err)
	}
	if err := streamed(nil, stream{ctx: ctx}, sinfo, func(any, grpc.ServerStream) error { return nil }); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream while the slot is held: %v, want RESOURCE_EXHAUSTED", err)
	}
	close(leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	func() {
		defer func() { recover() }()
		unary(ctx, nil, info, func(context.Context, any) (any, error) { panic("handler failed") })
	}()
	if held, _, _ := s.state(); held != 0 {
		t.Fatal("a panicking handler kept its slot")
	}

	cctx, cancel := context.WithCancel(ctx)
	entered = make(chan struct{})
	go func() {
		done <- streamed(nil, stream{ctx: cctx}, sinfo, func(_ any, ss grpc.ServerStream) error {
			close(entered)
			<-ss.Context().Done()
			return ss.Context().Err()
		})
	}()
	<-entered
	cancel()
	<-done
	if held, acquired, releases := s.state(); held != 0 || acquired != 3 || releases != 3 {
		t.Fatalf("held %d, acquired %d, released %d; want every slot released", held, acquired, releases)
	}
}
