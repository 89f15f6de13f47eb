//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"agent-sandbox.invalid/clients/go/sandbox"
)

var claimsGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}

func testLogger() logr.Logger { return logr.Discard() }

func baseOptions() sandbox.Options {
	return sandbox.Options{
		WarmPoolName: cluster.WarmPool, Namespace: cluster.Namespace, K8sHelper: k8s, Quiet: true,
		SandboxReadyTimeout: 90 * time.Second,
	}
}

// open creates a sandbox with opts and closes it (deleting the claim) when the test ends.
func open(t *testing.T, opts sandbox.Options) *sandbox.Sandbox {
	t.Helper()
	sb, err := sandbox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Open(ctxFor(t, 2*time.Minute)); err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		claim := sb.ClaimName()
		if err := sb.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if claim != "" {
			assertClaimGone(t, claim)
		}
	})
	return sb
}

func assertClaimGone(t *testing.T, claim string) {
	t.Helper()
	_, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Get(context.Background(), claim, metav1.GetOptions{})
	if err == nil {
		// deletion may still be finishing (finalizers); it must at least be marked for deletion
		obj, _ := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Get(context.Background(), claim, metav1.GetOptions{})
		if obj != nil && obj.GetDeletionTimestamp() == nil {
			t.Errorf("claim %s still exists after Close", claim)
		}
		return
	}
	if !apierrors.IsNotFound(err) {
		t.Errorf("claim %s: %v", claim, err)
	}
}

