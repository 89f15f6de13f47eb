package sandbox

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Suspend and Resume undone by another writer (review of December 6, as the Python SDK's fix 03fabe5): a
// lifecycle router resumes an auto-resume Sandbox still in use within a second of a suspend; the idle
// suspend overtakes a resume. Both used to wait out SandboxReadyTimeout and end with ErrTimeout.

const (
	testResumeReason  = "lifecycle.agents.x-k8s.io/resume-reason"
	testResumedAt     = "lifecycle.agents.x-k8s.io/resumed-at"
	testSuspendReason = "lifecycle.agents.x-k8s.io/suspend-reason"
	testSuspendedAt   = "lifecycle.agents.x-k8s.io/suspended-at"
	testHibernate     = "lifecycle.agents.x-k8s.io/hibernate"
)

// modeSandbox is Sandbox sb at generation 3 in mode (Running: Ready on 127.0.0.1; Suspended: no pod),
// its conditions observed at that generation, with annotations.
func modeSandbox(mode string, annotations map[string]string) *unstructured.Unstructured {
	sb := sandboxObj("127.0.0.1", mode, mode != "Suspended")
	sb.SetGeneration(3)
	sb.SetAnnotations(annotations)
	ready, suspended := "True", "False"
	if mode == "Suspended" {
		ready, suspended = "False", "True"
		delete(sb.Object["status"].(map[string]any), "podIPs")
	}
	sb.Object["status"].(map[string]any)["conditions"] = []any{
		map[string]any{"type": "Ready", "status": ready, "reason": "DependenciesReady", "observedGeneration": int64(3)},
		map[string]any{"type": "Suspended", "status": suspended, "reason": "x", "observedGeneration": int64(3)},
	}
	return sb
}

// writers makes the fake API server bump metadata.generation when a patch changes spec (as it does for a
// CRD), and runs then (if not nil) on the stored object right after the handle's patch, as another writer
// who got there before the controller did: its change is stored, the handle's patch answer is its own.
func writers(t *testing.T, dyn *dynamicfake.FakeDynamicClient, then func(obj *unstructured.Unstructured)) {
	t.Helper()
	tracker := dyn.Tracker()
	dyn.PrependReactor("patch", "sandboxes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		name := action.(k8stesting.PatchAction).GetName()
		before, err := tracker.Get(sandboxesGVR, "ns", name)
		if err != nil {
			return true, nil, err
		}
		_, ret, err := k8stesting.ObjectReaction(tracker)(action)
		if err != nil {
			return true, nil, err
		}
		after := ret.(*unstructured.Unstructured).DeepCopy()
		if !reflect.DeepEqual(before.(*unstructured.Unstructured).Object["spec"], after.Object["spec"]) {
			after.SetGeneration(after.GetGeneration() + 1)
			if err := tracker.Update(sandboxesGVR, after, "ns"); err != nil {
				return true, nil, err
			}
		}
		ours := after.DeepCopy()
		if then != nil {
			then(after)
			if err := tracker.Update(sandboxesGVR, after, "ns"); err != nil {
				return true, nil, err
			}
		}
		return true, ours, nil
	})
}

// setBack is another writer's change: spec.operatingMode to mode at the next generation, with annotations
// (a nil value removes one).
func setBack(mode string, annotations map[string]any) func(obj *unstructured.Unstructured) {
	return func(obj *unstructured.Unstructured) {
		obj.SetGeneration(obj.GetGeneration() + 1)
		obj.Object["spec"] = map[string]any{"operatingMode": mode}
		a := obj.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		for k, v := range annotations {
			if v == nil {
				delete(a, k)
			} else {
				a[k] = v.(string)
			}
		}
		obj.SetAnnotations(a)
	}
}

func modeHandle(t *testing.T, sb *unstructured.Unstructured, then func(obj *unstructured.Unstructured)) *Sandbox {
	t.Helper()
	s := clusterHandle(t, Options{APIURL: "http://127.0.0.1:1"}, sandboxInfo{podName: "sb", podIP: "127.0.0.1"}, sb)
	s.opts.SandboxReadyTimeout = 3 * time.Second
	writers(t, fakeDynamic(s), then)
	return s
}

