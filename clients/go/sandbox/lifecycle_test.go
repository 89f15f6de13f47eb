package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/rest"
)

// lifecycleCluster: a handle bound to claim c1 / Sandbox sb in a fake cluster that also serves SandboxArchives.
func lifecycleCluster(t *testing.T, objs ...runtime.Object) (*Sandbox, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		claimsGVR: "SandboxClaimList", sandboxesGVR: "SandboxList", archivesGVR: "SandboxArchiveList",
	}, objs...)
	o := Options{Quiet: true, SandboxReadyTimeout: 2 * time.Second, Namespace: "ns"}
	o.setDefaults()
	s := newSandbox(o, &K8sHelper{Config: &rest.Config{}, Dynamic: dyn, log: logr.Discard()})
	s.claimName, s.sandboxName = "c1", "sb"
	return s, dyn
}

func lifecycleClaim(spec map[string]any, conds ...map[string]any) *unstructured.Unstructured {
	c := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", nil)
	c.Object["spec"] = spec
	if len(conds) > 0 {
		list := make([]any, 0, len(conds))
		for _, cond := range conds {
			list = append(list, cond)
		}
		c.Object["status"] = map[string]any{"conditions": list}
	}
	return c
}

func hibernatedArchive(shutdownTime string, annotations map[string]string) *unstructured.Unstructured {
	a := unstructuredObj("lifecycle.agents.x-k8s.io/v1alpha1", "SandboxArchive", "sb", nil)
	a.Object["spec"] = map[string]any{"sandbox": map[string]any{"spec": map[string]any{"shutdownTime": shutdownTime}}}
	a.SetAnnotations(annotations)
	return a
}

// Until December 6 Resume set a Sandbox under an expired claim Running and waited for it (the claim
// controller deletes it instead): SandboxReadyTimeout, or "disappeared". Now it is refused before any write.
func TestResumeUnderAnExpiredClaimIsRefusedAtOnce(t *testing.T) {
	past := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	for name, claim := range map[string]*unstructured.Unstructured{
		"shutdownTime passed": lifecycleClaim(map[string]any{"lifecycle": map[string]any{
			"shutdownTime": past.Format(time.RFC3339), "shutdownPolicy": "Retain"}}),
		// the CRD's date-time format admits a lowercase z and t (every other reader parses them); until
		// December 6 this SDK could not, and such a claim looked live
		"shutdownTime passed, lowercase z": lifecycleClaim(map[string]any{"lifecycle": map[string]any{
			"shutdownTime": strings.Replace(past.Format(time.RFC3339), "Z", "z", 1)}}),
		"shutdownTime passed, lowercase t and z": lifecycleClaim(map[string]any{"lifecycle": map[string]any{
			"shutdownTime": strings.ToLower(past.Format(time.RFC3339Nano))}}),
		"ttl after finished, lowercase": lifecycleClaim(map[string]any{"lifecycle": map[string]any{"ttlSecondsAfterFinished": int64(30)}},
			map[string]any{"type": "Finished", "status": "True",
				"lastTransitionTime": strings.ToLower(past.Add(-time.Minute).Format(time.RFC3339))}),
		"ttl after finished": lifecycleClaim(map[string]any{"lifecycle": map[string]any{"ttlSecondsAfterFinished": int64(30)}},
			map[string]any{"type": "Finished", "status": "True", "lastTransitionTime": past.Add(-time.Minute).Format(time.RFC3339)}),
	} {
		suspended := sandboxObj("10.1.1.1", "Suspended", false)
		s, dyn := lifecycleCluster(t, claim)
		if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(), suspended, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s.sandboxName = "sb"
		start := time.Now()
		err := s.Resume(context.Background())
		var ce *ConditionError
		if !errors.As(err, &ce) || ce.Reason != "ClaimExpired" || !errors.Is(err, ErrClaimFailed) || !errors.Is(err, ErrSandboxDeleted) {
			t.Errorf("%s: Resume = %v; want a ClaimExpired *ConditionError, also ErrSandboxDeleted", name, err)
			continue
		}
		if strings.HasPrefix(name, "shutdownTime passed") && !strings.Contains(err.Error(), "expired at "+past.Format(time.RFC3339)) {
			t.Errorf("%s: %v does not name the claim's expiry", name, err)
		}
		if waited := time.Since(start); waited >= s.opts.SandboxReadyTimeout {
			t.Errorf("%s: Resume waited %v", name, waited)
		}
		sb, _ := dyn.Resource(sandboxesGVR).Namespace("ns").Get(context.Background(), "sb", metav1.GetOptions{})
		if mode, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode"); mode != "Suspended" {
			t.Errorf("%s: the Sandbox was written (operatingMode %q)", name, mode)
		}
	}
}