// exerciseCommon runs what every runtime/transport supports: commands with env/cwd/timeout, streaming,
// and the file calls.
func exerciseCommon(t *testing.T, sb *sandbox.Sandbox) {
	ctx := ctxFor(t, 2*time.Minute)
	res, err := sb.Run(ctx, "echo hello")
	if err != nil || res.Stdout != "hello\n" || res.ExitCode != 0 || res.Stderr != "" {
		t.Fatalf("Run(echo hello) = %+v, %v", res, err)
	}
	if res, err := sb.Run(ctx, "ls /definitely-missing"); err != nil || res.ExitCode == 0 {
		t.Errorf("failing command = %+v, %v", res, err)
	}
	if res, err := sb.Run(ctx, "printenv GREETING", sandbox.WithEnv(map[string]string{"GREETING": "hi"})); err != nil || res.Stdout != "hi\n" {
		t.Errorf("env = %+v, %v", res, err)
	}
	if err := sb.Write(ctx, "sub/marker", nil); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Run(ctx, "pwd", sandbox.WithCwd("sub")); err != nil || !strings.HasSuffix(strings.TrimSpace(res.Stdout), "/sub") {
		t.Errorf("cwd = %+v, %v", res, err)
	}
	start := time.Now()
	slow, err := sb.Run(ctx, "sleep 30", sandbox.WithCommandTimeout(time.Second))
	if err != nil || !slow.TimedOut || slow.ExitCode == 0 || time.Since(start) > 20*time.Second {
		t.Errorf("command timeout = %+v, %v after %s", slow, err, time.Since(start))
	}

	// streaming: events arrive as they happen, before the command ends
	p, err := sb.Start(ctx, "sh -c 'echo one; sleep 1; echo two >&2; exit 3'")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	first, err := p.Recv()
	if err != nil || first.Type != sandbox.EventStdout || string(first.Data) != "one\n" {
		t.Fatalf("first event %+v, %v", first, err)
	}
	firstAt := time.Now()
	rest, err := p.Wait()
	if err != nil || rest.Stderr != "two\n" || rest.ExitCode != 3 {
		t.Errorf("rest = %+v, %v", rest, err)
	}
	if time.Since(firstAt) < 500*time.Millisecond {
		t.Errorf("stdout was not delivered before the command finished")
	}
	var out bytes.Buffer
	res, err = sb.Run(ctx, "sh -c 'echo streamed'", sandbox.WithStdout(&out))
	if err != nil || out.String() != "streamed\n" || res.ExitCode != 0 {
		t.Errorf("Run WithStdout = %q %+v %v", out.String(), res, err)
	}

	// files
	if err := sb.Write(ctx, "dir/hello.txt", []byte("hi")); err != nil {
		t.Fatal(err)
	}
	// a quote in a name, and a legal deep path whose percent-encoded URL is ~10 KiB (the runtime refused
	// request lines past 8190 bytes)
	deep := strings.Repeat(strings.Repeat("é", 120)+"/", 14) + "f.txt"
	for _, name := range []string{`names/say "hi".txt`, deep} {
		if err := sb.Write(ctx, name, []byte(name)); err != nil {
			t.Fatalf("Write(%.40q...): %v", name, err)
		}
		if b, err := sb.Read(ctx, name); err != nil || string(b) != name {
			t.Errorf("Read(%.40q...) = %.40q, %v", name, b, err)
		}
	}
	if err := sb.Write(ctx, "tools/run.sh", []byte("#!/bin/sh\necho ran\n"), sandbox.WithFileMode(0o755)); err != nil {
		t.Fatal(err)
	}
	if res, err := sb.Run(ctx, "./tools/run.sh"); err != nil || res.Stdout != "ran\n" {
		t.Errorf("a script written WithFileMode(0o755) ran: %+v, %v", res, err)
	}
	if entries, err := sb.List(ctx, "tools"); err != nil || len(entries) != 1 || entries[0].Mode != "0755" {
		t.Errorf("List(tools) = %+v, %v", entries, err)
	}
	if b, err := sb.Read(ctx, "dir/hello.txt"); err != nil || string(b) != "hi" {
		t.Errorf("Read = %q, %v", b, err)
	}
	big := bytes.Repeat([]byte{0, 1, 2, 253, 254, 255}, 350_000)                                   // 2.1 MB, binary
	if err := sb.WriteFrom(ctx, "dir/big.bin", io.MultiReader(bytes.NewReader(big))); err != nil { // streamed, not seekable
		t.Fatal(err)
	}
	var got bytes.Buffer
	if n, err := sb.ReadTo(ctx, "dir/big.bin", &got); err != nil || n != int64(len(big)) || !bytes.Equal(got.Bytes(), big) {
		t.Errorf("big ReadTo: %d bytes, %v", n, err)
	}
	for path, want := range map[string]bool{"dir/hello.txt": true, "dir/nope": false, "dir": true} {
		if ok, err := sb.Exists(ctx, path); err != nil || ok != want {
			t.Errorf("Exists(%s) = %v, %v", path, ok, err)
		}
	}
	entries, err := sb.List(ctx, "dir")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range entries {
		names = append(names, e.Name)
		if e.Name == "hello.txt" && (e.Size != 2 || e.Type != sandbox.FileTypeFile || e.ModTime.IsZero()) {
			t.Errorf("entry %+v", e)
		}
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "big.bin,hello.txt" {
		t.Errorf("List(dir) = %v", names)
	}
	if _, err := sb.Read(ctx, "dir/missing.txt"); err == nil {
		t.Error("Read of a missing file succeeded")
	} else {
		var he *sandbox.HTTPError
		if !errors.As(err, &he) || he.StatusCode != 404 {
			t.Errorf("missing file: %v", err)
		}
	}
	if err := sb.Delete(ctx, "dir", false); err == nil {
		t.Error("deleting a non-empty directory without recursive succeeded")
	}
	if err := sb.Delete(ctx, "dir", true); err != nil {
		t.Errorf("Delete(dir, recursive): %v", err)
	}
	if ok, _ := sb.Exists(ctx, "dir"); ok {
		t.Error("dir exists after Delete")
	}
	if _, err := sb.Read(ctx, "../etc/passwd"); !errors.Is(err, sandbox.ErrInvalidArgument) {
		t.Errorf("traversal: %v", err)
	}
}

func TestLegacyThroughRouter(t *testing.T) {
	t.Parallel()
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	sb := open(t, opts)
	if sb.SandboxName() == "" || sb.PodIP() == "" || !strings.HasPrefix(sb.PodIP(), "127.") || sb.PodName() == "" {
		t.Errorf("identity: sandbox %q pod %q ip %q", sb.SandboxName(), sb.PodName(), sb.PodIP())
	}
	exerciseCommon(t, sb)
}

func TestLegacyInClusterPodIP(t *testing.T) {
	t.Parallel()
	opts := baseOptions()
	opts.Connectivity = sandbox.ConnectivityInCluster
	exerciseCommon(t, open(t, opts))
}

func TestSandboxdInClusterPodIP(t *testing.T) {
	t.Parallel()
	opts := baseOptions()
	opts.Runtime = sandbox.RuntimeSandboxd
	opts.Connectivity = sandbox.ConnectivityInCluster
	sb := open(t, opts)
	exerciseCommon(t, sb)

	ctx := ctxFor(t, time.Minute)
	// stdin, then EOF
	res, err := sb.Run(ctx, "cat", sandbox.WithStdin(strings.NewReader("piped input")))
	if err != nil || res.Stdout != "piped input" || res.ExitCode != 0 {
		t.Errorf("stdin: %+v, %v", res, err)
	}
	// a signal ends a running process
	p, err := sb.Start(ctx, "sleep 60")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(ctx, sandbox.SignalTerminate); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Wait(); err != nil || res.ExitCode == 0 {
		t.Errorf("after SIGTERM: %+v, %v", res, err)
	}
	// a PTY: the program sees a terminal of the given size, and a resize
	p, err = sb.Start(ctx, "stty size; read x; stty size", sandbox.WithPTY(100, 30))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	ev, err := p.Recv()
	for err == nil && !strings.Contains(out.String()+string(ev.Data), "30 100") {
		out.Write(ev.Data)
		ev, err = p.Recv()
	}
	out.Write(ev.Data)
	if err != nil {
		t.Fatalf("PTY output %q: %v", out.String(), err)
	}
	if err := p.ResizeTTY(ctx, 120, 40); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctx, []byte("\n")); err != nil {
		t.Fatal(err)
	}
	res, err = p.Wait()
	if err != nil || !strings.Contains(res.Stdout, "40 120") {
		t.Errorf("after resize: %+v, %v", res, err)
	}
	// exec errors keep the gRPC status: a missing cwd is refused by the runtime
	if _, err := sb.Run(ctx, "true", sandbox.WithCwd("../..")); err == nil {
		t.Error("cwd outside the root accepted")
	}
}

