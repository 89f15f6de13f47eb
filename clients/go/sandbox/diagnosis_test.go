package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The errors a call returns when something is gone, closed or unreachable name the cause (probe of
// December 6: each of these matched no sentinel, or named the cause only on the second call).

// sandboxObj is the Sandbox "sb" in namespace "ns": Ready with pod IP ip, suspended when mode says so.
func sandboxObj(ip, mode string, ready bool) *unstructured.Unstructured {
	status := "True"
	if !ready {
		status = "False"
	}
	sb := unstructuredObj("agents.x-k8s.io/v1beta1", "Sandbox", "sb", map[string]any{
		"conditions": []any{map[string]any{"type": "Ready", "status": status, "reason": "DependenciesReady"}},
		"podIPs":     []any{ip},
	})
	if mode != "" {
		sb.Object["spec"] = map[string]any{"operatingMode": mode}
	}
	return sb
}

// clusterHandle connects a fake-cluster handle (claim-1 bound to Sandbox sb, pod IP info.podIP) in the
// mode opts selects, as Open would. sandboxes are created in the fake cluster (the fake's constructor would
// file a Sandbox under the resource "sandboxs").
func clusterHandle(t *testing.T, opts Options, info sandboxInfo, sandboxes ...*unstructured.Unstructured) *Sandbox {
	t.Helper()
	s, dyn := fakeCluster(t)
	for _, sb := range sandboxes {
		if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(), sb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	opts.Quiet, opts.Namespace = true, "ns"
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		t.Fatal(err)
	}
	s.opts = opts
	s.http.opts = &s.opts
	s.http.sleep = func(ctx context.Context, d time.Duration) error { return ctx.Err() }
	c, err := s.connect(context.Background(), "sb", info)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	s.claimName, s.sandboxName, s.info, s.conn = "claim-1", "sb", info, c
	return s
}

// closedPort is a loopback port nothing listens on (connection refused).
func closedPort(t *testing.T) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	_ = lis.Close()
	return port
}

// Defect 1: a legacy Run sent once waits for its answer (which comes when the command ends) as long as the
// call lasts, not PerAttemptTimeout: a command quiet for longer failed "no response headers within the
// per-attempt timeout" (matching no sentinel) and was killed, whatever WithTimeout said.
func TestRunWaitsForItsAnswerAsLongAsTheCall(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		time.Sleep(400 * time.Millisecond) // the command runs quietly past PerAttemptTimeout
		_, _ = io.WriteString(w, `{"stdout":"done\n","stderr":"","exit_code":0}`)
	})
	s := openTestSandbox(t, Options{PerAttemptTimeout: 100 * time.Millisecond}, srv.URL, true, nil)
	for _, opts := range [][]CallOption{{WithTimeout(30 * time.Second)}, nil} { // WithTimeout, RequestTimeout
		calls.Store(0)
		res, err := s.Run(context.Background(), "sleep-quietly", opts...)
		if err != nil || res.Stdout != "done\n" || calls.Load() != 1 {
			t.Fatalf("Run(%d options) = %+v, %v after %d requests; want the answer from one", len(opts), res, err, calls.Load())
		}
	}
}

// A header timeout is ErrTimeout and names its limit; a call's deadline names the call's budget.
func TestTimeoutsNameTheirLimit(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // (the server notices the client leave only once the body is read)
		<-r.Context().Done()
	})
	s := openTestSandbox(t, Options{PerAttemptTimeout: 100 * time.Millisecond}, srv.URL, true, nil)
	recordedSleeps(s)
	_, err := s.Read(context.Background(), "x", WithMaxAttempts(2))
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, ErrRetriesExhausted) ||
		!strings.Contains(err.Error(), "no response headers within PerAttemptTimeout (100ms)") {
		t.Errorf("Read past PerAttemptTimeout = %v; want ErrTimeout naming PerAttemptTimeout (100ms)", err)
	}
	_, err = s.Run(context.Background(), "x", WithMaxAttempts(2))
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "PerAttemptTimeout (100ms)") {
		t.Errorf("retried Run past PerAttemptTimeout = %v; want ErrTimeout naming PerAttemptTimeout", err)
	}
	_, err = s.Run(context.Background(), "x", WithTimeout(300*time.Millisecond))
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "the call's budget, WithTimeout(300ms), ran out") {
		t.Errorf("Run past WithTimeout = %v; want ErrTimeout naming WithTimeout(300ms)", err)
	}
}

