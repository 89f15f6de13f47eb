package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Review of December 6: a claim created under Options.ClaimName whose create's answer was lost (a deadline, a
// connection reset after the request went out) was nobody's: the handle owned nothing, so Close left it, and
// a retried Open failed "already exists; this handle did not create it" - which it had. The handle now reads
// the claim by name and adopts it when it carries the stamps of the request it sent.

// explicitHandle is an unopened handle for the claim "mine" of warm pool "pool" on s's fake cluster.
func explicitHandle(t *testing.T, s0 *Sandbox) *Sandbox {
	t.Helper()
	s, err := New(context.Background(), Options{ClaimName: "mine", WarmPoolName: "pool", Namespace: "ns", Quiet: true,
		K8sHelper: s0.k8s, SandboxReadyTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// applyThenLoseAnswer makes the next creates of claims happen in the fake cluster and fail as if their
// answer were lost (the context's deadline met the request after it went out).
func applyThenLoseAnswer(dyn *dynamicfake.FakeDynamicClient) {
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject()
		if err := dyn.Tracker().Create(claimsGVR, obj, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, context.DeadlineExceeded
	})
}

func TestAnExplicitClaimWhoseCreateAnswerWasLostIsTheHandles(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	applyThenLoseAnswer(dyn)
	err := s.Open(context.Background())
	if !errors.Is(err, ErrClaimFailed) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open = %v; want ErrClaimFailed with the lost answer's cause", err)
	}
	made, gerr := s.k8s.claims("ns").Get(context.Background(), "mine", metav1.GetOptions{})
	if gerr != nil {
		t.Fatal(gerr)
	}
	if s.ClaimName() != "mine" || s.claimUID != made.GetUID() {
		t.Errorf("handle after the lost answer: claim %q uid %q; want the claim it made (mine, %q)", s.ClaimName(),
			s.claimUID, made.GetUID())
	}
	// a retried Open attaches to it (waits for it) instead of failing "already exists"
	if err := s.Open(context.Background()); err == nil || strings.Contains(err.Error(), "already exists") {
		t.Errorf("retried Open = %v; want it to wait for the claim it made (no controller here: a timeout)", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if claimExists(t, s, "mine") {
		t.Error("the claim this handle made (answer lost) survives Close: leaked")
	}
}

// The claim could not be read after the lost answer (the API server unreachable for a moment): a retried
// Open that meets it "already exists" adopts it by the earlier request's stamps, and says nothing false.
func TestARetriedOpenAdoptsTheClaimOfItsUnansweredCreate(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	applyThenLoseAnswer(dyn)
	var failGets atomic.Bool
	failGets.Store(true)
	dyn.PrependReactor("get", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if failGets.Load() {
			return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
		}
		return false, nil, nil
	})
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("Open = %v; want ErrClaimFailed", err)
	}
	if s.ClaimName() != "" {
		t.Fatalf("ClaimName() = %q after a lost answer whose claim could not be read", s.ClaimName())
	}
	failGets.Store(false)
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: claimsGVR.Group, Resource: "sandboxclaims"}, "mine")
	})
	err := s.Open(context.Background())
	if err != nil && strings.Contains(err.Error(), "already exists") {
		t.Errorf("retried Open = %v; want the claim of the unanswered create adopted", err)
	}
	if s.ClaimName() != "mine" {
		t.Errorf("ClaimName() after the retried Open = %q; want mine", s.ClaimName())
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if claimExists(t, s, "mine") {
		t.Error("the claim of the unanswered create survives Close")
	}
}

// Close of a handle whose create went unanswered and whose claim was not seen then (still in flight on the
// API server) deletes it if it has appeared since, by its stamps.
func TestCloseDeletesTheClaimOfAnUnansweredCreateThatAppearedLater(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	var sent atomic.Pointer[runtime.Object]
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject()
		sent.Store(&obj)
		return true, nil, context.DeadlineExceeded // not applied yet
	})
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("Open = %v", err)
	}
	if err := dyn.Tracker().Create(claimsGVR, *sent.Load(), "ns"); err != nil { // the API server applies it now
		t.Fatal(err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if claimExists(t, s, "mine") {
		t.Error("the claim of the unanswered create, applied late, survives Close")
	}
}

// Someone else's claim of that name (other stamps) is never adopted, after a lost answer or on a retry.
func TestAnUnansweredCreateDoesNotAdoptAnotherOwnersClaim(t *testing.T) {
	other := ownedClaim("mine", "uid-other")
	other.SetLabels(map[string]string{CreatedByLabel: "go-client"})
	other.SetAnnotations(map[string]string{FirstRequestedAtAnnotation: "2026-12-06T00:00:00.000000001Z"})
	s0, dyn := fakeCluster(t, other)
	s := explicitHandle(t, s0)
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("Open = %v", err)
	}
	if s.ClaimName() != "" {
		t.Errorf("ClaimName() = %q: adopted another owner's claim", s.ClaimName())
	}
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: claimsGVR.Group, Resource: "sandboxclaims"}, "mine")
	})
	err := s.Open(context.Background())
	if !errors.Is(err, ErrClaimFailed) || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("retried Open = %v; want already exists", err)
	}
	if strings.Contains(err.Error(), "did not create it") {
		t.Errorf("retried Open = %v; after an unanswered create of this handle it cannot say it did not create it", err)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if !claimExists(t, s, "mine") {
		t.Error("Close deleted another owner's claim")
	}
}

// Review of December 6 (third): client-go retries a create answered 5xx with Retry-After by itself (kube-apiserver's
// own ServerTimeout on create, a proxy's 503); when the first attempt was applied, the retry is answered 409 and
// the handle saw only that: "already exists; this handle did not create it", and the claim it made leaked. The
// claim carries this very create's random request id, so it is this handle's.
func TestAnExplicitCreateAppliedThenAnsweredAlreadyExistsByItsRetryIsTheHandles(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject()
		if err := dyn.Tracker().Create(claimsGVR, obj, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: claimsGVR.Group, Resource: "sandboxclaims"}, "mine")
	})
	err := s.Open(context.Background())
	if err != nil && strings.Contains(err.Error(), "did not create it") {
		t.Fatalf("Open = %v; the claim is the one this create made", err)
	}
	if s.ClaimName() != "mine" {
		t.Errorf("ClaimName() = %q; want the claim its create made", s.ClaimName())
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if claimExists(t, s, "mine") {
		t.Error("the claim this handle's create made (answered 409 by client-go's retry) survives Close: leaked")
	}
}
