package sandbox

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// Probe of December 6: on sandboxd, Close and Disconnect closed the gRPC connection before they let calls in
// flight finish, so a Run in flight failed at once with an untyped "grpc: the client connection is closing"
// (codes.Canceled) that matched no sentinel; on the legacy runtime Close waited and the Run finished.

// slowExecute answers Execute after delay, or fails with its context.
type slowExecute struct {
	processv1.UnimplementedProcessServiceServer
	delay time.Duration
}

func (f *slowExecute) Execute(ctx context.Context, req *processv1.ExecuteRequest) (*processv1.ExecuteResponse, error) {
	select {
	case <-time.After(f.delay):
		return &processv1.ExecuteResponse{Stdout: []byte("done")}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// grpcHandle is a sandboxd handle whose transport owns a real gRPC connection to srv (as connect makes it).
func grpcHandle(t *testing.T, srv processv1.ProcessServiceServer, cleanup time.Duration) *Sandbox {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	processv1.RegisterProcessServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	s := openTestSandbox(t, Options{Runtime: RuntimeSandboxd, CleanupTimeout: cleanup}, "http://127.0.0.1:1", false,
		processv1.NewProcessServiceClient(conn))
	s.conn.grpcConn = conn
	s.claimName = "" // nothing to delete in these tests
	return s
}

func runDuring(t *testing.T, s *Sandbox, end func() error) (*ExecutionResult, time.Duration, error) {
	t.Helper()
	type out struct {
		res *ExecutionResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := s.Run(context.Background(), "sleep 1")
		done <- out{res, err}
	}()
	time.Sleep(150 * time.Millisecond) // the Run is in flight
	start := time.Now()
	if err := end(); err != nil {
		t.Errorf("close: %v", err)
	}
	took := time.Since(start)
	select {
	case o := <-done:
		return o.res, took, o.err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	return nil, 0, nil
}

func TestCloseLetsASandboxdRunInFlightFinish(t *testing.T) {
	s := grpcHandle(t, &slowExecute{delay: 600 * time.Millisecond}, 10*time.Second)
	res, _, err := runDuring(t, s, func() error { return s.Close(context.Background()) })
	if err != nil || res.Stdout != "done" {
		t.Errorf("Run in flight during Close = %+v, %v; want it to finish", res, err)
	}
}

func TestDisconnectLetsASandboxdRunInFlightFinish(t *testing.T) {
	s := grpcHandle(t, &slowExecute{delay: 600 * time.Millisecond}, 10*time.Second)
	res, _, err := runDuring(t, s, func() error { return s.Disconnect(context.Background()) })
	if err != nil || res.Stdout != "done" {
		t.Errorf("Run in flight during Disconnect = %+v, %v; want it to finish", res, err)
	}
}

// A call still in flight after the drain (CleanupTimeout/2) is cut, with ErrNotReady naming why.
func TestACallCutByCloseIsErrNotReady(t *testing.T) {
	s := grpcHandle(t, &slowExecute{delay: time.Hour}, 600*time.Millisecond)
	_, took, err := runDuring(t, s, func() error { return s.Close(context.Background()) })
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, ErrTransportClosed) {
		t.Errorf("Run cut by Close = %v; want ErrNotReady (ErrTransportClosed)", err)
	}
	if took < 250*time.Millisecond {
		t.Errorf("Close cut the call after %v; want the drain (CleanupTimeout/2) first", took)
	}
}
