//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// Probe of December 6: a handle named with Options.ClaimName deleted another owner's claim of that name on
// Close - after its own Open had failed "already exists", or without any Open - and that owner's next call
// got the router's 502.
func TestAHandleNeverDeletesAClaimItDidNotMake(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	name := fmt.Sprintf("owned-%d", time.Now().UnixNano())
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	opts.ClaimName = name
	a := open(t, opts)
	owner, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	b, err := sandbox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Open(ctx); !errors.Is(err, sandbox.ErrClaimFailed) || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second Open of the same ClaimName = %v; want ErrClaimFailed, already exists", err)
	}
	if err := b.Close(ctx); err != nil {
		t.Errorf("Close of the refused handle = %v", err)
	}
	never, err := sandbox.New(ctx, sandbox.Options{ClaimName: name, Namespace: cluster.Namespace, K8sHelper: k8s, Quiet: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := never.Close(ctx); err != nil {
		t.Errorf("Close of a never-opened handle = %v", err)
	}

	now, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil || now.GetUID() != owner.GetUID() || now.GetDeletionTimestamp() != nil {
		t.Fatalf("the owner's claim after the other handles' Close: %v (deleting: %v)", err,
			err == nil && now.GetDeletionTimestamp() != nil)
	}
	if res, err := a.Run(ctx, "echo still-mine"); err != nil || res.Stdout != "still-mine\n" {
		t.Errorf("the owner's Run = %+v, %v", res, err)
	}
}

// Probe of December 6: GetSandbox of a suspended Sandbox waited out its deadline (ErrTimeout) without a handle
// to Resume. Now: at once, the handle and no error (as the Python SDK); its calls say "is suspended ...: call
// Resume", and it resumes it.
func TestGetSandboxOfASuspendedSandboxResumesThroughItsHandle(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	sb := open(t, opts)
	if err := sb.Suspend(ctx); err != nil {
		t.Fatalf("Suspend: %v", err)
	}

	other, err := sandbox.NewClient(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := other.GetSandbox(ctx, sb.ClaimName(), "")
	if waited := time.Since(start); waited > 10*time.Second {
		t.Errorf("GetSandbox of a suspended Sandbox took %v", waited)
	}
	if err != nil {
		t.Fatalf("GetSandbox = %v; want the handle and no error", err)
	}
	if got == nil || got.SandboxName() != sb.SandboxName() || got.IsReady() {
		t.Fatalf("GetSandbox handle = %v; want one bound to %s, not connected", got, sb.SandboxName())
	}
	if _, err := got.Run(ctx, "true"); !errors.Is(err, sandbox.ErrNotReady) || !strings.Contains(err.Error(), "is suspended") {
		t.Errorf("Run on the suspended handle = %v; want ErrNotReady, is suspended", err)
	}
	if err := got.Resume(ctx); err != nil {
		t.Fatalf("Resume through the GetSandbox handle: %v", err)
	}
	// (files do not survive a suspend on the dev cluster: its Pods have no volumes)
	if res, err := got.Run(ctx, "echo back"); err != nil || res.Stdout != "back\n" {
		t.Errorf("Run after Resume: %+v, %v", res, err)
	}
	if keys := other.ListActiveSandboxes(); len(keys) != 1 || keys[0].ClaimName != sb.ClaimName() {
		t.Errorf("ListActiveSandboxes after Resume = %v", keys)
	}
	_ = got.Disconnect(context.Background()) // the first handle's cleanup deletes the claim
}

// Probe of December 6: on sandboxd, Close cut a Run in flight at once with gRPC's untyped "the client
// connection is closing"; now it lets it finish (at most CleanupTimeout/2), as on the legacy runtime.
func TestSandboxdCloseLetsARunInFlightFinish(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.Runtime = sandbox.RuntimeSandboxd
	opts.Connectivity = sandbox.ConnectivityInCluster
	sb := open(t, opts)
	claim := sb.ClaimName()
	type out struct {
		res *sandbox.ExecutionResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := sb.Run(ctx, "sleep 2; echo finished")
		done <- out{res, err}
	}()
	time.Sleep(500 * time.Millisecond)
	if err := sb.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	o := <-done
	if o.err != nil || o.res.Stdout != "finished\n" {
		t.Errorf("Run in flight during Close = %+v, %v; want it to finish", o.res, o.err)
	}
	assertClaimGone(t, claim)
}
