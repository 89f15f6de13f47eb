//go:build e2e

package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// Probe of December 6 (many handles, Ctrl-C): Close during an Open deleted nothing and the Open then
// connected the closed handle (its claim leaked); DeleteAll missed handles still being created; through the
// router a Run in flight after Close's drain was not cut, and returned exit -15 with a nil error once the
// claim's deletion killed its command.

// liveGoClaims counts the Go client's claims in the namespace not being deleted.
func liveGoClaims(t *testing.T) int {
	t.Helper()
	list, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: sandbox.CreatedByLabel + "=go-client"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range list.Items {
		if c.GetDeletionTimestamp() == nil {
			n++
		}
	}
	return n
}

// Not parallel: it counts the namespace's claims.
func TestCloseDuringOpenLeavesNoClaimAndNoConnection(t *testing.T) {
	ctx := ctxFor(t, 5*time.Minute)
	before := liveGoClaims(t)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	// from 2 ms on the Open has begun when Close comes (a Close before an Open leaves the handle reusable)
	for _, d := range []time.Duration{2 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond,
		60 * time.Millisecond, 120 * time.Millisecond, 250 * time.Millisecond} {
		sb, err := sandbox.New(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- sb.Open(ctx) }()
		time.Sleep(d)
		if err := sb.Close(ctx); err != nil {
			t.Errorf("delay %v: Close = %v", d, err)
		}
		oerr := <-done
		if oerr != nil && !errors.Is(oerr, sandbox.ErrNotReady) {
			t.Errorf("delay %v: Open = %v; want nil (done before Close) or ErrNotReady (closed during Open)", d, oerr)
		}
		if sb.IsReady() || sb.ClaimName() != "" {
			t.Errorf("delay %v: after Close IsReady %v, ClaimName %q", d, sb.IsReady(), sb.ClaimName())
		}
		if _, err := sb.Run(ctx, "echo still-usable"); !errors.Is(err, sandbox.ErrNotReady) {
			t.Errorf("delay %v: Run after Close = %v; want ErrNotReady", d, err)
		}
	}
	if after := liveGoClaims(t); after != before {
		t.Errorf("%d claims of the Go client before, %d after: Close during Open leaked", before, after)
	}
}

// Not parallel: it counts the namespace's claims.
func TestDeleteAllDuringCreatesLeavesNoClaim(t *testing.T) {
	ctx := ctxFor(t, 5*time.Minute)
	before := liveGoClaims(t)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	c, err := sandbox.NewClient(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteAll(context.Background()) })
	const n = 6
	done := make(chan error, n)
	for range n {
		go func() {
			_, err := c.CreateSandbox(ctx, "", "")
			done <- err
		}()
	}
	time.Sleep(120 * time.Millisecond)
	if err := c.DeleteAll(ctx); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	for range n {
		if err := <-done; err != nil && !errors.Is(err, sandbox.ErrNotReady) {
			t.Errorf("CreateSandbox = %v; want nil or ErrNotReady (closed during Open)", err)
		}
	}
	if keys := c.ListActiveSandboxes(); len(keys) != 0 {
		t.Errorf("ListActiveSandboxes after DeleteAll = %v; DeleteAll closes the handles being created too", keys)
	}
	if after := liveGoClaims(t); after != before {
		t.Errorf("%d claims of the Go client before, %d after: DeleteAll during creates leaked", before, after)
	}
}

func TestRouterRunCutByCloseIsTransportClosed(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	opts.CleanupTimeout = 4 * time.Second
	sb := open(t, opts)
	type out struct {
		res *sandbox.ExecutionResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := sb.Run(ctx, "sleep 20")
		done <- out{res, err}
	}()
	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	if err := sb.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	select {
	case o := <-done:
		if !errors.Is(o.err, sandbox.ErrNotReady) || !errors.Is(o.err, sandbox.ErrTransportClosed) {
			t.Errorf("Run cut by Close = %+v, %v; want ErrNotReady wrapping ErrTransportClosed", o.res, o.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run still running %v after Close began", time.Since(start))
	}
}
