package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
)

// Probe of December 6: a handle with Options.ClaimName owned that claim from New on, so Close deleted
// another owner's claim of that name - after its own Open failed "already exists", and without any Open.
// A handle now owns a claim only once its create or attach succeeded, and deletes it by its UID.

func ownedClaim(name, uid string) *unstructured.Unstructured {
	c := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", name, nil)
	c.SetUID(types.UID(uid))
	return c
}

func claimExists(t *testing.T, s *Sandbox, name string) bool {
	t.Helper()
	_, err := s.k8s.claims("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil && !isNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func TestAFailedOpenOfAnExistingClaimNameDeletesNothing(t *testing.T) {
	s, _ := fakeCluster(t, ownedClaim("explicit-2", "uid-a"))
	s.opts.ClaimName, s.opts.WarmPoolName = "explicit-2", "pool"
	err := s.Open(context.Background())
	if !errors.Is(err, ErrClaimFailed) || !strings.Contains(err.Error(), "already exists") ||
		!strings.Contains(err.Error(), "GetSandbox") {
		t.Fatalf("Open = %v; want ErrClaimFailed saying it already exists and how to attach", err)
	}
	if got := s.ClaimName(); got != "" {
		t.Errorf("ClaimName() after the refused create = %q; the handle owns no claim", got)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if !claimExists(t, s, "explicit-2") {
		t.Error("Close of the handle whose Open was refused deleted the other owner's claim")
	}
}

func TestCloseOfANeverOpenedHandleDeletesNothing(t *testing.T) {
	s, _ := fakeCluster(t, ownedClaim("owned-by-a", "uid-a"))
	o := Options{ClaimName: "owned-by-a", Namespace: "ns", Quiet: true, K8sHelper: s.k8s}
	b, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if !claimExists(t, s, "owned-by-a") {
		t.Error("Close of a never-opened handle deleted the claim named in its options")
	}
}

// A claim replaced under the same name (another UID) is not the handle's: the API server refuses the
// deletion by UID (409), and Close succeeds - the handle's own claim is gone.
func TestCloseDeletesOnlyTheClaimItMade(t *testing.T) {
	s, dyn := fakeCluster(t, ownedClaim("c1", "uid-new"))
	var preconditions []string
	dyn.PrependReactor("delete", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteAction)
		if p := d.GetDeleteOptions().Preconditions; p != nil && p.UID != nil {
			preconditions = append(preconditions, string(*p.UID))
			if *p.UID != "uid-new" {
				return true, nil, apierrors.NewConflict(claimsGVR.GroupResource(), "c1",
					errors.New("Precondition failed: UID in precondition: "+string(*p.UID)+", UID in object meta: uid-new"))
			}
		}
		return false, nil, nil
	})
	s.claimName, s.claimUID = "c1", "uid-old"
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if len(preconditions) != 1 || preconditions[0] != "uid-old" {
		t.Errorf("deletions with UID preconditions %v; want one, uid-old", preconditions)
	}
	if !claimExists(t, s, "c1") {
		t.Error("Close deleted a claim with another UID")
	}
	if s.ClaimName() != "" {
		t.Errorf("ClaimName() after Close = %q", s.ClaimName())
	}
}

