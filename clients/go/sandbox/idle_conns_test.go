package sandbox

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is a legacy runtime on 127.0.0.1 that counts its open connections; a read of "slow" sends
// half its body, then the rest once release is closed.
func countingServer(t *testing.T, release <-chan struct{}) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var open atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/download/slow":
			w.Header().Set("Content-Length", "8")
			_, _ = io.WriteString(w, "half")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "done")
		default:
			_, _ = io.WriteString(w, `{"exists": true}`)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &open
}

// concurrentCalls makes n calls at once, so the handle's transport keeps several connections alive.
func concurrentCalls(t *testing.T, s *Sandbox, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, err := s.Exists(context.Background(), "f"); err != nil || !ok {
				t.Errorf("Exists = %v, %v", ok, err)
			}
		}()
	}
	wg.Wait()
}

func waitForZero(n *atomic.Int32, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for n.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return n.Load() == 0
}

// Close and Disconnect close the connections the handle's own transport kept alive: they used to stay open
// (to the router, shared by every client) for the transport's 90 s idle timeout after the handle was done.
func TestCloseAndDisconnectCloseTheKeptAliveConnections(t *testing.T) {
	for _, how := range []string{"Close", "Disconnect"} {
		t.Run(how, func(t *testing.T) {
			srv, open := countingServer(t, nil)
			s := openTestSandbox(t, Options{}, srv.URL, true, nil)
			concurrentCalls(t, s, 4)
			if open.Load() == 0 {
				t.Fatal("no connection open after the calls")
			}
			var err error
			if how == "Close" {
				s.mu.Lock()
				s.claimName = "" // no Kubernetes here: nothing to delete
				s.mu.Unlock()
				err = s.Close(context.Background())
			} else {
				err = s.Disconnect(context.Background())
			}
			if err != nil {
				t.Fatal(err)
			}
			if !waitForZero(open, 2*time.Second) {
				t.Errorf("%d connections still open 2 s after %s", open.Load(), how)
			}
		})
	}
}

// A call still in flight when the handle is disconnected (or closed) finishes; its connection is closed once
// it does, not kept alive for 90 s.
func TestTheLastCallAfterDisconnectClosesItsConnection(t *testing.T) {
	release := make(chan struct{})
	srv, open := countingServer(t, release)
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	done := make(chan error, 1)
	var got []byte
	go func() {
		var err error
		got, err = s.Read(context.Background(), "slow")
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for open.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// the call ends during Disconnect's drain (one still running after it is cut: ErrTransportClosed)
	time.AfterFunc(200*time.Millisecond, func() { close(release) })
	if err := s.Disconnect(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || string(got) != "halfdone" {
		t.Fatalf("Read in flight across Disconnect = %q, %v", got, err)
	}
	if !waitForZero(open, 2*time.Second) {
		t.Errorf("%d connections still open 2 s after the last call of a disconnected handle ended", open.Load())
	}
}

// A transport given as Options.HTTPTransport is the caller's (maybe shared by other handles): Close and
// Disconnect leave its connections alone.
func TestDisconnectLeavesTheCallersTransportAlone(t *testing.T) {
	srv, open := countingServer(t, nil)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	s := openTestSandbox(t, Options{HTTPTransport: tr}, srv.URL, true, nil)
	concurrentCalls(t, s, 2)
	if err := s.Disconnect(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if open.Load() == 0 {
		t.Error("Disconnect closed the connections of the caller's HTTPTransport")
	}
}
