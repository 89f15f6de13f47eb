package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Probe of December 7 (cancelled creates, failed cleanups, long-lived clients): a CreateSandbox whose rollback
// DELETE failed returned no handle and an ErrOrphanedClaim saying "call Close", but nothing tracked the handle:
// DeleteAll and EnableAutoCleanup never retried, and the claim held a warm-pool sandbox for good; one failed
// DELETE (a 500, a reset connection) was enough. A cancelled create whose answer was lost and whose cleanup
// request failed leaked silently. The Client kept every handle closed with sb.Close (one entry per
// create/close cycle), and a handle re-opened after Close stayed listed under its deleted claim.

// createThenCancel makes the fake cluster's claim creates store the claim (auto-named ones get
// sandbox-claim-N, UID uid-N) and answer, and then cancels cancel: as a caller abandoning its request right
// after the claim was made.
func createThenCancel(t *testing.T, dyn *dynamicfake.FakeDynamicClient, cancel context.CancelFunc) {
	t.Helper()
	var n atomic.Int32
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		k := n.Add(1)
		obj := a.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		obj.SetName(fmt.Sprintf("%s%d", obj.GetGenerateName(), k))
		obj.SetUID(claimUIDFor(k))
		if err := dyn.Tracker().Create(claimsGVR, obj, "ns"); err != nil {
			return true, nil, err
		}
		cancel()
		return true, obj, nil
	})
}

func claimUIDFor(k int32) types.UID { return types.UID(fmt.Sprintf("uid-%d", k)) }

// failClaimRequests makes the fake cluster's `verb`s of claims fail with err while on is set; it counts them.
func failClaimRequests(dyn *dynamicfake.FakeDynamicClient, verb string, err error, on *atomic.Bool) *atomic.Int32 {
	var n atomic.Int32
	dyn.PrependReactor(verb, "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		n.Add(1)
		if on.Load() {
			return true, nil, err
		}
		return false, nil, nil
	})
	return &n
}

func registryClient(t *testing.T, s0 *Sandbox, cleanup time.Duration) *Client {
	t.Helper()
	c := fakeClient(t, s0)
	c.opts.WarmPoolName = "pool"
	c.opts.CleanupTimeout = cleanup
	return c
}

var errConnReset = fmt.Errorf("write tcp 127.0.0.1:1->127.0.0.1:6443: %w", syscall.ECONNRESET)

// Defect 1: the rollback's DELETE failed for all of CleanupTimeout: CreateSandbox reports ErrOrphanedClaim
// without a handle, and the Client keeps the handle so DeleteAll deletes the claim.
func TestCreateSandboxWhoseRollbackFailsIsRetriedByDeleteAll(t *testing.T) {
	s0, dyn := fakeCluster(t)
	c := registryClient(t, s0, 300*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	createThenCancel(t, dyn, cancel)
	var failing atomic.Bool
	failing.Store(true)
	failClaimRequests(dyn, "delete", errConnReset, &failing)
	sb, err := c.CreateSandbox(ctx, "", "")
	if sb != nil || !errors.Is(err, ErrOrphanedClaim) {
		t.Fatalf("CreateSandbox = %v, %v; want no handle and ErrOrphanedClaim", sb, err)
	}
	if n := claimCount(t, s0); n != 1 {
		t.Fatalf("%d claims after the failed rollback; want the orphaned one", n)
	}
	if keys := c.ListActiveSandboxes(); len(keys) != 0 {
		t.Errorf("ListActiveSandboxes = %v; the orphaned handle is not connected", keys)
	}
	failing.Store(false)
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left after DeleteAll: the orphaned claim of a failed CreateSandbox leaked", n)
	}
	if len(c.tracked) != 0 {
		t.Errorf("tracked after DeleteAll = %v; want none", c.tracked)
	}
}

// Defect 1: one transient failure of the rollback's DELETE (a 500, a reset connection) is retried within
// CleanupTimeout: the claim is deleted, and the error is the Open's own, not ErrOrphanedClaim.
func TestARollbackRetriesATransientDeleteFailure(t *testing.T) {
	for name, fail := range map[string]error{
		"a 500":              apierrors.NewInternalError(errors.New("injected transient error")),
		"a reset connection": errConnReset,
	} {
		t.Run(name, func(t *testing.T) {
			s0, dyn := fakeCluster(t)
			c := registryClient(t, s0, 5*time.Second)
			ctx, cancel := context.WithCancel(context.Background())
			createThenCancel(t, dyn, cancel)
			var once atomic.Bool
			once.Store(true)
			var deletes atomic.Int32
			dyn.PrependReactor("delete", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
				deletes.Add(1)
				if once.Swap(false) {
					return true, nil, fail
				}
				return false, nil, nil
			})
			sb, err := c.CreateSandbox(ctx, "", "")
			if sb != nil || err == nil || errors.Is(err, ErrOrphanedClaim) {
				t.Errorf("CreateSandbox = %v, %v; want the cancelled Open's error, not ErrOrphanedClaim", sb, err)
			}
			if n := claimCount(t, s0); n != 0 {
				t.Errorf("%d claims left: the rollback gave up after one transient failure", n)
			}
			if n := deletes.Load(); n != 2 {
				t.Errorf("%d DELETEs; want the failed one and its retry", n)
			}
		})
	}
}