// Defect 2: the router's 502 "Could not connect" for a Sandbox deleted or suspended elsewhere is named on the
// first call (ErrSandboxDeleted / ErrNotReady, the 502 still reachable) - also for a Run or a Start (one
// attempt) and without X-Sandbox-Pod-IP. It used to be the bare 502 until a next attempt read the Sandbox.
func TestFirstUnreachableAnswerNamesTheCause(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadGateway)
		_, _ = io.WriteString(w, `{"detail":"Could not connect to the backend sandbox: sb"}`)
	})
	calls502 := map[string]func(s *Sandbox) error{
		"run": func(s *Sandbox) error { _, err := s.Run(context.Background(), "true"); return err },
		"start": func(s *Sandbox) error {
			_, err := s.Start(context.Background(), "true")
			return err
		},
		"exists": func(s *Sandbox) error { _, err := s.Exists(context.Background(), "a"); return err },
	}
	for _, tc := range []struct {
		name string
		objs []*unstructured.Unstructured
		want error
	}{
		{"deleted", nil, ErrSandboxDeleted},
		{"suspended", []*unstructured.Unstructured{sandboxObj("10.1.1.1", "Suspended", false)}, ErrNotReady},
	} {
		for _, disable := range []bool{false, true} {
			for call, fn := range calls502 {
				s := clusterHandle(t, Options{APIURL: srv.URL, DisablePodIPRouting: disable},
					sandboxInfo{podName: "sb", podIP: "10.1.1.1"}, tc.objs...)
				calls.Store(0)
				err := fn(s)
				var he *HTTPError
				if !errors.Is(err, tc.want) || !errors.As(err, &he) || he.StatusCode != http.StatusBadGateway {
					t.Errorf("%s, %s, DisablePodIPRouting %v: err = %v; want %v wrapping the 502", tc.name, call, disable, err, tc.want)
				}
				if calls.Load() != 1 {
					t.Errorf("%s, %s, DisablePodIPRouting %v: %d requests, want 1", tc.name, call, disable, calls.Load())
				}
			}
		}
	}
	// a Sandbox that is fine: the 502 as it was (after the retries of a file call)
	s := clusterHandle(t, Options{APIURL: srv.URL, DisablePodIPRouting: true}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"},
		sandboxObj("10.1.1.1", "", true))
	var he *HTTPError
	if _, err := s.Run(context.Background(), "true"); errors.Is(err, ErrNotReady) || !errors.As(err, &he) {
		t.Errorf("Run with the Sandbox Ready = %v; want the plain 502", err)
	}
}

// Defect 3: straight to the pod (ConnectivityInCluster), a deleted, suspended or moved Sandbox is named at
// once on a refused connection: sandboxd's Run and Start failed "Unavailable ... connection refused"
// matching no sentinel, a Write spent six attempts (~7.5 s). (A Sandbox not Ready on the same pod may come
// back: TestPodIPModeRidesThroughABriefNotReady.)
func TestPodIPModeNamesAGoneSandboxAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []*unstructured.Unstructured
		want error
		text string
	}{
		{"deleted", nil, ErrSandboxDeleted, "no longer exists"},
		{"suspended", []*unstructured.Unstructured{sandboxObj("127.0.0.1", "Suspended", false)}, ErrNotReady, "is suspended"},
		{"moved", []*unstructured.Unstructured{sandboxObj("127.0.0.9", "", true)}, ErrNotReady, "on another pod now"},
	} {
		for _, rt := range []Runtime{RuntimeSandboxd, RuntimeLegacyPython} {
			opts := Options{Connectivity: ConnectivityInCluster, Runtime: rt,
				SandboxdRESTPort: closedPort(t), SandboxdGRPCPort: closedPort(t), ServerPort: closedPort(t)}
			s := clusterHandle(t, opts, sandboxInfo{podName: "sb", podIP: "127.0.0.1"}, tc.objs...)
			waits := recordedSleeps(s)
			calls := map[string]func() error{
				"write": func() error { return s.Write(context.Background(), "f", []byte("x")) },
				"run":   func() error { _, err := s.Run(context.Background(), "true"); return err },
			}
			if rt == RuntimeSandboxd { // the legacy Start is the same HTTP call as its Run
				calls["start"] = func() error { _, err := s.Start(context.Background(), "true"); return err }
			}
			for call, fn := range calls {
				*waits = (*waits)[:0]
				err := fn()
				if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
					t.Errorf("%s, %s, %s: err = %v; want %v (%q)", tc.name, rt, call, err, tc.want, tc.text)
				}
				if len(*waits) != 0 {
					t.Errorf("%s, %s, %s: waited %v before the answer; want no further attempt", tc.name, rt, call, *waits)
				}
			}
		}
	}
}

