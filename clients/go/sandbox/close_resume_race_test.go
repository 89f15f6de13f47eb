package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
)

// Review of December 6 (commit "Close ends an Open in progress"): a Close during a Resume still left the
// handle connected - the Resume connected after the Close had deleted the claim - and two Resumes of one
// handle both connected, one transport leaking; an Open (or Resume) begun while a Close was deleting the
// claim connected to it; GetSandbox tracked a held-back handle a DeleteAll had taken and closed meanwhile;
// a call the transport's closing cut, whose caller's context then ended too, said context.Canceled.

// confirmRunning is the controller's answer to a resume: Ready at the new generation, on a pod IP.
func confirmRunning(obj *unstructured.Unstructured) {
	g := obj.GetGeneration()
	obj.Object["status"] = map[string]any{
		"podIPs": []any{"127.0.0.1"},
		"conditions": []any{
			map[string]any{"type": "Ready", "status": "True", "reason": "DependenciesReady", "observedGeneration": g},
			map[string]any{"type": "Suspended", "status": "False", "reason": "x", "observedGeneration": g},
		}}
}

// slowPatches makes the Sandbox patches take delay before the writers' reactor answers them.
func slowPatches(s *Sandbox, delay time.Duration) {
	fakeDynamic(s).PrependReactor("patch", "sandboxes", func(k8stesting.Action) (bool, runtime.Object, error) {
		time.Sleep(delay)
		return false, nil, nil
	})
}

// suspendedHandle is a handle of claim-1 bound to the suspended Sandbox sb (not connected, as after a
// confirmed Suspend); a resume's patch takes 150 ms and is confirmed at once.
func suspendedHandle(t *testing.T) *Sandbox {
	t.Helper()
	s := modeHandle(t, modeSandbox("Suspended", nil), confirmRunning)
	slowPatches(s, 150*time.Millisecond)
	s.disconnect(context.Background(), "suspended", 0)
	if _, err := fakeDynamic(s).Resource(claimsGVR).Namespace("ns").Create(context.Background(),
		ownedClaim("claim-1", "uid-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.claimUID = "uid-1"
	return s
}

// Close while a Resume waits for its write: the Resume ends without connecting (ErrNotReady, closed during
// Resume), and the handle is closed, its claim deleted.
func TestCloseDuringResumeLeavesTheHandleClosed(t *testing.T) {
	s := suspendedHandle(t)
	done := make(chan error, 1)
	go func() { done <- s.Resume(context.Background()) }()
	time.Sleep(40 * time.Millisecond) // the resume's patch is in flight
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Resume did not return")
	}
	if s.IsReady() {
		t.Errorf("IsReady() after Close (Resume = %v); want the handle closed", err)
	}
	if !errors.Is(err, ErrNotReady) || !strings.Contains(fmt.Sprint(err), "closed (Close) during Resume") {
		t.Errorf("Resume = %v; want ErrNotReady saying the handle was closed during Resume", err)
	}
	if claimExists(t, s, "claim-1") {
		t.Error("the claim is still there after Close")
	}
	if _, err := s.Run(context.Background(), "true"); !errors.Is(err, ErrNotReady) {
		t.Errorf("Run after Close = %v; want ErrNotReady", err)
	}
}

// Two Resumes of one handle: one is refused at once (ErrAlreadyOpen), so only one transport is made.
func TestASecondResumeDuringAResumeIsRefused(t *testing.T) {
	s := suspendedHandle(t)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.Resume(context.Background()) }()
	}
	wg.Wait()
	close(errs)
	var ok, refused int
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, ErrAlreadyOpen) && strings.Contains(err.Error(), "in progress"):
			refused++
		default:
			t.Errorf("Resume = %v", err)
		}
	}
	if ok != 1 || refused != 1 {
		t.Errorf("%d Resumes succeeded, %d were refused; want one each", ok, refused)
	}
	if !s.IsReady() {
		t.Error("IsReady() = false after a Resume succeeded")
	}
}

