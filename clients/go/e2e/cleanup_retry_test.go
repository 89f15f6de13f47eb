//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// Probe of December 7: a CreateSandbox cancelled right after its claim was made, whose rollback DELETE failed
// once (a 500, a reset connection), returned no handle and ErrOrphanedClaim ("call Close") - and nothing
// tracked it: DeleteAll never deleted the claim, which held a warm-pool sandbox for good. A cancelled create
// whose answer was lost leaked silently when the search for its claim failed. A handle re-opened after Close
// stayed listed under its deleted claim.

// faults is a RoundTripper in front of the real API server: after a claim's POST went through it calls
// afterPost (and, with losePost, drops the answer); the next failDeletes DELETEs of claims are answered 500,
// and LISTs of claims fail (a reset connection) while failLists is set.
type faults struct {
	next        http.RoundTripper
	afterPost   func()
	losePost    bool
	failDeletes atomic.Int32
	failLists   atomic.Bool
	deletes     atomic.Int32
}

func (f *faults) RoundTrip(req *http.Request) (*http.Response, error) {
	claims := strings.Contains(req.URL.Path, "/sandboxclaims")
	switch {
	case claims && req.Method == http.MethodDelete:
		f.deletes.Add(1)
		if f.failDeletes.Add(-1) >= 0 {
			body := `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"injected transient error","reason":"InternalError","code":500}`
			return &http.Response{StatusCode: 500, Status: "500 Internal Server Error", Request: req,
				Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(body))}, nil
		}
	case claims && req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/sandboxclaims") &&
		req.URL.Query().Get("watch") == "" && f.failLists.Load():
		return nil, errors.New("read: connection reset by peer (injected)")
	}
	resp, err := f.next.RoundTrip(req)
	if err == nil && claims && req.Method == http.MethodPost {
		// the whole answer is read first: a cancel in afterPost must not cut the answer the caller gets
		body, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if f.afterPost != nil {
			f.afterPost()
		}
		if f.losePost || rerr != nil {
			return nil, context.Canceled
		}
	}
	return resp, err
}

// faultyClient is a Client whose Kubernetes requests go through f; its claims carry the label test=label.
func faultyClient(t *testing.T, f *faults, label string, cleanup time.Duration) *sandbox.Client {
	t.Helper()
	cfg := rest.CopyConfig(restConfig)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { f.next = rt; return f }
	opts := baseOptions()
	opts.K8sHelper = nil
	opts.RestConfig = cfg
	opts.APIURL = cluster.RouterURL
	opts.Labels = map[string]string{"test": label}
	opts.CleanupTimeout = cleanup
	c, err := sandbox.NewClient(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// liveClaims are the claims labelled test=label not being deleted.
func liveClaims(t *testing.T, ctx context.Context, label string) []string {
	t.Helper()
	list, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: "test=" + label})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, item := range list.Items {
		if item.GetDeletionTimestamp() == nil {
			names = append(names, item.GetName())
		}
	}
	return names
}

// One 500 to the rollback's DELETE of a CreateSandbox cancelled right after its claim was made: retried, the
// claim deleted, and the error is the cancelled Open's (not ErrOrphanedClaim).
func TestACancelledCreateSandboxsRollbackRetriesA500(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	label := fmt.Sprintf("rollback-retry-%d", time.Now().UnixNano())
	f := &faults{}
	c := faultyClient(t, f, label, 30*time.Second)
	t.Cleanup(func() { _ = c.DeleteAll(context.Background()) })
	cctx, cancel := context.WithCancel(ctx)
	f.afterPost = func() { f.failDeletes.Store(1); cancel() }
	sb, err := c.CreateSandbox(cctx, "", "")
	if sb != nil || err == nil || errors.Is(err, sandbox.ErrOrphanedClaim) {
		t.Errorf("CreateSandbox = %v, %v; want the cancelled Open's error, the claim deleted", sb, err)
	}
	if n := f.deletes.Load(); n < 2 {
		t.Errorf("%d DELETEs; want the failed one retried", n)
	}
	if left := liveClaims(t, ctx, label); len(left) != 0 {
		t.Errorf("claims left after the rollback: %v", left)
	}
}

