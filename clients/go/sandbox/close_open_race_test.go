package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Probe of December 6 (many handles, Ctrl-C): Close during an Open in progress deleted nothing (the claim
// name was not known yet) and the Open then connected the closed handle, its claim leaked; two Opens of one
// handle both created claims; DeleteAll and EnableAutoCleanup missed handles whose Open was running; Close
// did not cut an HTTP call still in flight after its drain (only gRPC and tunnels were closed); DeleteAll
// closed handles one after another, each draining for up to CleanupTimeout/2.

// slowCreates makes the fake cluster's claim creates take delay, then store the claim (auto-named ones get
// sandbox-claim-N and UID uid-N) bound to the Ready Sandbox sb-x, so an Open that gets past the create
// connects at once. It counts the creates.
func slowCreates(t *testing.T, dyn *dynamicfake.FakeDynamicClient, delay time.Duration) *atomic.Int32 {
	t.Helper()
	sb := unstructuredObj("agents.x-k8s.io/v1beta1", "Sandbox", "sb-x", readyStatus("True", "DependenciesReady"))
	if err := dyn.Tracker().Create(sandboxesGVR, sb, "ns"); err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k := n.Add(1)
		time.Sleep(delay)
		obj := a.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		if obj.GetName() == "" {
			obj.SetName(fmt.Sprintf("%s%d", obj.GetGenerateName(), k))
		}
		obj.SetUID(types.UID(fmt.Sprintf("uid-%d", k)))
		obj.Object["status"] = map[string]any{"sandbox": map[string]any{"name": "sb-x"}}
		if err := dyn.Tracker().Create(claimsGVR, obj, "ns"); err != nil {
			return true, nil, err
		}
		return true, obj, nil
	})
	return &n
}

func claimCount(t *testing.T, s *Sandbox) int {
	t.Helper()
	list, err := s.k8s.claims("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

func poolHandle(t *testing.T, s0 *Sandbox) *Sandbox {
	t.Helper()
	s, err := New(context.Background(), Options{WarmPoolName: "pool", Namespace: "ns", Quiet: true, K8sHelper: s0.k8s,
		SandboxReadyTimeout: 5 * time.Second, APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Close while Open waits for its create: the Open ends with ErrNotReady saying the handle was closed, the
// handle is not connected, and the claim the Open made is gone when Close returns.
func TestCloseDuringOpenEndsTheOpenAndDeletesItsClaim(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 150*time.Millisecond)
	s := poolHandle(t, s0)
	done := make(chan error, 1)
	go func() { done <- s.Open(context.Background()) }()
	time.Sleep(40 * time.Millisecond) // the create is in flight
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left when Close returned; want the one the Open made deleted", n)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "closed") {
			t.Errorf("Open = %v; want ErrNotReady saying the handle was closed during Open", err)
		}
		if strings.Contains(fmt.Sprint(err), "name is required") {
			t.Errorf("Open = %v; the rollback deleted a claim without a name", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Open did not return")
	}
	if s.IsReady() || s.ClaimName() != "" {
		t.Errorf("after Close: IsReady %v, ClaimName %q; want a closed handle", s.IsReady(), s.ClaimName())
	}
	if _, err := s.Run(context.Background(), "true"); !errors.Is(err, ErrNotReady) {
		t.Errorf("Run after Close = %v; want ErrNotReady", err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left after the Open ended", n)
	}
}

// A second Open while the first is in progress is ErrAlreadyOpen at once; one claim is made, Close deletes it.
func TestASecondOpenDuringAnOpenIsErrAlreadyOpen(t *testing.T) {
	s0, dyn := fakeCluster(t)
	creates := slowCreates(t, dyn, 150*time.Millisecond)
	s := poolHandle(t, s0)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.Open(context.Background()) }()
	}
	wg.Wait()
	close(errs)
	var ok, already int
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrAlreadyOpen):
			already++
		default:
			t.Errorf("Open = %v", err)
		}
	}
	if ok != 1 || already != 1 {
		t.Errorf("%d Opens succeeded, %d were ErrAlreadyOpen; want one each", ok, already)
	}
	if n := creates.Load(); n != 1 {
		t.Errorf("%d claims created; want 1", n)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left after Close", n)
	}
}