func TestColdStartSuspendResume(t *testing.T) {
	t.Parallel()
	opts := baseOptions()
	opts.WarmPoolName = cluster.ColdPool
	opts.Connectivity = sandbox.ConnectivityInCluster
	opts.Env = []sandbox.EnvVar{{Name: "FROM_CLAIM", Value: "injected"}}
	sb := open(t, opts)
	ctx := ctxFor(t, 3*time.Minute)
	if res, err := sb.Run(ctx, "printenv FROM_CLAIM"); err != nil || res.Stdout != "injected\n" {
		t.Errorf("claim env: %+v, %v", res, err)
	}
	if err := sb.Suspend(ctx); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	st, err := sb.Status(ctx)
	if err != nil || !st.Suspended || st.Ready || st.OperatingMode != "Suspended" || st.PodIP != "" {
		t.Fatalf("status after Suspend: %+v, %v", st, err)
	}
	if _, err := sb.Run(ctx, "true"); !errors.Is(err, sandbox.ErrNotReady) {
		t.Errorf("Run while suspended: %v", err)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if res, err := sb.Run(ctx, "echo back"); err != nil || res.Stdout != "back\n" {
		t.Errorf("Run after Resume: %+v, %v", res, err)
	}
	if st, err := sb.Status(ctx); err != nil || !st.Ready || st.Suspended {
		t.Errorf("status after Resume: %+v, %v", st, err)
	}
}

func TestTypedErrorsCarryTheConditionReason(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	opts := baseOptions()
	opts.WarmPoolName = "no-such-pool"
	opts.APIURL = cluster.RouterURL
	sb, err := sandbox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	err = sb.Open(ctx)
	var ce *sandbox.ConditionError
	if !errors.Is(err, sandbox.ErrWarmPoolNotFound) || !errors.Is(err, sandbox.ErrClaimFailed) || !errors.As(err, &ce) ||
		ce.Reason != "WarmPoolNotFound" || ce.Kind != "SandboxClaim" {
		t.Fatalf("Open with a missing pool: %v", err)
	}
	if sb.ClaimName() != "" {
		t.Errorf("rolled-back claim still recorded: %q", sb.ClaimName())
	}
	assertClaimGone(t, ce.Name)

	// a pool whose template is missing: TemplateNotFound
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": "orphan-pool"},
		"spec":     map[string]any{"replicas": int64(0), "sandboxTemplateRef": map[string]any{"name": "no-such-template"}},
	}}
	poolGVR := schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
	if _, err := k8s.Dynamic.Resource(poolGVR).Namespace(cluster.Namespace).Create(ctx, pool, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	opts.WarmPoolName = "orphan-pool"
	sb, _ = sandbox.New(ctx, opts)
	// until the controller has seen the new pool it reports WarmPoolNotFound (the SDK gives up at once)
	for deadline := time.Now().Add(30 * time.Second); ; {
		err = sb.Open(ctx)
		if !errors.Is(err, sandbox.ErrWarmPoolNotFound) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !errors.Is(err, sandbox.ErrTemplateNotFound) || !errors.As(err, &ce) || ce.Reason != "TemplateNotFound" {
		t.Fatalf("Open from a pool without template: %v", err)
	}
	if !strings.HasPrefix(err.Error(), "sandbox["+cluster.Namespace+"/") {
		t.Errorf("error prefix: %v", err)
	}

	// a template whose Pod the API server refuses (422): ours gives up at once naming the field (upstream
	// waits out the timeout on ReconcilerError; the old code returned a timeout after 60 s here)
	tmplGVR := schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	for gvr, obj := range map[schema.GroupVersionResource]map[string]any{
		tmplGVR: {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
			"metadata": map[string]any{"name": "invalid-pod"},
			"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "Bad_Name", "image": "busybox"}}}}}},
		poolGVR: {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
			"metadata": map[string]any{"name": "invalid-pod"},
			"spec":     map[string]any{"replicas": int64(0), "sandboxTemplateRef": map[string]any{"name": "invalid-pod"}}},
	} {
		u := &unstructured.Unstructured{Object: obj}
		if _, err := k8s.Dynamic.Resource(gvr).Namespace(cluster.Namespace).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	opts.WarmPoolName = "invalid-pod"
	opts.SandboxReadyTimeout = time.Minute
	for deadline := time.Now().Add(30 * time.Second); ; { // until the controller has seen the new pool
		sb, _ = sandbox.New(ctx, opts)
		err = sb.Open(ctx)
		if !errors.Is(err, sandbox.ErrWarmPoolNotFound) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !errors.Is(err, sandbox.ErrClaimFailed) || !errors.As(err, &ce) || ce.Reason != "ReconcilerError" ||
		!strings.Contains(ce.Message, `spec.containers[0].name: Invalid value: "Bad_Name"`) {
		t.Fatalf("Open from a template whose Pod is invalid: %v", err)
	}
	assertClaimGone(t, ce.Name) // a cold Sandbox is named like its claim
}

func TestReadyTimeoutRollsBack(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	opts := baseOptions()
	opts.WarmPoolName = cluster.ColdPool
	opts.APIURL = cluster.RouterURL
	// a cold start here can be Ready in ~50 ms, so the wait gets no time at all: the claim is created, the
	// readiness wait times out at once, and the claim must be rolled back
	opts.SandboxReadyTimeout = time.Millisecond
	sb, err := sandbox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	err = sb.Open(ctx)
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("Open = %v, want ErrTimeout", err)
	}
	if sb.ClaimName() != "" {
		t.Errorf("claim not rolled back: %s", sb.ClaimName())
	}

	// an explicitly named claim is never rolled back: it stays until Close
	opts.ClaimName = "explicit-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	sb, err = sandbox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Open(ctx); !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("Open (explicit name) = %v, want ErrTimeout", err)
	}
	if _, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).Get(ctx, opts.ClaimName, metav1.GetOptions{}); err != nil {
		t.Fatalf("explicit claim after a failed Open: %v", err)
	}
	if err := sb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	assertClaimGone(t, opts.ClaimName)
}

func TestClientRegistryAndReconnect(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.APIURL = cluster.RouterURL
	client, err := sandbox.NewClient(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.DeleteAll(context.Background()) })
	sb, err := client.CreateSandbox(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Open(ctx); !errors.Is(err, sandbox.ErrAlreadyOpen) {
		t.Errorf("second Open: %v", err)
	}
	keys := client.ListActiveSandboxes()
	if len(keys) != 1 || keys[0] != (sandbox.Key{Namespace: cluster.Namespace, ClaimName: sb.ClaimName()}) {
		t.Errorf("ListActiveSandboxes = %v", keys)
	}
	all, err := client.ListAllSandboxes(ctx, "")
	if err != nil || !contains(all, sb.ClaimName()) {
		t.Errorf("ListAllSandboxes = %v, %v", all, err)
	}
	if err := sb.Write(ctx, "state.txt", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	// Disconnect keeps the claim; Open reconnects to the same sandbox
	if err := sb.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if sb.IsReady() || len(client.ListActiveSandboxes()) != 0 {
		t.Error("still ready after Disconnect")
	}
	if err := sb.Open(ctx); err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	if b, err := sb.Read(ctx, "state.txt"); err != nil || string(b) != "kept" {
		t.Errorf("after reconnect: %q, %v", b, err)
	}

	// another client attaches to the claim by name (as another process would)
	other, err := sandbox.NewClient(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := other.GetSandbox(ctx, sb.ClaimName(), "")
	if err != nil {
		t.Fatal(err)
	}
	if again.SandboxName() != sb.SandboxName() {
		t.Errorf("GetSandbox bound %s, want %s", again.SandboxName(), sb.SandboxName())
	}
	if b, err := again.Read(ctx, "state.txt"); err != nil || string(b) != "kept" {
		t.Errorf("through the second client: %q, %v", b, err)
	}
	if _, err := other.GetSandbox(ctx, "no-such-claim", ""); !errors.Is(err, sandbox.ErrSandboxDeleted) {
		t.Errorf("GetSandbox of a missing claim: %v", err)
	}

	claim := sb.ClaimName()
	if err := client.DeleteSandbox(ctx, claim, ""); err != nil {
		t.Fatal(err)
	}
	assertClaimGone(t, claim)
	// the second handle notices on its next reconnect
	_ = again.Disconnect(ctx)
	if err := again.Open(ctx); !errors.Is(err, sandbox.ErrSandboxDeleted) && !errors.Is(err, sandbox.ErrOrphanedClaim) {
		t.Errorf("reconnect after deletion: %v", err)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Sandboxd through a SPDY port-forward to the sandbox Pod: the API server's pods/portforward reaches kwok,
// the dev cluster's kubelet, which forwards each runtime port to the runtime the local runner serves on the
// pod IP (devcluster/kubelet_api.py) - the whole tunnel path of a real cluster.
func TestSandboxdPodPortForward(t *testing.T) {
	t.Parallel()
	opts := baseOptions()
	opts.Runtime = sandbox.RuntimeSandboxd
	opts.PortForwardReadyTimeout = 30 * time.Second
	sb := open(t, opts)
	exerciseCommon(t, sb)
	ctx := ctxFor(t, time.Minute)
	res, err := sb.Run(ctx, "cat", sandbox.WithStdin(strings.NewReader("through the tunnel")))
	if err != nil || res.Stdout != "through the tunnel" || res.ExitCode != 0 {
		t.Errorf("stdin through the tunnel: %+v, %v", res, err)
	}
}

// Router port-forward needs a ready Pod behind sandbox-router-svc; the dev cluster's router is a host
// process with no such Service or Pod. Open must fail clearly, quickly, and roll the claim back
// (docs/sdk/go.md). Through installed router Pods the mode works: tests/integration/install/test_router_install.py.
func TestRouterPortForwardFailsClearlyWithoutARouterPod(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 2*time.Minute)
	sb, err := sandbox.New(ctx, baseOptions())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = sb.Open(ctx)
	t.Logf("router port-forward: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	if err == nil {
		_ = sb.Close(ctx)
		t.Fatal("router port-forward opened without a router Pod")
	}
	if !errors.Is(err, sandbox.ErrNotReady) {
		t.Errorf("router port-forward: %v, want ErrNotReady (no ready endpoint)", err)
	}
	if sb.ClaimName() != "" {
		t.Errorf("claim %s not rolled back", sb.ClaimName())
	}
}

// lostAnswer performs a claim create for real, then reports the connection reset instead of the answer: the
// claim exists, and the client does not know its generated name.
type lostAnswer struct {
	next http.RoundTripper
	lost atomic.Int32
}

func (l *lostAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err == nil && req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/sandboxclaims") {
		resp.Body.Close()
		l.lost.Add(1)
		return nil, errors.New("connection reset by peer (the test dropped the answer)")
	}
	return resp, err
}

func TestACreateWhoseAnswerIsLostLeavesNoClaim(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, time.Minute)
	lost := &lostAnswer{}
	cfg := rest.CopyConfig(restConfig)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { lost.next = rt; return lost }
	opts := baseOptions()
	opts.K8sHelper = nil
	opts.RestConfig = cfg
	opts.APIURL = cluster.RouterURL
	opts.Labels = map[string]string{"test": "lost-answer"}
	sb, err := sandbox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Open(ctx); !errors.Is(err, sandbox.ErrClaimFailed) {
		t.Fatalf("Open = %v, want ErrClaimFailed", err)
	}
	if lost.lost.Load() != 1 {
		t.Fatalf("the claim create was not intercepted (%d)", lost.lost.Load())
	}
	list, err := k8s.Dynamic.Resource(claimsGVR).Namespace(cluster.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "test=lost-answer"})
	if err != nil {
		t.Fatal(err)
	}
	for _, item := range list.Items {
		if item.GetDeletionTimestamp() == nil {
			t.Errorf("claim %s left behind by a create whose answer was lost", item.GetName())
		}
	}
}

var sandboxesGVR = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}

