package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Second review of December 6: Suspend ended every started Process's stream right after its patch, before
// the suspend was confirmed, so a suspend set back to Running (ErrModeChanged) still killed the commands;
// Resume ended them always, also on a connected handle whose Sandbox was Running and Ready all along. The
// Python SDK's suspend() and resume() leave in-flight streams alone (a runtime kills a command when its
// stream ends).

// streamingModeHandle is a connected sandboxd handle (a real gRPC connection) bound to Sandbox sb in a fake
// cluster whose API server stores patches as writers does (then: another writer's change after the handle's).
func streamingModeHandle(t *testing.T, sb *unstructured.Unstructured, then func(obj *unstructured.Unstructured)) *Sandbox {
	t.Helper()
	s := grpcHandle(t, newFakeProcessService(), 10*time.Second)
	s0, dyn := fakeCluster(t)
	if _, err := dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(), sb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writers(t, dyn, then)
	s.k8s = s0.k8s
	s.opts.Namespace, s.opts.SandboxReadyTimeout = "ns", 3*time.Second
	s.sandboxName, s.info = "sb", sandboxInfo{podName: "sb", podIP: "127.0.0.1"}
	return s
}

// startedProcess starts the fake's echo process and reads its greeting.
func startedProcess(t *testing.T, s *Sandbox) *Process {
	t.Helper()
	p, err := s.Start(context.Background(), "server")
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := p.Recv(); err != nil || string(ev.Data) != "hello" {
		t.Fatalf("first event = %+v, %v", ev, err)
	}
	return p
}

// stillStreams says whether p's stream still carries its command's output: it echoes what it is sent.
func stillStreams(t *testing.T, p *Process) error {
	t.Helper()
	if err := p.WriteStdin(context.Background(), []byte("ping")); err != nil {
		return err
	}
	ev, err := p.Recv()
	if err != nil {
		return err
	}
	if string(ev.Data) != "ping" {
		return errors.New("echo: " + string(ev.Data))
	}
	return nil
}

func TestASuspendSetBackToRunningLeavesTheStreamsAlone(t *testing.T) {
	s := streamingModeHandle(t, modeSandbox("Running", nil),
		setBack("Running", map[string]any{testResumeReason: "Request", testResumedAt: "2026-12-06T16:00:01Z"}))
	p := startedProcess(t, s)
	defer p.Close()
	if err := s.Suspend(context.Background()); !errors.Is(err, ErrModeChanged) {
		t.Fatalf("Suspend = %v; want ErrModeChanged", err)
	}
	if err := stillStreams(t, p); err != nil {
		t.Errorf("the stream after a suspend that was set back to Running: %v; want it alive", err)
	}
	if !s.IsReady() {
		t.Error("IsReady() = false after a suspend that was set back: the handle still reaches its Sandbox")
	}
}

// A confirmed suspend ends them (the Pod is gone), as before.
func TestAConfirmedSuspendEndsTheStreams(t *testing.T) {
	confirm := func(obj *unstructured.Unstructured) {
		g := obj.GetGeneration()
		obj.Object["status"] = map[string]any{"conditions": []any{
			map[string]any{"type": "Ready", "status": "False", "reason": "SandboxSuspended", "observedGeneration": g},
			map[string]any{"type": "Suspended", "status": "True", "reason": "PodDeleted", "observedGeneration": g},
		}}
	}
	s := streamingModeHandle(t, modeSandbox("Running", nil), confirm)
	p := startedProcess(t, s)
	defer p.Close()
	if err := s.Suspend(context.Background()); err != nil {
		t.Fatalf("Suspend = %v", err)
	}
	if err := stillStreams(t, p); !errors.Is(err, ErrTransportClosed) {
		t.Errorf("the stream after a confirmed suspend: %v; want ErrTransportClosed", err)
	}
	if s.IsReady() {
		t.Error("IsReady() after a confirmed suspend")
	}
}

// Resume of a connected handle whose Sandbox is Running and Ready keeps the transport and its streams.
func TestResumeOfARunningSandboxLeavesTheStreamsAlone(t *testing.T) {
	s := streamingModeHandle(t, modeSandbox("Running", nil), nil)
	p := startedProcess(t, s)
	defer p.Close()
	if err := s.Resume(context.Background()); err != nil {
		t.Fatalf("Resume = %v", err)
	}
	if err := stillStreams(t, p); err != nil {
		t.Errorf("the stream after Resume of a Running sandbox: %v; want it alive", err)
	}
	if !s.IsReady() {
		t.Error("IsReady() = false after Resume of a Running sandbox")
	}
	got, err := fakeDynamic(s).Tracker().Get(sandboxesGVR, "ns", "sb")
	if err != nil {
		t.Fatal(err)
	}
	if reason := got.(*unstructured.Unstructured).GetAnnotations()[testResumeReason]; reason != "Manual" {
		t.Errorf("resume-reason = %q; want the resume recorded (Manual) as before", reason)
	}
}