// The rollback's DELETE fails for all of CleanupTimeout: CreateSandbox returns no handle and ErrOrphanedClaim,
// and the Client keeps the handle, so DeleteAll deletes the claim.
func TestACreateSandboxWhoseRollbackFailsIsDeletedByDeleteAll(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	label := fmt.Sprintf("rollback-orphan-%d", time.Now().UnixNano())
	f := &faults{}
	c := faultyClient(t, f, label, 2*time.Second)
	cctx, cancel := context.WithCancel(ctx)
	f.afterPost = func() { f.failDeletes.Store(1 << 30); cancel() }
	sb, err := c.CreateSandbox(cctx, "", "")
	if sb != nil || !errors.Is(err, sandbox.ErrOrphanedClaim) || !strings.Contains(err.Error(), "deleting the claim failed too") {
		t.Errorf("CreateSandbox = %v, %v; want no handle and ErrOrphanedClaim (its rollback failed)", sb, err)
	}
	if left := liveClaims(t, ctx, label); len(left) != 1 {
		t.Errorf("claims after the failed rollback: %v; want the orphaned one", left)
	}
	f.failDeletes.Store(0)
	if err := c.DeleteAll(ctx); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if left := liveClaims(t, ctx, label); len(left) != 0 {
		t.Errorf("claims left after DeleteAll: %v (the orphaned claim of a failed CreateSandbox leaked)", left)
	}
}

// A cancelled create whose answer was lost (the claim was made) and whose search for that claim failed:
// CreateSandbox says ErrOrphanedClaim, and DeleteAll repeats the search and deletes the claim.
func TestALostCreateWhoseSearchFailedIsDeletedByDeleteAll(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	label := fmt.Sprintf("lost-search-%d", time.Now().UnixNano())
	f := &faults{losePost: true}
	c := faultyClient(t, f, label, 2*time.Second)
	cctx, cancel := context.WithCancel(ctx)
	f.afterPost = func() { f.failLists.Store(true); cancel() }
	sb, err := c.CreateSandbox(cctx, "", "")
	if sb != nil || !errors.Is(err, sandbox.ErrClaimFailed) || !errors.Is(err, sandbox.ErrOrphanedClaim) {
		t.Errorf("CreateSandbox = %v, %v; want no handle, ErrClaimFailed and ErrOrphanedClaim", sb, err)
	}
	if left := liveClaims(t, ctx, label); len(left) != 1 {
		t.Errorf("claims after the failed search: %v; want the one the create made", left)
	}
	f.failLists.Store(false)
	if err := c.DeleteAll(ctx); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if left := liveClaims(t, ctx, label); len(left) != 0 {
		t.Errorf("claims left after DeleteAll: %v (the lost create's claim leaked)", left)
	}
}

// Close then Open of a Client's handle (a new claim): it is listed under its new claim only, and GetSandbox of
// that claim returns it.
func TestAReopenedClientHandleMovesToItsNewClaim(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	label := fmt.Sprintf("reopen-%d", time.Now().UnixNano())
	c := faultyClient(t, &faults{}, label, 30*time.Second)
	t.Cleanup(func() { _ = c.DeleteAll(context.Background()) })
	sb, err := c.CreateSandbox(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	first := sb.ClaimName()
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if keys := c.ListActiveSandboxes(); len(keys) != 0 {
		t.Errorf("ListActiveSandboxes after Close = %v", keys)
	}
	if err := sb.Open(ctx); err != nil {
		t.Fatal(err)
	}
	second := sb.ClaimName()
	want := []sandbox.Key{{Namespace: cluster.Namespace, ClaimName: second}}
	if keys := c.ListActiveSandboxes(); second == first || !slices.Equal(keys, want) {
		t.Errorf("ListActiveSandboxes after re-Open = %v; want %v (first claim %s)", keys, want, first)
	}
	if g, err := c.GetSandbox(ctx, second, ""); err != nil || g != sb {
		t.Errorf("GetSandbox(%s) = %p, %v; want the re-opened handle %p", second, g, err, sb)
	}
	if err := c.DeleteAll(ctx); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	if left := liveClaims(t, ctx, label); len(left) != 0 {
		t.Errorf("claims left after DeleteAll: %v", left)
	}
}
