//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// Suspend and Resume undone by another writer, and the advice for a suspended Sandbox, on the real control
// plane (review of December 6, as the Python SDK's fix 03fabe5; tests/integration/sdk/test_suspend_undone.py
// runs them with a lifecycle router, which this suite's fixture does not start: here the test is the other
// writer, and writes what a lifecycle router's resume and the lifecycle controller's idle suspend write).

// undoOnce watches Sandbox name and, the first time its spec.operatingMode is from, patches it to mode with
// annotations (what another writer records), at once. Closed channel: done (its error, if any).
func undoOnce(t *testing.T, ctx context.Context, name, from, mode string, annotations map[string]any) <-chan error {
	t.Helper()
	res := k8s.Dynamic.Resource(sandboxesGVR).Namespace(cluster.Namespace)
	w, err := res.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			if now, _, _ := unstructured.NestedString(obj.Object, "spec", "operatingMode"); now != from {
				continue
			}
			patch, _ := json.Marshal(map[string]any{
				"metadata": map[string]any{"annotations": annotations},
				"spec":     map[string]any{"operatingMode": mode},
			})
			_, err := res.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
			done <- err
			return
		}
		done <- errors.New("the watch ended before the Sandbox was " + from)
	}()
	return done
}

func stamp() string { return time.Now().UTC().Format(time.RFC3339Nano) }

// A Suspend that a lifecycle router undoes at once (an auto-resume Sandbox still in use: it sets the Sandbox
// Running again, resume-reason: Request) fails at once with ErrModeChanged naming it; it used to wait out
// SandboxReadyTimeout and end with ErrTimeout. The handle stays connected (since the second review of
// December 6; it used to be disconnected), and Resume brings it to the Sandbox as it is then.
func TestASuspendUndoneByARouterResumeFailsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	opts.SandboxReadyTimeout = 45 * time.Second
	sb := open(t, opts)
	at := stamp()
	undone := undoOnce(t, ctx, sb.SandboxName(), "Suspended", "Running", map[string]any{
		"lifecycle.agents.x-k8s.io/resume-reason": "Request", "lifecycle.agents.x-k8s.io/resumed-at": at})
	start := time.Now()
	err := sb.Suspend(ctx)
	elapsed := time.Since(start)
	if werr := <-undone; werr != nil {
		t.Fatalf("the other writer: %v", werr)
	}
	t.Logf("Suspend after %s: %v", elapsed.Round(time.Millisecond), err)
	var mc *sandbox.ModeChangedError
	if !errors.Is(err, sandbox.ErrModeChanged) || !errors.As(err, &mc) || errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("Suspend undone by a router's resume: %v; want ErrModeChanged", err)
	}
	if mc.ChangedBy != "Request" || mc.OperatingMode != "Running" || mc.Want != "Suspended" {
		t.Errorf("%+v; want changed by Request to Running", *mc)
	}
	want := "was set back to Running before it was Suspended: lifecycle.agents.x-k8s.io/resume-reason: Request " +
		"(resumed-at " + at + "): a lifecycle router resumed it for a request"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Suspend = %v; want it to say %q", err, want)
	}
	if elapsed > 20*time.Second {
		t.Errorf("Suspend took %s; want at once, not after SandboxReadyTimeout", elapsed)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("Resume after the undone Suspend: %v", err)
	}
	// The handle is connected again. Its first call may still meet the Suspend's half-done work: the Sandbox
	// can report Ready from its pod while that pod is being deleted (the Suspend reached the Sandbox
	// controller before the undo), and the router answers 502 until the new pod is Ready. A known gap
	// (closing note), so the call is retried for a while here rather than asserted at once.
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := sb.Run(ctx, "echo back")
		if err == nil && res.Stdout == "back\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Run after Resume: %+v, %v", res, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// A Resume overtaken by a suspend (the lifecycle controller's idle suspend) fails at once with
