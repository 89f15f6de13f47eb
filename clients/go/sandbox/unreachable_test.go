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

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// What a call that could not reach its sandbox reads from the API server, and when it gives up (review of
// December 6: a Sandbox being hibernated was called deleted, a pod restarting its runtime container ended a
// Write at once, the router's overload answer and an unreachable router cost a Sandbox read each).

func fakeDynamic(s *Sandbox) *dynamicfake.FakeDynamicClient {
	return s.k8s.Dynamic.(*dynamicfake.FakeDynamicClient)
}

// sandboxReads counts the handle's reads of its Sandbox (and of its SandboxArchive) so far.
func sandboxReads(s *Sandbox) (sandboxes, archives int) {
	for _, a := range fakeDynamic(s).Actions() {
		if a.GetVerb() != "get" {
			continue
		}
		switch a.GetResource().Resource {
		case "sandboxes":
			sandboxes++
		case "sandboxarchives":
			archives++
		}
	}
	return sandboxes, archives
}

func createArchive(t *testing.T, s *Sandbox, archive *unstructured.Unstructured) {
	t.Helper()
	if _, err := fakeDynamic(s).Resource(archivesGVR).Namespace("ns").Create(context.Background(), archive, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// routerAnswering serves every request with status and body (a router's JSON error), counting them.
func routerAnswering(t *testing.T, status int, body string) (string, *atomic.Int32) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "5")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
	return srv.URL, &calls
}

// Defects 1 and 6: the router's own 503s say nothing of a deleted Sandbox. "is resuming but was not Ready"
// is a lifecycle router holding a Sandbox being hibernated and restored (it comes back): the call used to
// read the Sandbox, find it gone (only its archive exists) and end at once with ErrSandboxDeleted. The
// overload answer cost one Sandbox read per failed call. Now neither reads anything and the retries go on.
func TestTheRoutersOwn503sReadNothing(t *testing.T) {
	for name, body := range map[string]string{
		"resume timed out": `{"detail":"Sandbox ns/sb is resuming but was not Ready within 30s"}`,
		"restore refused": `{"detail":"Sandbox ns/sb could not be resumed: it is hibernated and has expired ` +
			`(its archive is marked lifecycle.agents.x-k8s.io/expired-at=2026-12-06T10:00:00Z)"}`,
		"overloaded": `{"detail":"Too many concurrent requests."}`,
	} {
		for _, disable := range []bool{false, true} {
			url, calls := routerAnswering(t, http.StatusServiceUnavailable, body)
			s := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: disable},
				sandboxInfo{podName: "sb", podIP: "10.1.1.1"}) // no Sandbox: it would be called deleted
			_, err := s.Exists(context.Background(), "a")
			var he *HTTPError
			if errors.Is(err, ErrSandboxDeleted) || !errors.Is(err, ErrRetriesExhausted) || !errors.As(err, &he) ||
				he.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("%s (DisablePodIPRouting %v): Exists = %v; want the router's 503 after the retries", name, disable, err)
			}
			if calls.Load() != 6 {
				t.Errorf("%s (DisablePodIPRouting %v): %d requests, want 6", name, disable, calls.Load())
			}
			if got, _ := sandboxReads(s); got != 0 {
				t.Errorf("%s (DisablePodIPRouting %v): %d Sandbox reads, want none", name, disable, got)
			}
		}
	}
}

