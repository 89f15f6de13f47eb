package sandbox

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

// Review of December 7 (the commit that kept orphaned handles): a failed GetSandbox was kept by the Client -
// DeleteAll deleted a claim the caller never got, and the failed handle replaced the Client's own handle of
// that claim, whose claim then leaked; a handle re-opened after Close was invisible to DeleteAll; and with
// the API server unreachable every Open and Close waited out CleanupTimeout and reported ErrOrphanedClaim.

// Defect 1b: a failed GetSandbox (its attach never read the claim: no UID) does not displace the Client's
// tracked handle of that claim; DeleteAll deletes the claim.
func TestAFailedGetSandboxKeepsTheTrackedHandle(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, 500*time.Millisecond)
	a, err := c.CreateSandbox(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	key := Key{Namespace: "ns", ClaimName: a.ClaimName()}
	_ = a.Disconnect(context.Background()) // e.g. its tunnel died
	var on atomic.Bool
	on.Store(true)
	for _, v := range []string{"get", "list", "watch"} {
		failClaimRequests(dyn, v, apierrors.NewInternalError(errors.New("etcd hiccup")), &on)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	g, err := c.GetSandbox(ctx, key.ClaimName, "")
	cancel()
	on.Store(false)
	if g != nil || err == nil {
		t.Fatalf("GetSandbox = %v, %v; want it to fail", g, err)
	}
	c.mu.Lock()
	cur := c.tracked[key]
	c.mu.Unlock()
	if cur != a {
		t.Errorf("tracked[%v] = %p; want the CreateSandbox handle %p", key, cur, a)
	}
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claim(s) left after DeleteAll: the claim CreateSandbox made leaked", n)
	}
}

// Defect 1a: a failed GetSandbox of another program's claim (the readiness wait timed out) returns no handle,
// and the Client keeps none: DeleteAll leaves that claim alone.
func TestAFailedGetSandboxIsNotDeletedByDeleteAll(t *testing.T) {
	notReady := unstructuredObj("agents.x-k8s.io/v1beta1", "Sandbox", "sb-o", readyStatus("False", "Starting"))
	s0, dyn := fakeCluster(t, boundClaimObj("other", "uid-o", "sb-o"))
	if err := dyn.Tracker().Create(sandboxesGVR, notReady, "ns"); err != nil {
		t.Fatal(err)
	}
	c := registryClient(t, s0, 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	g, err := c.GetSandbox(ctx, "other", "")
	cancel()
	if g != nil || err == nil {
		t.Fatalf("GetSandbox = %v, %v; want it to fail", g, err)
	}
	c.mu.Lock()
	n := len(c.tracked) + len(c.pending)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("the Client keeps %d handle(s) after a failed GetSandbox; want none", n)
	}
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if !claimExists(t, s0, "other") {
		t.Error("DeleteAll deleted claim \"other\", which only a failed GetSandbox (no handle returned) touched")
	}
}

// Defect 1 (the rule kept): a failed Open kept by the Client never replaces another handle tracked under the
// same claim; it is kept aside (pending) and DeleteAll closes both.
func TestAKeptHandleNeverReplacesAnotherTrackedOne(t *testing.T) {
	s0, _ := fakeCluster(t, ownedClaim("c1", "uid-1"))
	c := registryClient(t, s0, 300*time.Millisecond)
	a, b := c.newSandbox(c.opts), c.newSandbox(c.opts)
	a.claimName, a.claimUID = "c1", "uid-1"
	b.claimName, b.claimUID, b.orphaned = "c1", "uid-1", true
	key := Key{Namespace: "ns", ClaimName: "c1"}
	c.mu.Lock()
	c.trackLocked(a, key)
	c.keepLocked(b, false)
	cur := c.tracked[key]
	_, pending := c.pending[b]
	c.mu.Unlock()
	if cur != a || !pending {
		t.Errorf("after keeping b: tracked = %p (a %p), b pending %v; want a tracked and b pending", cur, a, pending)
	}
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if claimExists(t, s0, "c1") || len(c.tracked)+len(c.pending) != 0 {
		t.Errorf("after DeleteAll: claim left %v, tracked %v, pending %v", claimExists(t, s0, "c1"), c.tracked, c.pending)
	}
}