// ErrModeChanged naming it; it used to wait out SandboxReadyTimeout. Suspend and Resume record who and when.
func TestAResumeOvertakenByASuspendFailsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	opts.SandboxReadyTimeout = 45 * time.Second
	sb := open(t, opts)
	name := sb.SandboxName()
	if err := sb.Suspend(ctx); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	res := k8s.Dynamic.Resource(sandboxesGVR).Namespace(cluster.Namespace)
	obj, err := res.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := obj.GetAnnotations(); a["lifecycle.agents.x-k8s.io/suspend-reason"] != "Manual" || a["lifecycle.agents.x-k8s.io/suspended-at"] == "" {
		t.Errorf("after Suspend: annotations %v; want suspend-reason Manual and suspended-at", a)
	}
	at := stamp()
	undone := undoOnce(t, ctx, name, "Running", "Suspended", map[string]any{
		"lifecycle.agents.x-k8s.io/suspend-reason": "Idle", "lifecycle.agents.x-k8s.io/suspended-at": at})
	start := time.Now()
	err = sb.Resume(ctx)
	elapsed := time.Since(start)
	if werr := <-undone; werr != nil {
		t.Fatalf("the other writer: %v", werr)
	}
	t.Logf("Resume after %s: %v", elapsed.Round(time.Millisecond), err)
	var mc *sandbox.ModeChangedError
	if !errors.Is(err, sandbox.ErrModeChanged) || !errors.As(err, &mc) || mc.ChangedBy != "Idle" || mc.OperatingMode != "Suspended" {
		t.Fatalf("Resume overtaken by an idle suspend: %v; want ErrModeChanged, changed by Idle", err)
	}
	want := "was set back to Suspended before it was Running: lifecycle.agents.x-k8s.io/suspend-reason: Idle " +
		"(suspended-at " + at + "): the lifecycle controller suspended it as idle"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("Resume = %v; want it to say %q", err, want)
	}
	if elapsed > 20*time.Second {
		t.Errorf("Resume took %s; want at once, not after SandboxReadyTimeout", elapsed)
	}
	obj, err = res.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := obj.GetAnnotations(); a["lifecycle.agents.x-k8s.io/resume-reason"] != "Manual" || a["lifecycle.agents.x-k8s.io/resumed-at"] == "" {
		t.Errorf("after Resume: annotations %v; want resume-reason Manual and resumed-at", a)
	}
}

// A call that meets a suspended Sandbox through a router names what resume on request is missing: the
// Sandbox's opt-in when it has none, and a router running --sandbox-lifecycle (this one does not) when it
// asks for it. It used to say "or run the router with --sandbox-lifecycle" whatever the Sandbox asked for.
func TestASuspendedSandboxNamesWhatResumeOnRequestMisses(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	sb := openThroughTheRouterWithAFile(t, ctx)
	name := sb.SandboxName()
	setOperatingMode(t, ctx, name, "Suspended")
	res := k8s.Dynamic.Resource(sandboxesGVR).Namespace(cluster.Namespace)
	obj, err := res.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	template := "its SandboxTemplate"
	if ref := obj.GetAnnotations()["agents.x-k8s.io/sandbox-template-ref"]; ref != "" {
		template += " " + cluster.Namespace + "/" + ref
	}
	_, err = sb.Read(ctx, "kept.txt")
	want := `for resume on request, annotate the Sandbox or ` + template +
		` with lifecycle.agents.x-k8s.io/auto-resume: "true" (served by a router running --sandbox-lifecycle)`
	if !errors.Is(err, sandbox.ErrNotReady) || !strings.Contains(err.Error(), want) ||
		strings.Contains(err.Error(), "or run the router with --sandbox-lifecycle") {
		t.Errorf("read from a suspended Sandbox without the opt-in: %v\n  want ErrNotReady saying %q", err, want)
	}
	patch := []byte(`{"metadata":{"annotations":{"lifecycle.agents.x-k8s.io/auto-resume":"true"}}}`)
	if _, err := res.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = sb.Run(ctx, "true")
	want = `it asks to be resumed on request (lifecycle.agents.x-k8s.io/auto-resume: "true" on the Sandbox), ` +
		`but this request did not go through a router running --sandbox-lifecycle`
	if !errors.Is(err, sandbox.ErrNotReady) || !strings.Contains(err.Error(), want) {
		t.Errorf("run on a suspended Sandbox that asks for auto-resume: %v\n  want ErrNotReady saying %q", err, want)
	}
}