// Defect 1: a Sandbox found missing after a 502 may be hibernated (its SandboxArchive exists). Through a
// router (a lifecycle router restores it on request) the call goes on - and succeeds once it is back; it
// used to end "no longer exists" (ErrSandboxDeleted) at the first 502. One that will never be restored
// (expired) still ends at once, named; straight to the sandbox nothing restores it, so it ends too.
func TestAHibernatedSandboxIsNotCalledDeleted(t *testing.T) {
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, disable := range []bool{false, true} {
		var calls atomic.Int32
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) == 1 { // the pod went as the Sandbox was hibernated; the next request is restored
				w.WriteHeader(http.StatusBadGateway)
				_, _ = io.WriteString(w, `{"detail":"Could not connect to the backend sandbox: sb"}`)
				return
			}
			_, _ = io.WriteString(w, "content")
		})
		s := clusterHandle(t, Options{APIURL: srv.URL, DisablePodIPRouting: disable}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"})
		createArchive(t, s, hibernatedArchive(later, nil))
		data, err := s.Read(context.Background(), "a")
		if err != nil || string(data) != "content" || calls.Load() != 2 {
			t.Errorf("DisablePodIPRouting %v: Read = %q, %v after %d requests; want the content from the second",
				disable, data, err, calls.Load())
		}

		// a router that does not restore it: the 502 after the retries, naming the hibernation
		url, calls502 := routerAnswering(t, http.StatusBadGateway, `{"detail":"Could not connect to the backend sandbox: sb"}`)
		s = clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: disable}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"})
		createArchive(t, s, hibernatedArchive(later, nil))
		_, err = s.Exists(context.Background(), "a")
		if errors.Is(err, ErrSandboxDeleted) || !errors.Is(err, ErrRetriesExhausted) || !strings.Contains(err.Error(), "is hibernated") ||
			calls502.Load() != 6 {
			t.Errorf("DisablePodIPRouting %v: Exists = %v after %d requests; want the 502 after 6, naming the hibernation",
				disable, err, calls502.Load())
		}

		// expired while hibernated: never restored, named at once
		url, calls502 = routerAnswering(t, http.StatusBadGateway, `{"detail":"Could not connect to the backend sandbox: sb"}`)
		s = clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: disable}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"})
		createArchive(t, s, hibernatedArchive(later, map[string]string{ExpiredAtAnnotation: "2026-12-06T10:00:00Z"}))
		_, err = s.Exists(context.Background(), "a")
		var ce *ConditionError
		if !errors.Is(err, ErrSandboxDeleted) || !errors.As(err, &ce) || ce.Reason != "SandboxExpired" || calls502.Load() > 2 {
			t.Errorf("DisablePodIPRouting %v: Exists of an expired archive = %v after %d requests; want SandboxExpired at once",
				disable, err, calls502.Load())
		}
	}

	// straight to the pod: a hibernated Sandbox has no pod to come back to by itself
	opts := Options{Connectivity: ConnectivityInCluster, ServerPort: closedPort(t)}
	s := clusterHandle(t, opts, sandboxInfo{podName: "sb", podIP: "127.0.0.1"})
	createArchive(t, s, hibernatedArchive(later, nil))
	waits := recordedSleeps(s)
	err := s.Write(context.Background(), "f", []byte("x"))
	if !errors.Is(err, ErrSandboxDeleted) || !strings.Contains(err.Error(), "is hibernated (its SandboxArchive exists)") || len(*waits) != 0 {
		t.Errorf("pod IP mode: Write = %v after waits %v; want ErrSandboxDeleted naming the hibernation at once", err, *waits)
	}
}

// Defect 3: straight to the pod (ConnectivityInCluster), a Sandbox that is not Ready on the same pod (its
// runtime container restarting: same address, back in seconds) is retried; the reason is attached to the
// final error if it does not come back. It used to end the call at once with ErrNotReady.
func TestPodIPModeRidesThroughABriefNotReady(t *testing.T) {
	port := closedPort(t)
	opts := Options{Connectivity: ConnectivityInCluster, ServerPort: port}
	s := clusterHandle(t, opts, sandboxInfo{podName: "sb", podIP: "127.0.0.1"}, sandboxObj("127.0.0.1", "", false))
	var uploads atomic.Int32
	s.http.sleep = func(ctx context.Context, d time.Duration) error {
		if uploads.Load() == 0 && d == 0 { // before the second attempt: the container is back
			lis, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err != nil {
				t.Fatalf("the runtime's port %d: %v", port, err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				uploads.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				_, _ = io.WriteString(w, `{"message":"ok"}`)
			})}
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(func() { _ = srv.Close() })
		}
		return ctx.Err()
	}
	if err := s.Write(context.Background(), "f", []byte("x")); err != nil || uploads.Load() != 1 {
		t.Errorf("Write while the runtime restarts = %v (%d uploads); want it written by a later attempt", err, uploads.Load())
	}

	// never back: the attempts' error, with the reason attached
	for _, rt := range []Runtime{RuntimeSandboxd, RuntimeLegacyPython} {
		opts := Options{Connectivity: ConnectivityInCluster, Runtime: rt,
			SandboxdRESTPort: closedPort(t), SandboxdGRPCPort: closedPort(t), ServerPort: closedPort(t)}
		s := clusterHandle(t, opts, sandboxInfo{podName: "sb", podIP: "127.0.0.1"}, sandboxObj("127.0.0.1", "", false))
		waits := recordedSleeps(s)
		err := s.Write(context.Background(), "f", []byte("x"))
		if !errors.Is(err, ErrRetriesExhausted) || !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "is not Ready") ||
			len(*waits) != 5 {
			t.Errorf("%s: Write = %v after waits %v; want the 6 attempts' error naming the not-Ready Sandbox", rt, err, *waits)
		}
		calls := map[string]func() error{"run": func() error { _, err := s.Run(context.Background(), "true"); return err }}
		if rt == RuntimeSandboxd {
			calls["start"] = func() error { _, err := s.Start(context.Background(), "true"); return err }
		}
		for call, fn := range calls {
			if err := fn(); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "is not Ready") {
				t.Errorf("%s, %s: err = %v; want its one attempt's error naming the not-Ready Sandbox", rt, call, err)
			}
		}
	}
}