// Defect 2a: a DeleteAll during the re-Open (after Close) of a Client's handle ends it, as for a CreateSandbox:
// the Open fails "closed during Open" and its claim is deleted.
func TestDeleteAllEndsTheReopenOfAClientHandle(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 300*time.Millisecond)
	c := registryClient(t, s0, 500*time.Millisecond)
	sb, err := c.CreateSandbox(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sb.Open(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the create is in flight
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	n := claimCount(t, s0)
	oerr := <-done
	if !errors.Is(oerr, ErrNotReady) || !errors.Is(oerr, errClosedDuringOpen) {
		t.Errorf("re-Open = %v; want ErrNotReady, closed during Open", oerr)
	}
	if n != 0 {
		t.Errorf("%d claim(s) left when DeleteAll returned: the re-Open's claim outlived it", n)
	}
	if len(c.tracked)+len(c.pending)+len(c.opening) != 0 {
		t.Errorf("after DeleteAll: tracked %v, pending %v, opening %v; want none", c.tracked, c.pending, c.opening)
	}
}

// Defect 2b: a re-Open (after Close) whose rollback DELETE fails (ErrOrphanedClaim) is kept by the Client, and
// DeleteAll retries the deletion.
func TestAnOrphanOfAReopenIsKeptForDeleteAll(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, 300*time.Millisecond)
	sb, err := c.CreateSandbox(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var k atomic.Int32
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		obj.SetName(fmt.Sprintf("re-%d", k.Add(1)))
		obj.SetUID("uid-re")
		if err := dyn.Tracker().Create(claimsGVR, obj, "ns"); err != nil {
			return true, nil, err
		}
		cancel() // the caller gives up once the claim exists: the rollback deletes it
		return true, obj, nil
	})
	var on atomic.Bool
	on.Store(true)
	failClaimRequests(dyn, "delete", apierrors.NewForbidden(claimsResource, "x", errors.New("no")), &on)
	if err := sb.Open(ctx); !errors.Is(err, ErrOrphanedClaim) {
		t.Fatalf("re-Open = %v; want ErrOrphanedClaim", err)
	}
	on.Store(false)
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claim(s) left after DeleteAll: the re-Open's orphaned claim was not retried", n)
	}
}