// An Open begun while a Close lets a call in flight finish does not connect the handle to the claim the
// Close then deletes: it waits for the Close and goes on from the closed handle.
func TestOpenDuringCloseDoesNotConnectToTheDeletedClaim(t *testing.T) {
	s := clusterHandle(t, Options{APIURL: hangingExecute(t), CleanupTimeout: 400 * time.Millisecond},
		sandboxInfo{podName: "sb", podIP: "127.0.0.1"}, modeSandbox("Running", nil))
	if _, err := fakeDynamic(s).Resource(claimsGVR).Namespace("ns").Create(context.Background(),
		boundClaimObj("claim-1", "uid-1", "sb"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.claimUID = "uid-1"
	go func() { _, _ = s.Run(context.Background(), "sleep 30") }()
	time.Sleep(50 * time.Millisecond) // the call is in flight: Close drains it for 200 ms
	closed := make(chan error, 1)
	go func() { closed <- s.Close(context.Background()) }()
	time.Sleep(40 * time.Millisecond) // the Close is draining
	openErr := s.Open(context.Background())
	if err := <-closed; err != nil {
		t.Errorf("Close = %v", err)
	}
	if claimExists(t, s, "claim-1") {
		t.Error("claim-1 is still there after Close")
	}
	if s.IsReady() && (s.ClaimName() == "" || !claimExists(t, s, s.ClaimName())) {
		t.Errorf("after Close and Open (= %v): connected, claim %q; want no handle connected to a deleted claim",
			openErr, s.ClaimName())
	}
}

// GetSandbox of a suspended Sandbox whose Open returns after a DeleteAll took the handle (DeleteAll closes
// it, deleting its claim): GetSandbox does not track it again.
func TestGetSandboxHeldBackDuringDeleteAllIsNotLeftTracked(t *testing.T) {
	s0, dyn := fakeCluster(t, boundClaimObj("c1", "uid-1", "sb"))
	if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(),
		sandboxObj("10.1.1.1", "Suspended", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := fakeClient(t, s0)
	dyn.PrependReactor("get", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		time.Sleep(100 * time.Millisecond)
		return false, nil, nil
	})
	got := make(chan *Sandbox, 1)
	go func() {
		sb, _ := c.GetSandbox(context.Background(), "c1", "")
		got <- sb
	}()
	time.Sleep(40 * time.Millisecond) // its Open is reading the claim
	// what DeleteAll does first: it takes the handles being opened, and closes them once a slot is free
	c.mu.Lock()
	var taken []*Sandbox
	for sb := range c.opening {
		taken = append(taken, sb)
	}
	clear(c.opening)
	c.mu.Unlock()
	if len(taken) != 1 {
		t.Fatalf("%d handles being opened; want the GetSandbox one", len(taken))
	}
	<-got // its Open returned (held back: suspended) before the DeleteAll's Close of it began
	if err := taken[0].close(context.Background(), time.Now()); err != nil {
		t.Fatalf("close = %v", err)
	}
	if claimExists(t, s0, "c1") {
		t.Error("claim c1 is still there after the DeleteAll's Close")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tracked) != 0 {
		t.Errorf("tracked: %v; want none (the DeleteAll closed the handle; it would not untrack it)", c.tracked)
	}
}

// A call the closing of the transport cut, whose caller's context ended only after that, is
// ErrTransportClosed (what ended it), not the caller's context.Canceled.
func TestACallCutByTheTransportIsSoEvenIfItsContextEndsAfter(t *testing.T) {
	s := openTestSandbox(t, Options{}, "http://127.0.0.1:1", true, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := s.op(ctx, "run", nil, false, func(bound context.Context, c *liveConn, _ *callOptions) error {
		c.closeWith("the handle was closed (Close)")
		<-bound.Done()
		cancel() // the caller gives up too, a moment later
		return bound.Err()
	})
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, ErrTransportClosed) || errors.Is(err, context.Canceled) {
		t.Errorf("op = %v; want ErrNotReady wrapping ErrTransportClosed", err)
	}
}

// A DeleteAll (Close) that ends a GetSandbox before its Open could read the claim does not delete the claim:
// the handle never attached to it (it does not know its UID), and a claim is deleted only by the UID its
// handle made or attached (until this review such a Close deleted whatever claim had the name).
func TestCloseOfAnAttachThatNeverReadItsClaimDeletesNothing(t *testing.T) {
	s0, dyn := fakeCluster(t, boundClaimObj("c1", "uid-1", "sb"))
	c := fakeClient(t, s0)
	// the API server does not answer the handle's reads of c1 (a request cut by the cancel, a 503, ...)
	var failing atomic.Bool
	failing.Store(true)
	dyn.PrependReactor("get", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !failing.Load() {
			return false, nil, nil
		}
		time.Sleep(200 * time.Millisecond)
		return true, nil, errors.New("no answer")
	})
	dyn.PrependReactor("list", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !failing.Load() {
			return false, nil, nil
		}
		return true, nil, errors.New("no answer")
	})
	dyn.PrependWatchReactor("sandboxclaims", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, errors.New("no answer")
	})
	got := make(chan error, 1)
	go func() {
		_, err := c.GetSandbox(context.Background(), "c1", "")
		got <- err
	}()
	time.Sleep(60 * time.Millisecond) // its Open is trying to read the claim
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if err := <-got; err == nil {
		t.Error("GetSandbox = nil; want its Open ended")
	}
	failing.Store(false)
	if !claimExists(t, s0, "c1") {
		t.Error("claim c1 was deleted by the Close of a handle that never read it (no UID)")
	}
}