// DeleteAll (and so EnableAutoCleanup) closes handles whose CreateSandbox is still running.
func TestDeleteAllClosesHandlesWhoseOpenIsRunning(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 150*time.Millisecond)
	c := fakeClient(t, s0)
	c.opts.WarmPoolName = "pool"
	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := c.CreateSandbox(context.Background(), "", "")
			done <- err
		}()
	}
	time.Sleep(40 * time.Millisecond)
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left when DeleteAll returned", n)
	}
	for range 3 {
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotReady) {
				t.Errorf("CreateSandbox = %v; want ErrNotReady (closed during Open)", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("CreateSandbox did not return")
		}
	}
	if keys := c.ListActiveSandboxes(); len(keys) != 0 {
		t.Errorf("ListActiveSandboxes = %v", keys)
	}
}

// hangingExecute is a legacy runtime whose /execute answers only when its request ends (or after 5 s, as a
// killed command: exit -15).
func hangingExecute(t *testing.T) string {
	t.Helper()
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection once the body is read
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
			_, _ = io.WriteString(w, `{"stdout":"","stderr":"","exit_code":-15}`)
		}
	})
	return srv.URL
}

// A legacy (HTTP) call still in flight after Close's drain is cut: ErrNotReady wrapping ErrTransportClosed,
// not the runtime's answer once the Pod goes.
func TestCloseCutsAnHTTPCallInFlightAfterTheDrain(t *testing.T) {
	s := openTestSandbox(t, Options{CleanupTimeout: 400 * time.Millisecond}, hangingExecute(t), true, nil)
	s.claimName = "" // nothing to delete
	res, took, err := runDuring(t, s, func() error { return s.Close(context.Background()) })
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, ErrTransportClosed) {
		t.Errorf("Run cut by Close = %+v, %v; want ErrNotReady (ErrTransportClosed)", res, err)
	}
	if took < 150*time.Millisecond {
		t.Errorf("Close cut the call after %v; want the drain first", took)
	}
}

func TestDisconnectCutsAnHTTPCallInFlightAfterTheDrain(t *testing.T) {
	s := openTestSandbox(t, Options{CleanupTimeout: 400 * time.Millisecond}, hangingExecute(t), true, nil)
	start := time.Now()
	_, _, err := runDuring(t, s, func() error { return s.Disconnect(context.Background()) })
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, ErrTransportClosed) {
		t.Errorf("Run cut by Disconnect = %v; want ErrNotReady (ErrTransportClosed)", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("Run returned after %v; want it cut right after the drain", time.Since(start))
	}
}

// trackedBusyHandles are n handles of c on s0's cluster, each owning a claim and running a call that hangs.
func trackedBusyHandles(t *testing.T, c *Client, s0 *Sandbox, n int, cleanup time.Duration) {
	t.Helper()
	url := hangingExecute(t)
	for i := range n {
		s := openTestSandbox(t, Options{CleanupTimeout: cleanup, Namespace: "ns"}, url, true, nil)
		s.k8s = s0.k8s
		name := fmt.Sprintf("busy-%d", i)
		if err := s0.k8s.Dynamic.(*dynamicfake.FakeDynamicClient).Tracker().Create(claimsGVR, ownedClaim(name, "uid-"+name), "ns"); err != nil {
			t.Fatal(err)
		}
		s.claimName, s.claimUID = name, types.UID("uid-"+name)
		c.tracked[Key{Namespace: "ns", ClaimName: name}] = s
		go func() { _, _ = s.Run(context.Background(), "sleep 30") }()
	}
	time.Sleep(100 * time.Millisecond) // the calls are in flight
}

// DeleteAll closes the tracked handles together: their drains overlap instead of adding up.
func TestDeleteAllClosesHandlesConcurrently(t *testing.T) {
	s0, _ := fakeCluster(t)
	c := fakeClient(t, s0)
	trackedBusyHandles(t, c, s0, 6, time.Second) // drains of 500 ms each
	start := time.Now()
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("DeleteAll of 6 busy handles took %v; want their drains (500 ms) to overlap", took)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left", n)
	}
}

// DeleteAll's ctx deadline ends the drains (the claims are deleted all the same).
func TestDeleteAllEndsTheDrainsAtItsDeadline(t *testing.T) {
	s0, _ := fakeCluster(t)
	c := fakeClient(t, s0)
	trackedBusyHandles(t, c, s0, 3, 10*time.Second) // drains of 5 s each
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := c.DeleteAll(ctx); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("DeleteAll with a 300 ms deadline took %v", took)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left", n)
	}
}
