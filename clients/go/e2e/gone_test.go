//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// A sandbox deleted behind its handle's back (another process, its claim's expiry): a file call ends with
// ErrSandboxDeleted, wrapping the router's 502, at the first re-read of the Sandbox. It spent its six
// attempts first (15.5 s of backoff, each attempt the router's own retries for a name it does not know).
func TestAFileCallToADeletedSandboxSaysSo(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	sb := openThroughTheRouterWithAFile(t, ctx)
	deleteBehindItsBack(t, ctx, sb)
	start := time.Now()
	_, err := sb.Read(ctx, "kept.txt")
	t.Logf("the read failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	var httpErr *sandbox.HTTPError
	if !errors.Is(err, sandbox.ErrSandboxDeleted) || !errors.As(err, &httpErr) || httpErr.StatusCode != http.StatusBadGateway {
		t.Fatalf("read from a deleted sandbox: %v; want ErrSandboxDeleted with the router's 502", err)
	}
	if errors.Is(err, sandbox.ErrRetriesExhausted) {
		t.Errorf("the attempts were spent first: %v", err)
	}
}

// Suspended behind its handle's back (the CLI, the idle-timeout controller) with a router that does not
// resume: a file call ends at the first re-read of the Sandbox with ErrNotReady, wrapping the router's 502,
// and says to resume it - not after six attempts.
func TestAFileCallToASuspendedSandboxSaysSo(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	sb := openThroughTheRouterWithAFile(t, ctx)
	name := sb.SandboxName()
	oldPod := sb.PodName()
	setOperatingMode(t, ctx, name, "Suspended")
	for {
		_, err := k8s.Dynamic.Resource(podsGVR).Namespace(cluster.Namespace).Get(ctx, oldPod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pod %s not deleted: %v", oldPod, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	_, err := sb.Read(ctx, "kept.txt")
	var httpErr *sandbox.HTTPError
	if !errors.Is(err, sandbox.ErrNotReady) || !errors.As(err, &httpErr) || httpErr.StatusCode != http.StatusBadGateway {
		t.Fatalf("read from a suspended sandbox: %v; want ErrNotReady with the router's 502", err)
	}
	if errors.Is(err, sandbox.ErrRetriesExhausted) || !strings.Contains(err.Error(), "is suspended") {
		t.Errorf("want the suspension named, without the attempts spent first: %v", err)
	}
	// a Run (one attempt) says so too (as the first call after a suspension, it got the bare 502 until
	// December 6; here the handle reads the Sandbox before sending it)
	if _, err := sb.Run(ctx, "true"); !errors.Is(err, sandbox.ErrNotReady) || !strings.Contains(err.Error(), "is suspended") {
		t.Errorf("run on a suspended sandbox: %v; want ErrNotReady naming the suspension", err)
	}
	// Resumed (the pool's pods keep no volume, so the file itself is gone): the handle reaches the new pod.
	setOperatingMode(t, ctx, name, "Running")
	if _, err := sb.Exists(ctx, "kept.txt"); err != nil {
		t.Errorf("a call after the resume: %v", err)
	}
}

// deleteBehindItsBack deletes the handle's claim as another process would, and waits until its Sandbox and
// pod are gone (the garbage collector deletes the pod after the Sandbox; until then the pod, still Ready,
// serves the handle's requests, as it should).
func deleteBehindItsBack(t *testing.T, ctx context.Context, sb *sandbox.Sandbox) {
	t.Helper()
	name := sb.SandboxName()
	if err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Delete(ctx, sb.ClaimName(), metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the claim: %v", err)
	}
	for _, gvr := range []schema.GroupVersionResource{sandboxesGVR, podsGVR} {
		for {
			_, err := k8s.Dynamic.Resource(gvr).Namespace(cluster.Namespace).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s %s not deleted: %v", gvr.Resource, name, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// The first call after the Sandbox was deleted behind the handle's back names it - also a Run or a Start
// (one attempt, where no next attempt re-read the Sandbox) through the router, and every call straight to
// the pod (ConnectivityInCluster), where sandboxd's Run and Start failed "Unavailable ... connection refused"
// and a Write spent six attempts, all matching no sentinel (probe of December 6).
func TestTheFirstCallAfterADeleteSaysSo(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	for _, mode := range []string{"router", "pod IP, sandboxd", "pod IP, legacy"} {
		for attempt := 1; ; attempt++ {
			failures, taker := firstCallsAfterADelete(t, ctx, mode)
			if len(failures) > 0 && taker != "" && attempt < 3 {
				// not the SDK's doing: the calls went to another sandbox (see firstCallsAfterADelete)
				t.Logf("%s: the deleted pod's address went to pod %s before the calls (%v); again", mode, taker, failures)
				continue
			}
			for _, f := range failures {
				t.Error(f)
			}
			break
		}
	}
}

// firstCallsAfterADelete opens a sandbox in mode, deletes it behind the handle's back, and makes the first
// calls after it; what went wrong. taker is, when something did, the pod that holds the deleted pod's address
// now (pod IP modes): the dev cluster hands a freed address to the next pod created (any test's), and a
// call straight to the address then reaches that pod - a real cluster reuses addresses too, only later.
func firstCallsAfterADelete(t *testing.T, ctx context.Context, mode string) (failures []string, taker string) {
	t.Helper()
	opts := baseOptions()
	switch mode {
	case "router":
		opts.APIURL = cluster.RouterURL
	case "pod IP, sandboxd":
		opts.Runtime, opts.Connectivity = sandbox.RuntimeSandboxd, sandbox.ConnectivityInCluster
	default:
		opts.Connectivity = sandbox.ConnectivityInCluster
	}
	sb := open(t, opts)
	if _, err := sb.Run(ctx, "true"); err != nil {
		t.Fatalf("%s: run before the delete: %v", mode, err)
	}
	ip, name := sb.PodIP(), sb.SandboxName()
	deleteBehindItsBack(t, ctx, sb)
	// the Run first: the first call after the delete (later ones may read the Sandbox before sending)
	for _, call := range []string{"run", "start", "write"} {
		start := time.Now()
		var err error
		switch call {
		case "run":
			_, err = sb.Run(ctx, "true")
		case "start":
			_, err = sb.Start(ctx, "true")
		default:
			err = sb.Write(ctx, "x", []byte("x"))
		}
		if !errors.Is(err, sandbox.ErrSandboxDeleted) || errors.Is(err, sandbox.ErrRetriesExhausted) {
			failures = append(failures, fmt.Sprintf("%s: %s after the delete (%s): %v; want ErrSandboxDeleted at once",
				mode, call, time.Since(start).Round(time.Millisecond), err))
		}
	}
	callsEnd := time.Now()
	if len(failures) > 0 && mode != "router" && ip != "" {
		pods, err := k8s.Dynamic.Resource(podsGVR).List(ctx, metav1.ListOptions{FieldSelector: "status.podIP=" + ip})
		if err == nil {
			for _, pod := range pods.Items {
				// created before the calls ended (the timestamp is in whole seconds: not after)
				if pod.GetName() != name && !pod.GetCreationTimestamp().After(callsEnd) {
					taker = pod.GetNamespace() + "/" + pod.GetName()
				}
			}
		}
	}
	return failures, taker
}

// openThroughTheRouterWithAFile opens a sandbox through the router and writes kept.txt into it (the call
// that proves the handle worked before its Sandbox changes behind its back).
func openThroughTheRouterWithAFile(t *testing.T, ctx context.Context) *sandbox.Sandbox {
	t.Helper()
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	sb := open(t, opts)
	if err := sb.Write(ctx, "kept.txt", []byte("x")); err != nil {
		t.Fatalf("write: %v", err)
	}
	return sb
}

// A Run sent once waits for its answer as long as the call lasts (WithTimeout here), not PerAttemptTimeout:
// the legacy runtime answers when the command ends, and a command quiet for longer than PerAttemptTimeout
// (60 s by default) failed "no response headers within the per-attempt timeout" and was killed (probe of
// December 6). A Process closed from another goroutine during a Recv says so (ErrProcessClosed), then again.
func TestAQuietRunOutlastsPerAttemptTimeout(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	opts.PerAttemptTimeout = time.Second
	sb := open(t, opts)
	res, err := sb.Run(ctx, "sh -c 'sleep 3; echo done'", sandbox.WithTimeout(30*time.Second))
	if err != nil || res.Stdout != "done\n" {
		t.Fatalf("a 3 s quiet Run with PerAttemptTimeout 1 s: %+v, %v", res, err)
	}
	p, err := sb.Start(ctx, "sleep 30")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { _ = p.Close() })
	if _, err := p.Recv(); !errors.Is(err, sandbox.ErrProcessClosed) || errors.Is(err, context.Canceled) {
		t.Errorf("Recv during Close: %v; want ErrProcessClosed", err)
	}
	if _, err := p.Recv(); !errors.Is(err, sandbox.ErrProcessClosed) {
		t.Errorf("Recv after Close: %v; want ErrProcessClosed", err)
	}
}