// Defect 6: a sandboxd runtime's call to a router that cannot be reached (restarting) says nothing of the
// sandbox and reads nothing, as docs/sdk/go.md says; it read the Sandbox (the X-Sandbox-* headers, which
// it does not send, decided "through a router") and, with the Sandbox gone, ended with ErrSandboxDeleted.
func TestAnUnreachableRouterReadsNothing(t *testing.T) {
	for _, rt := range []Runtime{RuntimeSandboxd, RuntimeLegacyPython} {
		s := clusterHandle(t, Options{APIURL: "http://127.0.0.1:" + strconv.Itoa(closedPort(t)), Runtime: rt},
			sandboxInfo{podName: "sb", podIP: "10.1.1.1"}) // no Sandbox
		_, err := s.Read(context.Background(), "x")
		if !errors.Is(err, ErrConnection) || !errors.Is(err, ErrRetriesExhausted) || errors.Is(err, ErrSandboxDeleted) {
			t.Errorf("%s: Read = %v; want ErrConnection after the retries", rt, err)
		}
		if got, _ := sandboxReads(s); got != 0 {
			t.Errorf("%s: %d Sandbox reads, want none", rt, got)
		}
	}
}

// Defect 6: a gRPC UNAVAILABLE through a router reads the Sandbox only for the router's "could not
// connect"; straight to the sandbox, any UNAVAILABLE does.
func TestGRPCUnavailableReadsOnlyForCouldNotConnect(t *testing.T) {
	for _, tc := range []struct {
		viaRouter bool
		msg       string
		reads     bool
	}{
		{true, "Could not connect to the backend sandbox: sb", true},
		{true, "unexpected HTTP status code received from server: 502 (Bad Gateway)", true},
		{true, "Sandbox ns/sb could not be resumed: it is hibernated and has expired", false},
		{true, "Sandbox ns/sb is resuming but was not Ready within 30s", false},
		{true, "connection error: desc = \"transport: Error while dialing: connection refused\"", false},
		{false, "connection error: desc = \"transport: Error while dialing: connection refused\"", true},
	} {
		read := 0
		ep := &endpoint{sendHeaders: tc.viaRouter, explain: func(context.Context) (error, error) {
			read++
			return ErrSandboxDeleted, nil
		}}
		cause := status.Error(codes.Unavailable, tc.msg)
		named := unavailable(context.Background(), ep, &diagnosis{}, cause, cause)
		if (read == 1) != tc.reads || (named != nil) != tc.reads {
			t.Errorf("via router %v, %q: %d reads, named %v; want a read: %v", tc.viaRouter, tc.msg, read, named, tc.reads)
		}
	}
}

// Defect 6: the read that explains a failure is bounded (explainTimeout), not by the call's whole budget:
// with a hung API server the call used to wait as long as the read did.
func TestTheExplainReadIsBounded(t *testing.T) {
	defer func(d time.Duration) { explainTimeout = d }(explainTimeout)
	explainTimeout = 100 * time.Millisecond
	url, _ := routerAnswering(t, http.StatusBadGateway, `{"detail":"Could not connect to the backend sandbox: sb"}`)
	s := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: true}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"})
	release := make(chan struct{})
	time.AfterFunc(3*time.Second, func() { close(release) }) // the hung read answers, late: "not found"
	fakeDynamic(s).PrependReactor("get", "sandboxes", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return true, nil, apierrors.NewNotFound(sandboxesGVR.GroupResource(), "sb")
	})
	_, err := s.Run(context.Background(), "true")
	var he *HTTPError
	if !errors.As(err, &he) || he.StatusCode != http.StatusBadGateway || errors.Is(err, ErrSandboxDeleted) {
		t.Errorf("Run with a hung API server = %v; want the 502 as it was, without waiting for the read", err)
	}
}

// exitRacingClose is a process stream whose exit event arrives as Close is called (another goroutine's
// Close, run between the backend's answer and Recv's bookkeeping).
type exitRacingClose struct {
	p    *Process
	sent int
}

func (b *exitRacingClose) recv() (Event, error) {
	b.sent++
	if b.sent == 1 {
		return Event{Type: EventStdout, Data: []byte("out")}, nil
	}
	_ = b.p.Close()
	return Event{Type: EventExit, ExitCode: 3}, nil
}
func (b *exitRacingClose) writeStdin(context.Context, []byte, bool) error { return nil }
func (b *exitRacingClose) signal(context.Context, Signal) error           { return nil }
func (b *exitRacingClose) resize(context.Context, uint32, uint32) error   { return nil }
func (b *exitRacingClose) stop()                                          {}

// Defect 7: a Close that races the exit event comes after the exit: Events ends with it (no error), Recv
// then returns io.EOF. It used to yield a spurious ErrProcessClosed after the exit event.
func TestCloseRacingTheExitEventChangesNothing(t *testing.T) {
	b := &exitRacingClose{}
	p := newProcess(1, b, func() {})
	b.p = p
	var got []EventType
	for ev, err := range p.Events() {
		if err != nil {
			t.Fatalf("Events yielded %v after %v", err, got)
		}
		got = append(got, ev.Type)
	}
	if len(got) != 2 || got[1] != EventExit {
		t.Errorf("events = %v; want stdout, exit", got)
	}
	if _, err := p.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the exit = %v; want io.EOF", err)
	}
}