func TestASuspendUndoneByAnotherWriterFailsAtOnce(t *testing.T) {
	const at = "2026-12-06T16:00:01.000000Z"
	for _, tc := range []struct {
		name        string
		annotations map[string]string // on the Sandbox before the suspend
		writer      map[string]any
		changedBy   string
		text        string
	}{
		{"a lifecycle router's auto-resume", nil,
			map[string]any{testResumeReason: "Request", testResumedAt: at}, "Request",
			"Sandbox ns/sb was set back to Running before it was Suspended: " + testResumeReason +
				": Request (resumed-at " + at + "): a lifecycle router resumed it for a request - it asks for " +
				"auto-resume (lifecycle.agents.x-k8s.io/auto-resume) and is still in use"},
		{"a manual resume", map[string]string{testResumeReason: "Request", testResumedAt: "2026-12-06T15:00:00Z"},
			map[string]any{testResumeReason: "Manual", testResumedAt: at}, "Manual",
			testResumeReason + ": Manual (resumed-at " + at + "): it was resumed by hand"},
		// the resume-reason left by an earlier resume is not cited
		{"kubectl", map[string]string{testResumeReason: "Request", testResumedAt: "2026-12-06T15:00:00Z"},
			nil, "", "Sandbox ns/sb was set back to Running before it was Suspended, by a writer that recorded no resume-reason (kubectl?)"},
	} {
		s := modeHandle(t, modeSandbox("Running", tc.annotations), setBack("Running", tc.writer))
		start := time.Now()
		err := s.Suspend(context.Background())
		elapsed := time.Since(start)
		var mc *ModeChangedError
		if !errors.Is(err, ErrModeChanged) || !errors.As(err, &mc) || errors.Is(err, ErrTimeout) {
			t.Errorf("%s: Suspend = %v (after %s); want ErrModeChanged", tc.name, err, elapsed)
			continue
		}
		if mc.OperatingMode != "Running" || mc.Want != "Suspended" || mc.ChangedBy != tc.changedBy ||
			mc.Namespace != "ns" || mc.Name != "sb" {
			t.Errorf("%s: %+v; want Running, wanted Suspended, changed by %q", tc.name, *mc, tc.changedBy)
		}
		if !strings.Contains(err.Error(), tc.text) || !strings.HasPrefix(err.Error(), "sandbox[ns/claim-1]: ") {
			t.Errorf("%s: %v; want it to say %q", tc.name, err, tc.text)
		}
		if elapsed >= time.Second {
			t.Errorf("%s: Suspend took %s; want at once", tc.name, elapsed)
		}
	}
}

func TestAResumeOvertakenByAnIdleSuspendFailsAtOnce(t *testing.T) {
	const at = "2026-12-06T16:00:02.000000Z"
	s := modeHandle(t, modeSandbox("Suspended", map[string]string{testSuspendReason: "Manual"}),
		setBack("Suspended", map[string]any{testSuspendReason: "Idle", testSuspendedAt: at}))
	start := time.Now()
	err := s.Resume(context.Background())
	var mc *ModeChangedError
	if !errors.Is(err, ErrModeChanged) || !errors.As(err, &mc) || mc.ChangedBy != "Idle" || mc.OperatingMode != "Suspended" {
		t.Fatalf("Resume = %v (after %s); want ErrModeChanged, changed by Idle", err, time.Since(start))
	}
	want := "Sandbox ns/sb was set back to Suspended before it was Running: " + testSuspendReason +
		": Idle (suspended-at " + at + "): the lifecycle controller suspended it as idle"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Resume = %v; want it to say %q", err, want)
	}
	if time.Since(start) >= time.Second {
		t.Errorf("Resume took %s; want at once", time.Since(start))
	}
}