func TestResumeOfAHibernatedSandboxSaysSo(t *testing.T) {
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	earlier := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	lowerZ := strings.Replace(earlier, "Z", "z", 1)
	lowerTZ := strings.ToLower(time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano))
	live := lifecycleClaim(map[string]any{"lifecycle": map[string]any{"shutdownTime": later}})
	for _, tc := range []struct {
		name    string
		archive *unstructured.Unstructured
		reason  string
		text    string
	}{
		{"marked expired-at", hibernatedArchive(later, map[string]string{ExpiredAtAnnotation: earlier}), "SandboxExpired",
			ExpiredAtAnnotation + "=" + earlier},
		{"shutdownTime passed", hibernatedArchive(earlier, nil), "SandboxExpired", "its shutdownTime " + earlier + " passed"},
		// admitted by the CRD's date-time format; until December 6 reported "hibernated ... restorable"
		{"shutdownTime passed, lowercase z", hibernatedArchive(lowerZ, nil), "SandboxExpired",
			"its shutdownTime " + lowerZ + " passed"},
		{"shutdownTime passed, lowercase t and z", hibernatedArchive(lowerTZ, nil), "SandboxExpired",
			"its shutdownTime " + lowerTZ + " passed"},
		{"restorable, lowercase t and z", hibernatedArchive(strings.ToLower(later), nil), "",
			"is hibernated (its SandboxArchive exists)"},
		{"restorable", hibernatedArchive(later, nil), "", "is hibernated (its SandboxArchive exists)"},
		{"no archive", nil, "", "Sandbox sb: sandbox was deleted"},
	} {
		objs := []runtime.Object{live}
		if tc.archive != nil {
			objs = append(objs, tc.archive)
		}
		s, _ := lifecycleCluster(t, objs...)
		err := s.Resume(context.Background())
		if !errors.Is(err, ErrSandboxDeleted) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: Resume = %v; want ErrSandboxDeleted saying %q", tc.name, err, tc.text)
		}
		var ce *ConditionError
		if got := errors.As(err, &ce); got != (tc.reason != "") || (got && ce.Reason != tc.reason) {
			t.Errorf("%s: Resume = %v; want condition reason %q", tc.name, err, tc.reason)
		}
	}
}

func TestClaimExpiryFollowsTheEarliestDeadline(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	at := now.Add(time.Minute)
	claim := lifecycleClaim(map[string]any{"lifecycle": map[string]any{
		"shutdownTime": at.Format(time.RFC3339), "ttlSecondsAfterFinished": int64(10)}},
		map[string]any{"type": "Finished", "status": "True", "lastTransitionTime": now.Format(time.RFC3339)})
	if expired, when := claimExpiry(claim, now); expired || !when.Equal(now.Add(10*time.Second)) {
		t.Errorf("claimExpiry at finish = %v, %v; want not yet, due %v", expired, when, now.Add(10*time.Second))
	}
	if expired, _ := claimExpiry(claim, now.Add(10*time.Second)); !expired {
		t.Error("claimExpiry after the ttl: not expired")
	}
	if expired, when := claimExpiry(lifecycleClaim(map[string]any{}), now); expired || !when.IsZero() {
		t.Errorf("claimExpiry without a deadline = %v, %v", expired, when)
	}
}

// A Ready=False/ClaimExpired condition alone is not an expiry: it lags behind a shutdownTime moved later,
// and the claim controller, the lifecycle controller, the CLI, routers and the Python SDK do not read it.
// Until December 6 this SDK did, and refused to resume such a claim's Sandbox.
func TestClaimExpiryDoesNotReadTheClaimExpiredCondition(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	mark := map[string]any{"type": "Ready", "status": "False", "reason": "ClaimExpired"}
	moved := lifecycleClaim(map[string]any{"lifecycle": map[string]any{
		"shutdownTime": now.Add(time.Hour).Format(time.RFC3339)}}, mark)
	if expired, when := claimExpiry(moved, now); expired || !when.Equal(now.Add(time.Hour)) {
		t.Errorf("claimExpiry of a marked claim whose shutdownTime moved later = %v, %v; want not yet, due %v",
			expired, when, now.Add(time.Hour))
	}
	if expired, when := claimExpiry(lifecycleClaim(map[string]any{}, mark), now); expired || !when.IsZero() {
		t.Errorf("claimExpiry of a marked claim without a deadline = %v, %v; want never", expired, when)
	}
}

func TestParseTimeReadsWhatTheCRDsAdmit(t *testing.T) {
	want := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for text, at := range map[string]time.Time{
		"2027-01-01T00:00:00Z":            want,
		"2027-01-01T00:00:00z":            want,
		"2027-01-01t00:00:00z":            want,
		"2027-01-01t00:00:00Z":            want,
		" 2027-01-01T00:00:00Z ":          want,
		"2027-01-01T00:00:00.123456789z":  want.Add(123456789),
		"2027-01-01T00:00:00.5Z":          want.Add(500 * time.Millisecond),
		"2027-01-01t01:30:00+01:30":       want,
		"2026-12-31T19:00:00.000-05:00":   want,
		"2027-01-01T00:00:00.1234567891Z": want.Add(123456789),
	} {
		got, err := parseTime(text)
		if err != nil || !got.Equal(at) {
			t.Errorf("parseTime(%q) = %v, %v; want %v", text, got, err, at)
		}
	}
	for _, text := range []string{"", "2027-01-01", "2027-01-01T00:00:00", "2027-01-01 00:00:00Z", "soon", "<nil>"} {
		if got, err := parseTime(text); err == nil {
			t.Errorf("parseTime(%q) = %v; want an error", text, got)
		}
	}
}
