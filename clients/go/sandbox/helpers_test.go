package sandbox

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// openTestSandbox returns a Sandbox connected (without Kubernetes) to base, as if Open had succeeded:
// router headers on for the legacy runtime when router is true.
func openTestSandbox(t *testing.T, opts Options, base string, router bool, proc processv1.ProcessServiceClient) *Sandbox {
	t.Helper()
	opts.Quiet = true
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		t.Fatalf("options: %v", err)
	}
	s := newSandbox(opts, nil)
	s.http.sleep = func(ctx context.Context, d time.Duration) error { return ctx.Err() }
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	s.claimName, s.sandboxName = "claim-1", "sbx-1"
	s.info = sandboxInfo{podName: "sbx-1", podIP: "10.1.2.3"}
	ep := newEndpoint(router, "sbx-1", opts.Namespace, opts.ServerPort, "10.1.2.3")
	ep.restBase = u
	ep.sendHeaders = router
	s.conn = newLiveConn(ep)
	s.conn.proc = proc
	return s
}

// recordedSleeps replaces the sandbox's sleep with one that records the waits and returns at once.
func recordedSleeps(s *Sandbox) *[]time.Duration {
	var mu sync.Mutex
	waits := []time.Duration{}
	s.http.sleep = func(ctx context.Context, d time.Duration) error {
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return ctx.Err()
	}
	s.http.jitter = func() float64 { return 0.5 } // no jitter
	return &waits
}

// startGRPC serves srv on a loopback port and returns a client for it.
func startGRPC(t *testing.T, srv processv1.ProcessServiceServer) processv1.ProcessServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	processv1.RegisterProcessServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return processv1.NewProcessServiceClient(conn)
}

func newServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