// Defect 1: a refusal (403) is not retried, and a 404 is success.
func TestARollbackDoesNotRetryARefusal(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := poolHandle(t, s0)
	s.opts.CleanupTimeout = 5 * time.Second
	var on atomic.Bool
	on.Store(true)
	deletes := failClaimRequests(dyn, "delete", apierrors.NewForbidden(claimsResource, "x", errors.New("no")), &on)
	start := time.Now()
	if err := s.deleteClaim(context.Background(), "x", "uid-x"); !apierrors.IsForbidden(err) {
		t.Errorf("deleteClaim = %v; want the 403", err)
	}
	if n := deletes.Load(); n != 1 || time.Since(start) > time.Second {
		t.Errorf("%d DELETEs in %v; a refusal is not retried", n, time.Since(start))
	}
}

// Defect 2: a cancelled auto-named create whose answer was lost, and whose search for the claim it may have
// made failed: Open says ErrOrphanedClaim, and Close (standalone) or DeleteAll (Client) repeats the search.
func TestALostAutoNamedCreateWhoseCleanupFailsIsNotForgotten(t *testing.T) {
	for _, verb := range []string{"list", "delete"} {
		t.Run("failed "+verb, func(t *testing.T) {
			t.Run("standalone", func(t *testing.T) {
				s0, dyn := fakeCluster(t)
				s := poolHandle(t, s0)
				s.opts.CleanupTimeout = 300 * time.Millisecond
				applyThenAnswer(dyn, context.Canceled, nil)
				var failing atomic.Bool
				failing.Store(true)
				failClaimRequests(dyn, verb, errConnReset, &failing)
				err := s.Open(context.Background())
				if !errors.Is(err, ErrClaimFailed) || !errors.Is(err, ErrOrphanedClaim) {
					t.Errorf("Open = %v; want ErrClaimFailed and ErrOrphanedClaim (the claim may be left)", err)
				}
				if err := s.Close(context.Background()); !errors.Is(err, ErrOrphanedClaim) {
					t.Errorf("Close while the cleanup still fails = %v; want ErrOrphanedClaim", err)
				}
				failing.Store(false)
				if err := s.Close(context.Background()); err != nil {
					t.Errorf("Close = %v", err)
				}
				if n := claimCount(t, s0); n != 0 {
					t.Errorf("%d claims left after Close: the lost create's claim leaked", n)
				}
				if err := s.Close(context.Background()); err != nil {
					t.Errorf("second Close = %v", err)
				}
			})
			t.Run("client", func(t *testing.T) {
				s0, dyn := fakeCluster(t)
				c := registryClient(t, s0, 300*time.Millisecond)
				applyThenAnswer(dyn, context.Canceled, nil)
				var failing atomic.Bool
				failing.Store(true)
				failClaimRequests(dyn, verb, errConnReset, &failing)
				sb, err := c.CreateSandbox(context.Background(), "", "")
				if sb != nil || !errors.Is(err, ErrOrphanedClaim) {
					t.Errorf("CreateSandbox = %v, %v; want no handle and ErrOrphanedClaim", sb, err)
				}
				if err := c.DeleteAll(context.Background()); !errors.Is(err, ErrOrphanedClaim) {
					t.Errorf("DeleteAll while the cleanup still fails = %v; want ErrOrphanedClaim", err)
				}
				failing.Store(false)
				if err := c.DeleteAll(context.Background()); err != nil {
					t.Errorf("DeleteAll = %v", err)
				}
				if n := claimCount(t, s0); n != 0 {
					t.Errorf("%d claims left after DeleteAll: the lost create's claim leaked", n)
				}
				if len(c.tracked) != 0 {
					t.Errorf("after DeleteAll: tracked %v; want none", c.tracked)
				}
			})
		})
	}
}

// Defect 2: a lost create's cleanup retries a transient List failure within CleanupTimeout.
func TestALostCreatesSearchRetriesATransientFailure(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := poolHandle(t, s0)
	s.opts.CleanupTimeout = 5 * time.Second
	applyThenAnswer(dyn, context.Canceled, nil)
	var once atomic.Bool
	once.Store(true)
	dyn.PrependReactor("list", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if once.Swap(false) {
			return true, nil, apierrors.NewServiceUnavailable("restarting")
		}
		return false, nil, nil
	})
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) || errors.Is(err, ErrOrphanedClaim) {
		t.Errorf("Open = %v; want ErrClaimFailed, the claim found and deleted", err)
	}
	if n := claimCount(t, s0); n != 0 {
		t.Errorf("%d claims left: the search gave up after one transient failure", n)
	}
}