// unreachableHelper is a Kubernetes helper whose API server refuses connections.
func unreachableHelper(t *testing.T) *K8sHelper {
	t.Helper()
	k, err := NewK8sHelper(&rest.Config{Host: "http://127.0.0.1:1"}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Defect 3: the API server refuses the connection (nothing was sent): the create cannot have been applied,
// so Open neither searches for its claim nor keeps a stamp - it fails at once with ErrClaimFailed, not
// ErrOrphanedClaim - and Close has nothing to delete.
func TestARefusedCreateIsNotALostAnswer(t *testing.T) {
	s, err := New(context.Background(), Options{WarmPoolName: "pool", Namespace: "ns", Quiet: true,
		K8sHelper: unreachableHelper(t), CleanupTimeout: 3 * time.Second, APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Open(context.Background())
	if d := time.Since(start); d > time.Second {
		t.Errorf("Open took %v: it waited for a search the refused create did not need", d)
	}
	if !errors.Is(err, ErrClaimFailed) || errors.Is(err, ErrOrphanedClaim) {
		t.Errorf("Open = %v; want ErrClaimFailed, not ErrOrphanedClaim", err)
	}
	start = time.Now()
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v; want nil (nothing was created)", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
}

// Defect 3 (Client): refused CreateSandboxes leave nothing pending, and DeleteAll is quick.
func TestRefusedCreateSandboxesLeaveNothingPending(t *testing.T) {
	c, err := NewClient(context.Background(), Options{WarmPoolName: "pool", Namespace: "ns", Quiet: true,
		K8sHelper: unreachableHelper(t), CleanupTimeout: 2 * time.Second, APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 5 {
		if _, err := c.CreateSandbox(context.Background(), "", ""); errors.Is(err, ErrOrphanedClaim) {
			t.Errorf("CreateSandbox = %v; want no ErrOrphanedClaim (nothing was sent)", err)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("5 refused CreateSandbox calls took %v", d)
	}
	if n := len(c.pending) + len(c.tracked); n != 0 {
		t.Errorf("%d handle(s) kept after refused CreateSandbox calls; want none", n)
	}
	start = time.Now()
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("DeleteAll took %v", d)
	}
}

// Defect 3: errors before the request was written (dial, DNS, TLS handshake) are "not sent": not a lost
// answer, and not retried by a cleanup; an error after it (a reset connection, a 5xx) still is.
func TestNotSentErrors(t *testing.T) {
	dial := func(err error) error {
		return &url.Error{Op: "Post", URL: "https://api:6443", Err: &net.OpError{Op: "dial", Net: "tcp", Err: err}}
	}
	for name, err := range map[string]error{
		"refused": dial(syscall.ECONNREFUSED),
		"dns":     dial(&net.DNSError{Err: "no such host", Name: "api", IsNotFound: true}),
		"tls":     &url.Error{Op: "Post", URL: "https://api:6443", Err: &tls509{x509.UnknownAuthorityError{}}},
	} {
		if answerLost(err) || transientFailure(err) {
			t.Errorf("%s (%v): answerLost %v, transientFailure %v; want neither", name, err, answerLost(err), transientFailure(err))
		}
	}
	for name, err := range map[string]error{
		"reset": &url.Error{Op: "Post", URL: "https://api:6443", Err: errConnReset},
		"500":   apierrors.NewInternalError(errors.New("x")),
		"ctx":   context.DeadlineExceeded,
	} {
		if !answerLost(err) || !transientFailure(err) {
			t.Errorf("%s (%v): answerLost %v, transientFailure %v; want both", name, err, answerLost(err), transientFailure(err))
		}
	}
}

type tls509 struct{ x509.UnknownAuthorityError }

func (e *tls509) Unwrap() error { return e.UnknownAuthorityError }

// Defect 3: a dial error from the fake cluster's create is not searched for (no List).
func TestADialErrorOnCreateSearchesNothing(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := poolHandle(t, s0)
	s.opts.CleanupTimeout = 2 * time.Second
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, &url.Error{Op: "Post", URL: "https://api:6443",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}
	})
	var off atomic.Bool
	lists := failClaimRequests(dyn, "list", nil, &off)
	err := s.Open(context.Background())
	if !errors.Is(err, ErrClaimFailed) || errors.Is(err, ErrOrphanedClaim) {
		t.Errorf("Open = %v; want ErrClaimFailed only", err)
	}
	if n := lists.Load(); n != 0 {
		t.Errorf("%d List(s) of claims after a create that was never sent; want none", n)
	}
	if stamps := s.lostAutoStamps(); len(stamps) != 0 {
		t.Errorf("stamps kept: %v", stamps)
	}
}

// Defect 3: DeleteAll's retries of a transient cleanup failure stop at the caller's deadline (one attempt
// is still made), not after CleanupTimeout.
func TestDeleteAllRespectsItsDeadline(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, 10*time.Second)
	if _, err := c.CreateSandbox(context.Background(), "", ""); err != nil {
		t.Fatal(err)
	}
	var on atomic.Bool
	on.Store(true)
	deletes := failClaimRequests(dyn, "delete", apierrors.NewServiceUnavailable("restarting"), &on)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.DeleteAll(ctx)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("DeleteAll with a 300 ms deadline took %v", d)
	}
	if !errors.Is(err, ErrOrphanedClaim) || deletes.Load() == 0 {
		t.Errorf("DeleteAll = %v after %d DELETEs; want ErrOrphanedClaim after at least one", err, deletes.Load())
	}
	on.Store(false)
	if err := c.DeleteAll(context.Background()); err != nil || claimCount(t, s0) != 0 {
		t.Errorf("second DeleteAll = %v, %d claims left", err, claimCount(t, s0))
	}
}
