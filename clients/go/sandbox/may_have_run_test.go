package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	k8stesting "k8s.io/client-go/testing"
)

// Probe go12 of December 7: failures after a request was sent read as if nothing had been sent.

// hangUpAfterRequest reads the request whole, then closes the connection without an answer: the request
// was sent (the router was SIGKILLed, or the runtime crashed, after the command started).
func hangUpAfterRequest(t *testing.T) string {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	return srv.URL
}

// Defect 1: a POST answered 502 by the router while its Sandbox exists and runs may have been carried out
// (a runtime that died mid-command gives the router's "Could not connect to the backend sandbox" too). It
// says so, as the Python SDK's may_have_run, and matches ErrMayHaveRun; the *HTTPError stays reachable. A GET's
// 502 does not match it, and a suspended or deleted Sandbox's 502 says that instead.
func TestAPostsBadGatewaySaysItMayHaveRun(t *testing.T) {
	const body = `{"detail":"Could not connect to the backend sandbox: sb-pod"}`
	url, _ := routerAnswering(t, http.StatusBadGateway, body)
	s := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: true},
		sandboxInfo{podName: "sb", podIP: "10.1.1.1"}, sandboxObj("10.1.1.1", "", true))
	_, err := s.Run(context.Background(), "echo ran >> marker")
	var he *HTTPError
	if !errors.Is(err, ErrMayHaveRun) || !errors.As(err, &he) || he.StatusCode != http.StatusBadGateway ||
		!strings.Contains(err.Error(), "the command may have started") || !strings.Contains(err.Error(), "it was not retried") {
		t.Errorf("Run answered 502 = %v; want the 502 saying the command may have started (ErrMayHaveRun)", err)
	}
	if _, err := s.Read(context.Background(), "f"); err == nil || errors.Is(err, ErrMayHaveRun) {
		t.Errorf("Read answered 502 = %v; want an error that is not ErrMayHaveRun (a GET is idempotent)", err)
	}

	suspended := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: true},
		sandboxInfo{podName: "sb", podIP: "10.1.1.1"}, sandboxObj("10.1.1.1", "Suspended", false))
	if _, err := suspended.Run(context.Background(), "true"); !errors.Is(err, ErrNotReady) || errors.Is(err, ErrMayHaveRun) {
		t.Errorf("Run of a suspended Sandbox answered 502 = %v; want ErrNotReady (it is suspended), not ErrMayHaveRun", err)
	}
}

// Defect 2: a connection lost after the request was sent is ErrConnection with RequestSent, says it may have
// run (a POST) and not "could not connect"; a refused dial is RequestSent false and says "could not connect".
func TestAConnectionLostAfterSendingIsNotCouldNotConnect(t *testing.T) {
	s := openTestSandbox(t, Options{APIURL: hangUpAfterRequest(t)}, hangUpAfterRequest(t), true, nil)
	_, err := s.Run(context.Background(), "echo ran >> marker")
	var ce *ConnectionError
	if !errors.Is(err, ErrConnection) || !errors.As(err, &ce) || !ce.RequestSent || !errors.Is(err, ErrMayHaveRun) ||
		strings.Contains(err.Error(), "could not connect") || !strings.Contains(err.Error(), "it may have run") {
		t.Errorf("Run whose connection was lost after sending = %v; want ErrConnection, RequestSent, ErrMayHaveRun, "+
			"saying it may have run and not \"could not connect\"", err)
	}
	if _, err := s.Read(context.Background(), "f"); !errors.As(err, &ce) || !ce.RequestSent || errors.Is(err, ErrMayHaveRun) {
		t.Errorf("Read whose connection was lost after sending = %v; want RequestSent, not ErrMayHaveRun (a GET)", err)
	}

	refused := fmt.Sprintf("http://127.0.0.1:%d", closedPort(t))
	s = openTestSandbox(t, Options{APIURL: refused}, refused, true, nil)
	_, err = s.Run(context.Background(), "true")
	ce = nil
	if !errors.Is(err, ErrConnection) || !errors.As(err, &ce) || ce.RequestSent || errors.Is(err, ErrMayHaveRun) ||
		!strings.Contains(err.Error(), "could not connect") {
		t.Errorf("Run to a closed port = %v; want ErrConnection, RequestSent false, \"could not connect\"", err)
	}
}

// cutDownload promises a file of 1 MiB and hangs up after its first KiB.
func cutDownload(t *testing.T) string {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "1048576")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(make([]byte, 1024))
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	return srv.URL
}