// Defect 3: a handle the Client made and its user closed leaves the Client's registry.
func TestClosedHandlesLeaveTheClientsRegistry(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, time.Second)
	for i := range 5 {
		sb, err := c.CreateSandbox(context.Background(), "", "")
		if err != nil {
			t.Fatalf("CreateSandbox %d = %v", i, err)
		}
		if err := sb.Close(context.Background()); err != nil {
			t.Fatalf("Close %d = %v", i, err)
		}
	}
	c.mu.Lock()
	n := len(c.tracked) + len(c.keyOf) + len(c.pending)
	c.mu.Unlock()
	if n != 0 {
		t.Errorf("registry after 5 create/close cycles: tracked %v; want empty", c.tracked)
	}
	// a handle whose Close failed stays (DeleteAll retries it)
	sb, err := c.CreateSandbox(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	var failing atomic.Bool
	failing.Store(true)
	failClaimRequests(dyn, "delete", apierrors.NewForbidden(claimsResource, "x", errors.New("no")), &failing)
	if err := sb.Close(context.Background()); !errors.Is(err, ErrOrphanedClaim) {
		t.Fatalf("Close = %v; want ErrOrphanedClaim", err)
	}
	if len(c.tracked) != 1 {
		t.Errorf("tracked after a failed Close = %v; want the handle kept", c.tracked)
	}
	failing.Store(false)
	if err := c.DeleteAll(context.Background()); err != nil || claimCount(t, s0) != 0 || len(c.tracked) != 0 {
		t.Errorf("DeleteAll = %v; %d claims, tracked %v left", err, claimCount(t, s0), c.tracked)
	}
}

// Defect 3: the Close of an older handle does not drop a newer handle tracked under the same key.
func TestClosingAnOlderHandleKeepsTheNewerOneTracked(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, time.Second)
	old, err := c.CreateSandbox(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	key := Key{Namespace: "ns", ClaimName: old.ClaimName()}
	_ = old.Disconnect(context.Background())
	newer, err := c.GetSandbox(context.Background(), key.ClaimName, "")
	if err != nil || newer == old {
		t.Fatalf("GetSandbox = %v, %v; want a new handle", newer, err)
	}
	if err := old.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	got := c.tracked[key]
	c.mu.Unlock()
	if got != newer {
		t.Errorf("tracked[%v] after the older handle's Close = %p; want the newer handle %p", key, got, newer)
	}
}

// Defect 4: Close then Open of a Client-made handle (a new claim) moves it to its new claim: listed under
// it, found by GetSandbox, the deleted claim no longer listed.
func TestAReopenedHandleIsTrackedUnderItsNewClaim(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, time.Second)
	sb, err := c.CreateSandbox(context.Background(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	first := sb.ClaimName()
	if err := sb.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sb.Open(context.Background()); err != nil {
		t.Fatal(err)
	}
	second := sb.ClaimName()
	if second == first || second == "" {
		t.Fatalf("re-Open claimed %q (first %q)", second, first)
	}
	want := []Key{{Namespace: "ns", ClaimName: second}}
	if keys := c.ListActiveSandboxes(); !slices.Equal(keys, want) {
		t.Errorf("ListActiveSandboxes = %v; want %v", keys, want)
	}
	if g, err := c.GetSandbox(context.Background(), second, ""); err != nil || g != sb {
		t.Errorf("GetSandbox(%s) = %p, %v; want the re-opened handle %p", second, g, err, sb)
	}
	if err := c.DeleteAll(context.Background()); err != nil || claimCount(t, s0) != 0 {
		t.Errorf("DeleteAll = %v, %d claims left", err, claimCount(t, s0))
	}
}

// Defects 3 and 4 under -race: creates, Closes, re-Opens, listings and a DeleteAll at once take the Client's
// lock and the handles' in one order (no deadlock), and leave nothing registered once all is closed.
func TestRegistryHooksUnderConcurrency(t *testing.T) {
	s0, dyn := fakeCluster(t)
	slowCreates(t, dyn, 0)
	c := registryClient(t, s0, time.Second)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				sb, err := c.CreateSandbox(context.Background(), "", "")
				if err != nil {
					continue // a DeleteAll closed it during its Open
				}
				_ = c.ListActiveSandboxes()
				if i%2 == 0 {
					_ = sb.Close(context.Background())
					_ = sb.Open(context.Background())
				}
				_ = sb.Close(context.Background())
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	_ = c.DeleteAll(context.Background())
	wg.Wait()
	if err := c.DeleteAll(context.Background()); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	c.mu.Lock()
	n := len(c.tracked) + len(c.keyOf) + len(c.pending) + len(c.opening)
	c.mu.Unlock()
	if n != 0 || claimCount(t, s0) != 0 {
		t.Errorf("after all was closed: tracked %v, %d registry entries, %d claims", c.tracked, n, claimCount(t, s0))
	}
}