// Defect 4: after the handle's own Suspend, Disconnect or Close, and before Open, a call says which (still
// ErrNotReady); it used to say only "sandbox is not ready".
func TestNotConnectedSaysWhy(t *testing.T) {
	suspended := sandboxObj("10.1.1.1", "", true)
	suspended.Object["status"].(map[string]any)["conditions"] = []any{
		map[string]any{"type": "Suspended", "status": "True", "reason": "PodDeleted"}}
	cs := clusterHandle(t, Options{APIURL: "http://127.0.0.1:1"}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"}, suspended)
	s := cs
	if err := s.Suspend(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := s.Run(context.Background(), "true")
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "suspended by this handle (Suspend): call Resume") {
		t.Errorf("Run after Suspend = %v; want ErrNotReady saying call Resume", err)
	}
	s = openTestSandbox(t, Options{}, "http://127.0.0.1:1", true, nil)
	_ = s.Disconnect(context.Background())
	if _, err := s.Read(context.Background(), "x"); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "(Disconnect): call Open") {
		t.Errorf("Read after Disconnect = %v", err)
	}
	s.claimName = "" // Close has no claim to delete
	_ = s.Close(context.Background())
	if _, err := s.Start(context.Background(), "x"); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "closed (Close)") {
		t.Errorf("Start after Close = %v", err)
	}
	fresh, err := New(context.Background(), Options{APIURL: "http://127.0.0.1:1", Quiet: true, K8sHelper: cs.k8s})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Run(context.Background(), "x"); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "not open: call Open") {
		t.Errorf("Run before Open = %v", err)
	}
}

// Defect 5: a router (or sandbox) that cannot be reached at all is ErrConnection wrapping the transport error.
func TestUnreachableRouterIsErrConnection(t *testing.T) {
	s := openTestSandbox(t, Options{}, "http://127.0.0.1:"+strconv.Itoa(closedPort(t)), true, nil)
	recordedSleeps(s)
	_, err := s.Run(context.Background(), "true")
	var opErr *net.OpError
	if !errors.Is(err, ErrConnection) || !errors.As(err, &opErr) {
		t.Errorf("Run = %v; want ErrConnection wrapping a *net.OpError", err)
	}
	_, err = s.Read(context.Background(), "x")
	if !errors.Is(err, ErrConnection) || !errors.Is(err, ErrRetriesExhausted) || !errors.As(err, &opErr) {
		t.Errorf("Read = %v; want ErrRetriesExhausted and ErrConnection", err)
	}
}

// Defect 6: Process.Close from another goroutine during a Recv: ErrProcessClosed on both runtimes, then again
// (not io.EOF); it was "context canceled" (legacy, matching context.Canceled though nothing was cancelled)
// or gRPC Canceled, then io.EOF as if the command had finished.
func TestCloseDuringRecvIsErrProcessClosed(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, `{"type":"start","pid":42}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	legacy := openTestSandbox(t, Options{}, srv.URL, true, nil)
	sandboxd := sandboxdTestSandbox(t, newFakeProcessService(), "")
	for name, s := range map[string]*Sandbox{"legacy": legacy, "sandboxd": sandboxd} {
		p, err := s.Start(context.Background(), "sleep 30")
		if err != nil {
			t.Fatal(err)
		}
		if name == "sandboxd" { // the fake's "hello"
			if _, err := p.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		time.AfterFunc(100*time.Millisecond, func() { _ = p.Close() })
		_, err = p.Recv()
		if !errors.Is(err, ErrProcessClosed) || errors.Is(err, context.Canceled) ||
			!strings.HasPrefix(err.Error(), "sandbox[default/claim-1]: ") {
			t.Errorf("%s: Recv during Close = %v; want ErrProcessClosed (not context.Canceled)", name, err)
		}
		if _, err := p.Recv(); !errors.Is(err, ErrProcessClosed) {
			t.Errorf("%s: Recv after Close = %v; want ErrProcessClosed again", name, err)
		}
		if _, err := p.Wait(); !errors.Is(err, ErrProcessClosed) {
			t.Errorf("%s: Wait after Close = %v", name, err)
		}
		if err := p.Signal(context.Background(), SignalKill); !errors.Is(err, ErrProcessClosed) {
			t.Errorf("%s: Signal after Close = %v", name, err)
		}
		s.drain(context.Background(), time.Second) // Close releases the call in its own goroutine
		s.mu.Lock()
		if s.inflight != 0 {
			t.Errorf("%s: in-flight = %d after Close", name, s.inflight)
		}
		s.mu.Unlock()
	}
}

// A Close after the exit event (a deferred Close) changes nothing: Recv still ends with io.EOF.
func TestCloseAfterExitKeepsEOF(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"exit","exit_code":0}`+"\n")
	})
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	p, err := s.Start(context.Background(), "true")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	_ = p.Close()
	if _, err := p.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after exit and Close = %v; want io.EOF", err)
	}
}

// Exists refuses a control character before sending anything, as Write and Read do.
func TestExistsRefusesControlCharacters(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { calls.Add(1) })
	s := openTestSandbox(t, Options{}, srv.URL, true, nil)
	if _, err := s.Exists(context.Background(), "new\nline"); !errors.Is(err, ErrInvalidArgument) || calls.Load() != 0 {
		t.Errorf("Exists(new\\nline) = %v after %d requests; want ErrInvalidArgument, none sent", err, calls.Load())
	}
}
