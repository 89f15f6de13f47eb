//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// Probe go12 of December 7: a Run whose runtime crashed after the command started came back as the router's
// 502 "Could not connect to the backend sandbox" and nothing else, though the command had run: a caller that
// ran it again ran it twice. It now says it may have run, and matches ErrMayHaveRun (the Python SDK's
// may_have_run note); the 502 stays reachable.
func TestARunCutByACrashSaysItMayHaveRun(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	sb := open(t, opts)
	done := make(chan error, 1)
	go func() {
		res, err := sb.Run(ctx, "sh -c 'echo ran >> marker; sleep 30'")
		t.Logf("Run: %+v, %v", res, err)
		done <- err
	}()
	waitForFile(t, ctx, sb, "marker")
	crashRuntime(t, sb.PodName())
	t.Logf("crashed %s", sb.PodName())
	err := <-done
	var httpErr *sandbox.HTTPError
	if !errors.Is(err, sandbox.ErrMayHaveRun) || !errors.As(err, &httpErr) || httpErr.StatusCode != http.StatusBadGateway ||
		!strings.Contains(err.Error(), "the command may have started") {
		t.Fatalf("Run cut by a crash = %v; want the router's 502 saying the command may have started (ErrMayHaveRun)", err)
	}
	waitForRuntime(t, ctx, sb)
	if got, err := sb.Read(ctx, "marker"); err != nil || string(got) != "ran\n" {
		t.Errorf("marker = %q, %v; the command had run once", got, err)
	}
}

// A Read whose download is cut by a runtime crash is ErrConnection saying the download was cut (the Sandbox
// still exists); it was an untyped "reading response: unexpected EOF". (A download cut by the Sandbox's
// deletion, ErrSandboxDeleted, is the unit test TestADownloadCutMidBodyAsksTheSandbox: here a deleted pod's
// runtime stops gracefully and finishes a held download within its grace period.)
func TestADownloadCutByACrashSaysSo(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	sb := open(t, opts)
	if res, err := sb.Run(ctx, "sh -c 'head -c 67108864 /dev/zero > big'"); err != nil || res.ExitCode != 0 {
		t.Fatalf("making the file: %+v, %v", res, err)
	}
	w := &heldWriter{first: make(chan struct{}), resume: make(chan struct{})}
	read := make(chan error, 1)
	go func() {
		_, err := sb.ReadTo(ctx, "big", w)
		read <- err
	}()
	select {
	case <-w.first:
	case err := <-read:
		t.Fatalf("ReadTo ended before its first bytes: %v", err)
	}
	crashRuntime(t, sb.PodName())
	close(w.resume)
	err := <-read
	var ce *sandbox.ConnectionError
	if !errors.Is(err, sandbox.ErrConnection) || !errors.As(err, &ce) || !ce.Cut ||
		!strings.Contains(err.Error(), "the download was cut off") {
		t.Errorf("ReadTo cut by a crash = %v; want ErrConnection saying the download was cut", err)
	}
}

// Concurrent GetSandbox calls of one claim return one handle, which DeleteAll closes: each made its own
// (one tracked), and DeleteAll left the others connected (probe go12).
func TestConcurrentGetSandboxOfOneClaimSharesItsHandle(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	owner := open(t, opts)
	c, err := sandbox.NewClient(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	const callers = 10
	handles := make([]*sandbox.Sandbox, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			handles[i], errs[i] = c.GetSandbox(ctx, owner.ClaimName(), cluster.Namespace)
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("GetSandbox %d = %v", i, errs[i])
		}
		if handles[i] != handles[0] {
			t.Errorf("GetSandbox %d returned another handle than GetSandbox 0", i)
		}
	}
	if err := c.DeleteAll(ctx); err != nil {
		t.Errorf("DeleteAll = %v", err)
	}
	for i, h := range handles {
		if h != nil && h.IsReady() {
			t.Errorf("handle of GetSandbox %d still connected after DeleteAll", i)
		}
	}
}

// waitForFile waits until path exists in the sandbox.
func waitForFile(t *testing.T, ctx context.Context, sb *sandbox.Sandbox, path string) {
	t.Helper()
	for {
		if ok, err := sb.Exists(ctx, path); err == nil && ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not appear: %v", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// heldWriter holds its first Write until resume is closed (the download then waits in the buffers on its way).
type heldWriter struct {
	once   sync.Once
	first  chan struct{}
	resume chan struct{}
}

func (w *heldWriter) Write(p []byte) (int, error) {
	w.once.Do(func() {
		close(w.first)
		<-w.resume
	})
	return len(p), nil
}