// setOperatingMode patches the Sandbox behind the handle's back (as the lifecycle controller or the CLI does)
// and waits until it is Ready with a pod again (Running) or has none (Suspended); the pod IP it then has.
func setOperatingMode(t *testing.T, ctx context.Context, name, mode string) string {
	t.Helper()
	res := k8s.Dynamic.Resource(sandboxesGVR).Namespace(cluster.Namespace)
	patch := []byte(`{"spec":{"operatingMode":"` + mode + `"}}`)
	if _, err := res.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch %s: %v", mode, err)
	}
	for {
		obj, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		ips, _, _ := unstructured.NestedStringSlice(obj.Object, "status", "podIPs")
		ready := false
		conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Ready" && m["status"] == "True" {
				ready = true
			}
		}
		if mode == "Running" && ready && len(ips) > 0 {
			return ips[0]
		}
		if mode == "Suspended" && !ready && len(ips) == 0 {
			return ""
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Sandbox %s not %s: %v", name, mode, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// A handle whose Sandbox was suspended and resumed by someone else keeps working through the router: its
// pod IP is stale and now another sandbox's, the router (with the Pod cache, as installed) refuses it as not
// the Sandbox's, and the SDK resends without it, then reads the Sandbox's new one. Every call used to fail
// with that 403 until the handle was reopened. (A router without the cache dials the old address: a 502
// while nothing listens there - the unit tests' other case - or, as upstream's, the other sandbox.)
func TestHandleFollowsAPodMovedBehindItsBack(t *testing.T) {
	t.Parallel()
	ctx := ctxFor(t, 3*time.Minute)
	opts := baseOptions()
	opts.WarmPoolName = cluster.ColdPool
	opts.APIURL = cluster.RouterURL
	sb := open(t, opts)
	before := sb.PodIP()
	if res, err := sb.Run(ctx, "echo first"); err != nil || res.Stdout != "first\n" {
		t.Fatalf("first run: %+v, %v", res, err)
	}
	after := movePod(t, ctx, sb.SandboxName(), before)
	// The old address is another sandbox's now: the command must run in this one.
	if res, err := sb.Run(ctx, "sh -c 'echo $HOSTNAME'"); err != nil || res.Stdout != sb.SandboxName()+"\n" {
		t.Fatalf("first run after the move: %+v, %v", res, err)
	}
	if res, err := sb.Run(ctx, "echo moved"); err != nil || res.Stdout != "moved\n" {
		t.Fatalf("run after the move: %+v, %v", res, err)
	}
	if sb.PodIP() != after {
		t.Errorf("PodIP = %q, want the new %q", sb.PodIP(), after)
	}
	// File calls retry: the first one after another move succeeds by itself.
	movePod(t, ctx, sb.SandboxName(), after)
	if err := sb.Write(ctx, "moved.txt", []byte("x")); err != nil {
		t.Fatalf("write after the second move: %v", err)
	}
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// movePod suspends the Sandbox, lets another Sandbox's pod take its address (so a request still carrying it
// would reach that other sandbox if the router did not check), and resumes it; the pod's new address.
func movePod(t *testing.T, ctx context.Context, name, from string) string {
	t.Helper()
	setOperatingMode(t, ctx, name, "Suspended")
	takeAddress(t, ctx, from, name)
	ip := setOperatingMode(t, ctx, name, "Running")
	if ip == from {
		t.Fatalf("the resumed pod has the old address %s although another sandbox's pod holds it", from)
	}
	return ip
}

// takeAddress opens sandboxes from the cold pool (closed when the test ends) until another Sandbox's pod
// holds ip: one of them, or another test's. The suspended Sandbox's own pod may still hold it, terminating:
// that one does not count (it used to, and the resumed pod could then get the address back).
//
// The dev cluster (kwok) hands out any of the freed addresses (a Go map's order), a new one only when none is
// free: how many opens it takes is how many addresses other tests' deleted pods freed meanwhile. Each
// sandbox opened here holds one, so ip is taken at the latest once the free ones are used up. Eight opens
// were the bound until December 6; with the tests that close sandboxes during their Open (their pods end as
// the parallel tests begin), more addresses were often free than that (2 failures in 3 full runs).
func takeAddress(t *testing.T, ctx context.Context, ip, suspended string) {
	t.Helper()
	heldBySandbox := func() bool {
		pods, err := k8s.Dynamic.Resource(podsGVR).List(ctx, metav1.ListOptions{FieldSelector: "status.podIP=" + ip})
		if err != nil {
			return false
		}
		for _, pod := range pods.Items {
			if pod.GetDeletionTimestamp() != nil {
				continue
			}
			for _, ref := range pod.GetOwnerReferences() {
				if ref.Kind == "Sandbox" && ref.Name != suspended {
					return true
				}
			}
		}
		return false
	}
	for i := 0; i < maxAddressTakers; i++ {
		if heldBySandbox() {
			t.Logf("address %s taken after %d sandboxes opened here", ip, i)
			return
		}
		opts := baseOptions()
		opts.WarmPoolName = cluster.ColdPool
		opts.Connectivity = sandbox.ConnectivityInCluster
		open(t, opts)
	}
	if !heldBySandbox() {
		t.Fatalf("no Sandbox's pod took the address %s (%d sandboxes opened)", ip, maxAddressTakers)
	}
}

// maxAddressTakers bounds the sandboxes takeAddress opens: more than the addresses the suite's pods can
// have freed at once.
const maxAddressTakers = 48