// A later write that keeps the mode (another client's suspend) is waited through: the controller confirms
// the Suspended state at the later generation. A Suspended=True of an earlier generation (before the
// handle's write) is not the answer.
func TestALaterWriteThatKeepsTheModeIsWaitedThrough(t *testing.T) {
	sb := modeSandbox("Running", nil)
	sb.Object["status"].(map[string]any)["conditions"] = []any{
		map[string]any{"type": "Ready", "status": "True", "reason": "DependenciesReady", "observedGeneration": int64(3)},
		// stale: from an earlier suspend, not yet rewritten for generation 3
		map[string]any{"type": "Suspended", "status": "True", "reason": "x", "observedGeneration": int64(2)},
	}
	s := modeHandle(t, sb, setBack("Suspended", map[string]any{testSuspendReason: "Manual", testSuspendedAt: "x"}))
	dyn := fakeDynamic(s)
	done := make(chan error, 1)
	go func() { done <- s.Suspend(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Suspend = %v before the controller confirmed it", err)
	case <-time.After(300 * time.Millisecond):
	}
	// the controller confirms generation 5 (the other writer's): suspended
	var once sync.Once
	for {
		obj, err := dyn.Tracker().Get(sandboxesGVR, "ns", "sb")
		if err != nil {
			t.Fatal(err)
		}
		u := obj.(*unstructured.Unstructured).DeepCopy()
		once.Do(func() {
			if u.GetGeneration() != 5 {
				t.Errorf("generation %d; want 5 (the handle's write, then the other writer's)", u.GetGeneration())
			}
		})
		u.Object["status"] = map[string]any{"conditions": []any{
			map[string]any{"type": "Ready", "status": "False", "reason": "SandboxSuspended", "observedGeneration": int64(5)},
			map[string]any{"type": "Suspended", "status": "True", "reason": "PodDeleted", "observedGeneration": int64(5)},
		}}
		if err := dyn.Tracker().Update(sandboxesGVR, u, "ns"); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Suspend = %v; want it confirmed", err)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Deleted and expired are told first: a Sandbox being deleted or past its shutdownTime will never be
// suspended, whoever set its mode back.
func TestSuspendOfADeletedOrExpiredSandboxSaysSoFirst(t *testing.T) {
	undo := setBack("Running", map[string]any{testResumeReason: "Request", testResumedAt: "x"})
	deleting := func(obj *unstructured.Unstructured) {
		undo(obj)
		now := metav1.Now()
		obj.SetDeletionTimestamp(&now)
	}
	expired := func(obj *unstructured.Unstructured) {
		undo(obj)
		obj.Object["spec"].(map[string]any)["shutdownTime"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	}
	for name, then := range map[string]func(*unstructured.Unstructured){"being deleted": deleting, "expired": expired} {
		s := modeHandle(t, modeSandbox("Running", nil), then)
		err := s.Suspend(context.Background())
		if errors.Is(err, ErrModeChanged) || errors.Is(err, ErrTimeout) {
			t.Errorf("%s: Suspend = %v; want the Sandbox's end named", name, err)
			continue
		}
		var ce *ConditionError
		switch name {
		case "being deleted":
			if !errors.Is(err, ErrSandboxDeleted) || !strings.Contains(err.Error(), "is being deleted") {
				t.Errorf("%s: Suspend = %v; want ErrSandboxDeleted", name, err)
			}
		default:
			if !errors.As(err, &ce) || ce.Reason != "SandboxExpired" || !strings.Contains(err.Error(), "has expired") {
				t.Errorf("%s: Suspend = %v; want a SandboxExpired *ConditionError", name, err)
			}
		}
	}
}

// Suspend and Resume record who and when, as the CLI and the Python SDK do (docs/lifecycle.md): the lifecycle
// controller reads them, and a Resume cancels a pending hibernation (it used to stay, and the Sandbox was
// suspended and archived again right after it was resumed).
func TestSuspendAndResumeRecordWhoAndWhen(t *testing.T) {
	a := writtenBy(t, modeSandbox("Running", map[string]string{testSuspendReason: "Idle", testSuspendedAt: "old"}),
		(*Sandbox).Suspend)
	if a[testSuspendReason] != "Manual" || a[testSuspendedAt] == "old" {
		t.Errorf("after Suspend: annotations %v; want suspend-reason Manual and a new suspended-at", a)
	}
	if _, err := parseTime(a[testSuspendedAt]); err != nil {
		t.Errorf("suspended-at %q: %v", a[testSuspendedAt], err)
	}
	a = writtenBy(t, modeSandbox("Suspended", map[string]string{testHibernate: "true"}), (*Sandbox).Resume)
	if _, pending := a[testHibernate]; pending || a[testResumeReason] != "Manual" {
		t.Errorf("after Resume: annotations %v; want resume-reason Manual, no hibernate", a)
	}
	if _, err := parseTime(a[testResumedAt]); err != nil {
		t.Errorf("resumed-at %q: %v", a[testResumedAt], err)
	}
}

// writtenBy runs call (Suspend or Resume) on a handle of sb until it has written the Sandbox (generation 4),
// then cancels it; the Sandbox's annotations then.
func writtenBy(t *testing.T, sb *unstructured.Unstructured, call func(*Sandbox, context.Context) error) map[string]string {
	t.Helper()
	s := modeHandle(t, sb, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = call(s, ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, err := fakeDynamic(s).Tracker().Get(sandboxesGVR, "ns", "sb")
		if u := got.(*unstructured.Unstructured); err == nil && u.GetGeneration() == 4 {
			return u.GetAnnotations()
		}
	}
	t.Fatal("nothing was written")
	return nil
}
