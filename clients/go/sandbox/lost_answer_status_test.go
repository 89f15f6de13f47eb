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
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Second review of December 6 (of 91bd14b): a create answered by a 5xx status - the API server's own 504
// "Timeout" (it may still be processing the request), a proxy's 502/503/504 page (client-go turns it into a
// status error) - may have been applied, as a create without an answer; only a 4xx is a refusal. The
// client-first-requested-at stamp alone is not unique (a Windows clock ticks every 0.5-15.6 ms, macOS's
// every µs): a random per-request id is required too. Close reports a claim of a lost create it failed to
// delete.

var claimsResource = schema.GroupResource{Group: claimsGVR.Group, Resource: "sandboxclaims"}

// applyThenAnswer makes the next creates of claims happen in the fake cluster (an auto-named one named
// sandbox-claim-x1) and then fail with answer, as a gateway or the API server may answer a create it passed
// on or is still processing; edit (if not nil) changes the stored claim first.
func applyThenAnswer(dyn *dynamicfake.FakeDynamicClient, answer error, edit func(*unstructured.Unstructured)) {
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		if obj.GetName() == "" {
			obj.SetName(obj.GetGenerateName() + "x1")
		}
		if edit != nil {
			edit(obj)
		}
		if err := dyn.Tracker().Create(claimsGVR, obj, "ns"); err != nil {
			return true, nil, err
		}
		return true, nil, answer
	})
}

// fiveHundreds are the status answers that do not say the create was refused.
func fiveHundreds() map[string]error {
	return map[string]error{
		"the API server's 504 Timeout": apierrors.NewTimeoutError("request did not complete within 60s", 0),
		"a proxy's 502":                apierrors.NewGenericServerResponse(502, "post", claimsResource, "", "<html>Bad Gateway</html>", 0, true),
		"a proxy's 503":                apierrors.NewGenericServerResponse(503, "post", claimsResource, "", "<html>unavailable</html>", 0, true),
		"a proxy's 504":                apierrors.NewGenericServerResponse(504, "post", claimsResource, "", "<html>Gateway Timeout</html>", 0, true),
		"a 500":                        apierrors.NewInternalError(errors.New("etcd: request timed out")),
	}
}

func TestAnExplicitCreateAnsweredByA5xxIsTheHandles(t *testing.T) {
	for name, answer := range fiveHundreds() {
		s0, dyn := fakeCluster(t)
		s := explicitHandle(t, s0)
		applyThenAnswer(dyn, answer, nil)
		if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
			t.Errorf("%s: Open = %v; want ErrClaimFailed", name, err)
			continue
		}
		if s.ClaimName() != "mine" {
			t.Errorf("%s: ClaimName() = %q; want mine (the create may have been applied: it was)", name, s.ClaimName())
		}
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("%s: Close = %v", name, err)
		}
		if claimExists(t, s, "mine") {
			t.Errorf("%s: the claim made by a create answered %v survives Close: leaked", name, answer)
		}
	}
}

func TestAnAutoNamedCreateAnsweredByA5xxIsDeletedAgain(t *testing.T) {
	for name, answer := range fiveHundreds() {
		s, dyn := fakeCluster(t)
		s.opts.WarmPoolName = "pool"
		applyThenAnswer(dyn, answer, nil)
		if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
			t.Errorf("%s: Open = %v; want ErrClaimFailed", name, err)
			continue
		}
		if claimExists(t, s, "sandbox-claim-x1") {
			t.Errorf("%s: the auto-named claim made by a create answered %v was left behind", name, answer)
		}
	}
}

// A 4xx refuses the create: nothing is looked for, nothing adopted, the handle says it did not create it.
func TestACreateRefusedWithA4xxIsNotLookedFor(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(claimsResource, "mine", errors.New("no"))
	})
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) || !apierrors.IsForbidden(err) {
		t.Fatalf("Open = %v; want the refusal", err)
	}
	for _, a := range dyn.Actions() {
		if a.GetVerb() == "get" || a.GetVerb() == "list" {
			t.Errorf("a refused create was looked for: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if len(s.lostStamps()) != 0 {
		t.Errorf("a refused create was remembered as possibly applied: %v", s.lostStamps())
	}
}

// Two creates of the same name within one clock tick carry the same client-first-requested-at: the one whose
// answer was lost must not adopt (and later delete) the other's claim. Stored here: this handle's request,
// but with another request's id - the other handle's claim, made within the same tick.
func TestAnUnansweredCreateDoesNotAdoptAClaimOfTheSameTick(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	othersClaim := func(obj *unstructured.Unstructured) {
		a := obj.GetAnnotations()
		a[ClientRequestIDAnnotation] = "another-handles-request"
		obj.SetAnnotations(a)
	}
	applyThenAnswer(dyn, context.DeadlineExceeded, othersClaim)
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("Open = %v", err)
	}
	if s.ClaimName() != "" {
		t.Errorf("ClaimName() = %q: adopted the claim another handle made within the same clock tick", s.ClaimName())
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("Close = %v", err)
	}
	if !claimExists(t, s, "mine") {
		t.Error("Close deleted the claim another handle made within the same clock tick")
	}
}

func TestEveryCreateCarriesItsOwnRequestID(t *testing.T) {
	now := time.Now()
	o := Options{WarmPoolName: "pool", ClaimName: "mine"}
	a := buildClaim(&o, now, newClaimRequestID(), "").GetAnnotations()[ClientRequestIDAnnotation]
	b := buildClaim(&o, now, newClaimRequestID(), "").GetAnnotations()[ClientRequestIDAnnotation]
	if len(a) < 16 || a == b {
		t.Errorf("request ids of two creates in the same instant: %q, %q; want two random ids", a, b)
	}
}

// Close that fails to delete the claim of a lost create (matched by its stamps) says so, and can be retried.
func TestCloseReportsAClaimOfALostCreateItCouldNotDelete(t *testing.T) {
	s0, dyn := fakeCluster(t)
	s := explicitHandle(t, s0)
	var sent runtime.Object
	dyn.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sent = a.(k8stesting.CreateAction).GetObject()
		return true, nil, context.DeadlineExceeded // not applied yet
	})
	if err := s.Open(context.Background()); !errors.Is(err, ErrClaimFailed) {
		t.Fatalf("Open = %v", err)
	}
	if err := dyn.Tracker().Create(claimsGVR, sent, "ns"); err != nil { // applied now
		t.Fatal(err)
	}
	failDeletes := true
	dyn.PrependReactor("delete", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if failDeletes {
			return true, nil, apierrors.NewServiceUnavailable("the API server is restarting")
		}
		return false, nil, nil
	})
	err := s.Close(context.Background())
	if !errors.Is(err, ErrOrphanedClaim) || !strings.Contains(err.Error(), "mine") {
		t.Errorf("Close = %v; want ErrOrphanedClaim naming the claim it could not delete", err)
	}
	failDeletes = false
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("retried Close = %v", err)
	}
	if _, err := s.k8s.claims("ns").Get(context.Background(), "mine", metav1.GetOptions{}); !isNotFound(err) {
		t.Errorf("the claim of the lost create after a retried Close: %v; want it deleted", err)
	}
}
