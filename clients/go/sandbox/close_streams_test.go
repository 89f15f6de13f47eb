package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// Review of December 6: Close and Disconnect waited their whole drain (CleanupTimeout/2, 15 s by default)
// for a started Process still streaming - it held an in-flight slot until its stream ended - and then cut it
// anyway; EnableAutoCleanup / DeleteAll close handles one after the other. Streams are now ended first
// (ErrNotReady wrapping ErrTransportClosed), and only one-shot calls are drained.

// streamAndSlowRun streams like fakeProcessService and answers Execute after delay.
type streamAndSlowRun struct {
	*fakeProcessService
	delay time.Duration
}

func (f *streamAndSlowRun) Execute(ctx context.Context, req *processv1.ExecuteRequest) (*processv1.ExecuteResponse, error) {
	return (&slowExecute{delay: f.delay}).Execute(ctx, req)
}

func closeWithAStream(t *testing.T, end func(s *Sandbox) error) {
	t.Helper()
	s := grpcHandle(t, &streamAndSlowRun{fakeProcessService: newFakeProcessService(), delay: 400 * time.Millisecond},
		10*time.Second)
	p, err := s.Start(context.Background(), "server")
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := p.Recv(); err != nil || string(ev.Data) != "hello" {
		t.Fatalf("first event = %+v, %v", ev, err)
	}
	readerDone := make(chan error, 1)
	go func() {
		for {
			if _, err := p.Recv(); err != nil {
				readerDone <- err
				return
			}
		}
	}()
	type out struct {
		res *ExecutionResult
		err error
	}
	runDone := make(chan out, 1)
	go func() {
		res, err := s.Run(context.Background(), "sleep")
		runDone <- out{res, err}
	}()
	time.Sleep(100 * time.Millisecond) // both in flight
	start := time.Now()
	if err := end(s); err != nil {
		t.Errorf("close: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("closing with a streaming Process took %v; want the Run's drain only", took)
	}
	select {
	case err := <-readerDone:
		if !errors.Is(err, ErrNotReady) || !errors.Is(err, ErrTransportClosed) {
			t.Errorf("the stream's Recv = %v; want ErrNotReady (ErrTransportClosed)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream's reader did not end")
	}
	if _, err := p.Recv(); !errors.Is(err, ErrTransportClosed) {
		t.Errorf("a later Recv = %v; want the same ErrTransportClosed", err)
	}
	o := <-runDone
	if o.err != nil || o.res.Stdout != "done" {
		t.Errorf("Run in flight = %+v, %v; want it to finish", o.res, o.err)
	}
	s.mu.Lock()
	n, streams := s.inflight, len(s.streams)
	s.mu.Unlock()
	if n != 0 || streams != 0 {
		t.Errorf("in flight after close: %d calls, %d streams", n, streams)
	}
}

func TestCloseEndsStreamsAndDrainsOnlyCalls(t *testing.T) {
	closeWithAStream(t, func(s *Sandbox) error { return s.Close(context.Background()) })
}

func TestDisconnectEndsStreamsAndDrainsOnlyCalls(t *testing.T) {
	closeWithAStream(t, func(s *Sandbox) error { return s.Disconnect(context.Background()) })
}

// A Start that raced Close (its stream opened after Close ended the streams) is ended too.
func TestAStreamStartedDuringCloseIsEnded(t *testing.T) {
	s := grpcHandle(t, newFakeProcessService(), 10*time.Second)
	c, slot, err := s.beginStream()
	if err != nil {
		t.Fatal(err)
	}
	_ = s.Close(context.Background())
	// as Start does it, after Close ended the streams it knew and closed the transport
	p, err := s.startOn(context.Background(), c, "server", &callOptions{}, func() { s.endStream(slot) })
	if err == nil {
		s.attachStream(slot, p)
		if _, err = p.Recv(); err == nil {
			_, err = p.Recv()
		}
	} else {
		err = c.cut(err)
	}
	if !errors.Is(err, ErrTransportClosed) {
		t.Errorf("a stream started during Close = %v; want ErrTransportClosed", err)
	}
}