// Defect 4: a download cut mid-body read the Sandbox (once): gone, ErrSandboxDeleted naming it; there and
// running, ErrConnection saying the download was cut. It was an untyped "reading response: unexpected EOF".
func TestADownloadCutMidBodyAsksTheSandbox(t *testing.T) {
	url := cutDownload(t)
	gone := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: true}, sandboxInfo{podName: "sb", podIP: "10.1.1.1"})
	_, err := gone.Read(context.Background(), "big")
	if !errors.Is(err, ErrSandboxDeleted) || !strings.Contains(err.Error(), "ns/sb") {
		t.Errorf("Read cut off, Sandbox gone = %v; want ErrSandboxDeleted naming it", err)
	}
	there := clusterHandle(t, Options{APIURL: url, DisablePodIPRouting: true},
		sandboxInfo{podName: "sb", podIP: "10.1.1.1"}, sandboxObj("10.1.1.1", "", true))
	var sink strings.Builder
	n, err := there.ReadTo(context.Background(), "big", &sink)
	var ce *ConnectionError
	if !errors.Is(err, ErrConnection) || !errors.As(err, &ce) || !ce.Cut || errors.Is(err, ErrSandboxDeleted) ||
		!strings.Contains(err.Error(), "the download was cut off") || n != 1024 {
		t.Errorf("ReadTo cut off, Sandbox running = %d, %v; want 1024 bytes and ErrConnection saying the download was cut", n, err)
	}
}

// Defect 5: a deadline met in a Kubernetes API call (Suspend's patch, Status's read, Open's create) is
// ErrTimeout too, as the calls' waits are: it was context.DeadlineExceeded alone.
func TestADeadlineInAnAPICallIsErrTimeout(t *testing.T) {
	deadline := &url.Error{Op: "Patch", URL: "https://127.0.0.1:6443/x", Err: context.DeadlineExceeded}
	s, dyn := lifecycleCluster(t, lifecycleClaim(map[string]any{}))
	if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(),
		sandboxObj("10.1.1.1", "", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"patch", "get"} {
		dyn.PrependReactor(verb, "sandboxes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, deadline
		})
	}
	if err := s.Suspend(context.Background()); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Suspend whose patch met its deadline = %v; want ErrTimeout and context.DeadlineExceeded", err)
	}
	if _, err := s.Status(context.Background()); !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Status whose read met its deadline = %v; want ErrTimeout and context.DeadlineExceeded", err)
	}

	o, cdyn := fakeCluster(t)
	cdyn.PrependReactor("create", "sandboxclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, deadline
	})
	c := registryClient(t, o, time.Second)
	if _, err := c.CreateSandbox(context.Background(), "tmpl", ""); !errors.Is(err, ErrTimeout) ||
		!errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("CreateSandbox whose create met its deadline = %v; want ErrTimeout and context.DeadlineExceeded", err)
	}
}

// Defect 3: concurrent GetSandbox calls of one claim share one attach and return one handle, which DeleteAll
// closes: each made its own handle (a tunnel each over port-forward), one was tracked, and the rest stayed
// connected after DeleteAll.
func TestConcurrentGetSandboxSharesOneHandle(t *testing.T) {
	const callers = 8
	s, dyn := fakeCluster(t, boundClaimObj("c1", "uid-1", "sb"))
	if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(),
		sandboxObj("10.1.1.1", "", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// every read of the claim is held until each caller has either read it or is waiting for another's attach
	// (onGetWait): all of them are in flight at once. (Before the fix each caller read it; now one does.)
	var mu sync.Mutex
	arrived := 0
	release := make(chan struct{})
	arrive := func() {
		mu.Lock()
		defer mu.Unlock()
		if arrived++; arrived == callers {
			close(release)
		}
	}
	s.k8s.Dynamic = heldClaimReads{Interface: s.k8s.Dynamic, hold: func() {
		select {
		case <-release:
		default:
			arrive()
			<-release
		}
	}}
	c := fakeClient(t, s)
	c.onGetWait = arrive
	handles := make([]*Sandbox, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			handles[i], errs[i] = c.GetSandbox(context.Background(), "c1", "")
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("GetSandbox %d = %v", i, errs[i])
		}
		if handles[i] != handles[0] {
			t.Errorf("GetSandbox %d returned another handle than GetSandbox 0", i)
		}
	}
	if keys := c.ListActiveSandboxes(); len(keys) != 1 {
		t.Errorf("ListActiveSandboxes = %v; want the one claim", keys)
	}
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	for i, sb := range handles {
		if sb != nil && sb.IsReady() {
			t.Errorf("handle of GetSandbox %d is still connected after DeleteAll", i)
		}
	}
}

// heldClaimReads calls hold before each GET of a SandboxClaim (outside the fake client's lock, which its
// reactors run under).
type heldClaimReads struct {
	dynamic.Interface
	hold func()
}

func (d heldClaimReads) Resource(gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	r := d.Interface.Resource(gvr)
	if gvr != claimsGVR {
		return r
	}
	return heldClaimNamespaces{NamespaceableResourceInterface: r, hold: d.hold}
}

type heldClaimNamespaces struct {
	dynamic.NamespaceableResourceInterface
	hold func()
}

func (n heldClaimNamespaces) Namespace(ns string) dynamic.ResourceInterface {
	return heldClaimGets{ResourceInterface: n.NamespaceableResourceInterface.Namespace(ns), hold: n.hold}
}

type heldClaimGets struct {
	dynamic.ResourceInterface
	hold func()
}

func (r heldClaimGets) Get(ctx context.Context, name string, opts metav1.GetOptions, sub ...string) (*unstructured.Unstructured, error) {
	r.hold()
	return r.ResourceInterface.Get(ctx, name, opts, sub...)
}