// fakeClient is a Client on s's fake cluster.
func fakeClient(t *testing.T, s *Sandbox) *Client {
	t.Helper()
	c, err := NewClient(context.Background(), Options{Namespace: "ns", Quiet: true, K8sHelper: s.k8s,
		SandboxReadyTimeout: 5 * time.Second, APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func boundClaimObj(name, uid, sandbox string, conds ...map[string]any) *unstructured.Unstructured {
	c := ownedClaim(name, uid)
	st := map[string]any{"sandbox": map[string]any{"name": sandbox}}
	if len(conds) > 0 {
		list := make([]any, 0, len(conds))
		for _, cond := range conds {
			list = append(list, cond)
		}
		st["conditions"] = list
	}
	c.Object["status"] = st
	return c
}

// Probe of December 6: GetSandbox of a suspended Sandbox waited out its deadline (ErrTimeout) and gave no
// handle to Resume with. It now answers at once with the handle, bound and not connected, and no error (as the
// Python SDK): the handle's calls fail with ErrNotReady and the advice a reconnect gives. (The first fix
// returned the handle with that ErrNotReady, which `if err != nil { return err }` callers never saw, though
// DeleteAll and EnableAutoCleanup would Close it and delete the claim.)
func TestGetSandboxOfASuspendedSandboxGivesAHandleToResume(t *testing.T) {
	s, dyn := fakeCluster(t, boundClaimObj("c1", "uid-1", "sb"))
	if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(),
		sandboxObj("10.1.1.1", "Suspended", false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c := fakeClient(t, s)
	start := time.Now()
	sb, err := c.GetSandbox(context.Background(), "c1", "")
	if waited := time.Since(start); waited > 2*time.Second {
		t.Errorf("GetSandbox waited %v", waited)
	}
	if err != nil {
		t.Fatalf("GetSandbox = %v; want the handle and no error", err)
	}
	if sb == nil {
		t.Fatal("GetSandbox returned no handle for a suspended Sandbox")
	}
	if keys := c.ListActiveSandboxes(); len(keys) != 0 {
		t.Errorf("ListActiveSandboxes = %v; the suspended handle is not connected", keys)
	}
	if st, err := sb.Status(context.Background()); err != nil || st.OperatingMode != "Suspended" || st.Hibernated {
		t.Errorf("Status of it = %+v, %v; want operating mode Suspended", st, err)
	}
	if sb.SandboxName() != "sb" || sb.ClaimName() != "c1" || sb.IsReady() {
		t.Errorf("handle: sandbox %q claim %q ready %v; want bound to sb/c1, not connected", sb.SandboxName(),
			sb.ClaimName(), sb.IsReady())
	}
	if _, err := sb.Run(context.Background(), "true"); !errors.Is(err, ErrNotReady) ||
		!strings.Contains(err.Error(), "is suspended") || !strings.Contains(err.Error(), "call Resume") {
		t.Errorf("Run on it = %v; want ErrNotReady saying it is suspended: call Resume", err)
	}
	// Resume is what the handle is for: it writes the mode (the fake has no controller to confirm it)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_ = sb.Resume(ctx)
	obj, _ := dyn.Resource(sandboxesGVR).Namespace("ns").Get(context.Background(), "sb", metav1.GetOptions{})
	if mode, _, _ := unstructured.NestedString(obj.Object, "spec", "operatingMode"); mode != "Running" {
		t.Errorf("Resume through the handle GetSandbox returned did not write Running (mode %q)", mode)
	}
	// the handle is the claim's (by UID): Close deletes it
	if err := sb.Close(context.Background()); err != nil || claimExists(t, s, "c1") {
		t.Errorf("Close = %v, claim still there: %v", err, claimExists(t, s, "c1"))
	}
}

// Probe of December 6: GetSandbox of a hibernated Sandbox said ErrSandboxDeleted in milliseconds although
// its claim exists (Ready=False, SandboxHibernated). It now returns the handle (no error); its calls and
// Status say hibernated, with how to restore it.
func TestGetSandboxOfAHibernatedSandboxSaysSo(t *testing.T) {
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	claim := boundClaimObj("c1", "uid-1", "sb", map[string]any{"type": "Ready", "status": "False",
		"reason": "SandboxHibernated", "message": `Sandbox "sb" is hibernated`})
	s, _ := fakeCluster(t, claim, hibernatedArchive(later, nil))
	c := fakeClient(t, s)
	sb, err := c.GetSandbox(context.Background(), "c1", "")
	if err != nil {
		t.Fatalf("GetSandbox = %v; want the handle and no error", err)
	}
	if sb == nil || sb.SandboxName() != "sb" || sb.ClaimName() != "c1" || sb.IsReady() {
		t.Fatalf("GetSandbox handle = %v; want one bound to sb/c1, not connected", sb)
	}
	if _, err := sb.Read(context.Background(), "f"); !errors.Is(err, ErrNotReady) || errors.Is(err, ErrSandboxDeleted) ||
		!strings.Contains(err.Error(), "is hibernated (its SandboxArchive exists)") {
		t.Errorf("Read on it = %v; want ErrNotReady saying it is hibernated", err)
	}
	st, err := sb.Status(context.Background())
	if err != nil || !st.Hibernated {
		t.Errorf("Status of it = %+v, %v; want Hibernated", st, err)
	}
}

// Probe of December 6: Status of a hibernated Sandbox said "sandbox was deleted" while Resume on the same
// handle said it is hibernated.
func TestStatusOfAHibernatedSandboxSaysHibernated(t *testing.T) {
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	earlier := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	s, _ := lifecycleCluster(t, lifecycleClaim(map[string]any{}), hibernatedArchive(later, nil))
	st, err := s.Status(context.Background())
	if err != nil {
		t.Fatalf("Status = %v; want the hibernated state", err)
	}
	if !st.Hibernated || !st.Suspended || st.Ready || st.OperatingMode != "Suspended" || st.Reason != "SandboxHibernated" ||
		!strings.Contains(st.Message, "is hibernated (its SandboxArchive exists)") {
		t.Errorf("Status = %+v; want hibernated (Suspended, reason SandboxHibernated, the archive named)", st)
	}
	// expired while hibernated: never restored, as Resume says
	s, _ = lifecycleCluster(t, lifecycleClaim(map[string]any{}), hibernatedArchive(earlier, nil))
	var ce *ConditionError
	if _, err := s.Status(context.Background()); !errors.As(err, &ce) || ce.Reason != "SandboxExpired" ||
		!errors.Is(err, ErrSandboxDeleted) {
		t.Errorf("Status of an expired hibernated Sandbox = %v; want SandboxExpired, ErrSandboxDeleted", err)
	}
	// no archive: deleted, as before
	s, _ = lifecycleCluster(t, lifecycleClaim(map[string]any{}))
	if _, err := s.Status(context.Background()); !errors.Is(err, ErrSandboxDeleted) {
		t.Errorf("Status of a deleted Sandbox = %v; want ErrSandboxDeleted", err)
	}
}

// Review of December 6: GetSandbox read the claim's UID only in attachHeld's GET; when that GET failed
// (transiently) the handle had none, and Close deleted by name - a claim re-created under the name since
// too. The UID is now taken from the claim the readiness wait sees.
func TestGetSandboxOwnsTheClaimByUIDWhenItsFirstReadFails(t *testing.T) {
	s, dyn := fakeCluster(t, boundClaimObj("c1", "uid-1", "sb"))
	if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(),
		sandboxObj("10.1.1.1", "", true), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var failed bool
	dyn.PrependReactor("get", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
		}
		return false, nil, nil
	})
	var preconditions []string
	dyn.PrependReactor("delete", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if p := a.(k8stesting.DeleteAction).GetDeleteOptions().Preconditions; p != nil && p.UID != nil {
			preconditions = append(preconditions, string(*p.UID))
		} else {
			preconditions = append(preconditions, "")
		}
		return false, nil, nil
	})
	c := fakeClient(t, s)
	sb, err := c.GetSandbox(context.Background(), "c1", "")
	if err != nil {
		t.Fatalf("GetSandbox = %v", err)
	}
	if !failed {
		t.Fatal("the first GET of the claim was not made")
	}
	if err := sb.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if len(preconditions) != 1 || preconditions[0] != "uid-1" {
		t.Errorf("Close deleted with UID preconditions %q; want one, uid-1", preconditions)
	}
}
