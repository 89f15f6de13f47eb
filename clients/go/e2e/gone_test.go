//go:build e2e

package e2e

import (
	"context"
	"errors"
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
	name := sb.SandboxName()
	if err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Delete(ctx, sb.ClaimName(), metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the claim: %v", err)
	}
	// Gone with its pod (the garbage collector deletes the pod after the Sandbox; until then the pod, still
	// Ready, serves the handle's requests, as it should).
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
	// Resumed (the pool's pods keep no volume, so the file itself is gone): the handle reaches the new pod.
	setOperatingMode(t, ctx, name, "Running")
	if _, err := sb.Exists(ctx, "kept.txt"); err != nil {
		t.Errorf("a call after the resume: %v", err)
	}
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
