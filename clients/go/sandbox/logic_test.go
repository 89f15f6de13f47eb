package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/flowcontrol"
)

func TestPathEncodings(t *testing.T) {
	for in, want := range map[string]string{
		"a/b.txt": "a%2Fb.txt", ".": "%2E", "..": "%2E%2E", "": "", "a b~_-.c": "a%20b~_-.c", "ü?#%": "%C3%BC%3F%23%25",
	} {
		if got := legacyPathParam(in); got != want {
			t.Errorf("legacyPathParam(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"a/b.txt": "a%2Fb.txt", "a/./b": "a%2F%2E%2Fb", "../x": "%2E%2E%2Fx", "": "", "d/": "d%2F", "a b": "a%20b",
	} {
		if got := sandboxdPathParam(in); got != want {
			t.Errorf("sandboxdPathParam(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSanitizeFilePath(t *testing.T) {
	for in, want := range map[string]string{"a.txt": "a.txt", "/abs/x": "abs/x", "a//b/./c": "a/b/c", "./x": "x"} {
		if got, err := sanitizeFilePath(in); err != nil || got != want {
			t.Errorf("sanitizeFilePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", " ", ".", "/", "../x", "a/../b", "a\x00b", "a\nb", "a/.."} {
		if _, err := sanitizeFilePath(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("sanitizeFilePath(%q) err = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if err := checkSandboxdWritePath("d/"); !errors.Is(err, ErrInvalidArgument) {
		t.Error("trailing slash accepted for sandboxd write")
	}
}

func TestOptionsDefaultsAndModes(t *testing.T) {
	o := Options{Quiet: true}
	o.setDefaults()
	if o.Namespace != "default" || o.ServerPort != 8888 || o.SandboxdRESTPort != 8080 || o.SandboxdGRPCPort != 9090 ||
		o.RequestTimeout != 180*time.Second || o.PerAttemptTimeout != 60*time.Second || o.MaxDownloadSize != 256<<20 ||
		o.RouterNamespace != "default" || o.TraceServiceName != "sandbox-client" || o.Runtime != RuntimeLegacyPython {
		t.Errorf("defaults = %+v", o)
	}
	cases := []struct {
		opts   Options
		mode   mode
		router bool
	}{
		{Options{}, modeRouterPortForward, true},
		{Options{GatewayName: "gw"}, modeGateway, true},
		{Options{APIURL: "http://r:8080", GatewayName: "gw"}, modeDirect, true},
		{Options{Runtime: RuntimeSandboxd}, modeSandboxdPortForward, false},
		{Options{Runtime: RuntimeSandboxd, APIURL: "http://x"}, modeDirect, false},
		{Options{Connectivity: ConnectivityInCluster}, modeInClusterPodIP, false},
		{Options{Connectivity: ConnectivityInClusterService, Runtime: RuntimeSandboxd}, modeInClusterService, false},
	}
	for _, c := range cases {
		c.opts.Quiet = true
		c.opts.setDefaults()
		if err := c.opts.validate(); err != nil {
			t.Errorf("%+v: %v", c.opts, err)
		}
		if c.opts.mode() != c.mode || c.opts.routerHeaders() != c.router {
			t.Errorf("mode(%+v) = %v router %v, want %v %v", c.opts, c.opts.mode(), c.opts.routerHeaders(), c.mode, c.router)
		}
	}
}

func TestOptionsValidationNamesTheField(t *testing.T) {
	for field, o := range map[string]Options{
		"Namespace":         {Namespace: "Bad_NS"},
		"APIURL":            {APIURL: "ftp://x"},
		"WarmPoolName":      {WarmPoolName: "UPPER"},
		"ServerPort":        {ServerPort: 70000},
		"GatewayScheme":     {GatewayScheme: "tcp"},
		"Runtime":           {Runtime: "docker"},
		"Connectivity":      {Connectivity: "carrier-pigeon"},
		"GatewayName":       {Runtime: RuntimeSandboxd, GatewayName: "gw"},
		"must differ":       {Runtime: RuntimeSandboxd, SandboxdRESTPort: 9000, SandboxdGRPCPort: 9000},
		"APIURL or Gateway": {Connectivity: ConnectivityInCluster, APIURL: "http://x"},
		"X-Sandbox-ID":      {Headers: map[string][]string{"X-Sandbox-ID": {"x"}}},
		"Labels":            {Labels: map[string]string{"bad key!": "v"}},
		"Env[0]":            {Env: []EnvVar{{Name: "1=2"}}},
		"RequestTimeout":    {RequestTimeout: -time.Second},
		"ClaimName":         {ClaimName: "Claim"},
	} {
		o.Quiet = true
		o.setDefaults()
		err := o.validate()
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v", field, err)
		}
	}
}

func TestBuildClaim(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	o := Options{WarmPoolName: "pool", Labels: map[string]string{"team": "a"}, PodLabels: map[string]string{"x": "y"},
		Env: []EnvVar{{Name: "K", Value: "v", ContainerName: "main"}}, ShutdownAfter: 90 * time.Second}
	obj := buildClaim(&o, now, "0123abcd", `{"traceparent":"00-1-2-01"}`)
	want := `map[apiVersion:extensions.agents.x-k8s.io/v1beta1 kind:SandboxClaim ` +
		`metadata:map[annotations:map[agents.x-k8s.io/client-first-requested-at:2026-01-02T03:04:05.123456789Z ` +
		`agents.x-k8s.io/client-request-id:0123abcd ` +
		`opentelemetry.io/trace-context:{"traceparent":"00-1-2-01"}] generateName:sandbox-claim- ` +
		`labels:map[agents.x-k8s.io/created-by:go-client team:a]] ` +
		`spec:map[additionalPodMetadata:map[labels:map[x:y]] env:[map[containerName:main name:K value:v]] ` +
		`lifecycle:map[shutdownPolicy:Delete shutdownTime:2026-01-02T03:05:35Z] warmPoolRef:map[name:pool]]]`
	if got := fmt.Sprint(obj.Object); got != want {
		t.Errorf("claim:\n got %s\nwant %s", got, want)
	}
	o = Options{WarmPoolName: "pool", ClaimName: "mine"}
	obj = buildClaim(&o, now, "0123abcd", "")
	if obj.GetName() != "mine" || obj.GetGenerateName() != "" || len(obj.Object["spec"].(map[string]any)) != 1 {
		t.Errorf("explicit name claim: %v", obj.Object)
	}
}

func claimWith(conds ...map[string]any) *unstructured.Unstructured {
	cs := make([]any, len(conds))
	for i, c := range conds {
		cs[i] = c
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{"conditions": cs}}}
	u.SetName("c1")
	u.SetNamespace("ns")
	return u
}

func TestClaimTerminalReasons(t *testing.T) {
	ready := func(status, reason string) map[string]any {
		return map[string]any{"type": "Ready", "status": status, "reason": reason, "message": "m"}
	}
	for reason, sentinel := range map[string]error{
		"TemplateNotFound": ErrTemplateNotFound, "PodFailed": ErrClaimFailed, "InvalidMetadata": ErrClaimFailed,
		"EnvVarsInjectionRejected": ErrClaimFailed, "ClaimExpired": ErrClaimFailed, "InvalidConfiguration": ErrClaimFailed,
	} {
		ce := claimTerminal(claimWith(ready("False", reason)))
		if ce == nil || !errors.Is(ce, sentinel) || !errors.Is(ce, ErrClaimFailed) || ce.Reason != reason {
			t.Errorf("%s: %v", reason, ce)
		}
	}
	wp := claimTerminal(claimWith(map[string]any{"type": "Other", "status": "True", "reason": "WarmPoolNotFound"}))
	if wp == nil || !errors.Is(wp, ErrWarmPoolNotFound) || errors.Is(wp, ErrTemplateNotFound) {
		t.Errorf("WarmPoolNotFound on any condition: %v", wp)
	}
	for _, reason := range []string{"SandboxNotReady", "SandboxMissing", "AdoptionConflict", "ReconcilerError"} {
		if ce := claimTerminal(claimWith(ready("False", reason))); ce != nil {
			t.Errorf("%s treated as terminal", reason)
		}
	}
	if ce := claimTerminal(claimWith(ready("True", "TemplateNotFound"))); ce != nil {
		t.Error("Ready=True treated as terminal")
	}
	// the API server's refusals no retry heals end the wait; a quota's 403 can heal and does not
	for msg, terminal := range map[string]bool{
		`Error seen: failed to create pod: Pod "c1" is invalid: spec.containers[0].name: Invalid value: "Bad_Name"`:                true,
		`Error seen: failed to create pod: pods "c1" is forbidden: violates PodSecurity "restricted:latest": runAsNonRoot != true`: true,
		`Error seen: failed to create pod: pods "c1" is forbidden: exceeded quota: compute, requested: pods=1`:                     false,
	} {
		c := ready("False", "ReconcilerError")
		c["message"] = msg
		if ce := claimTerminal(claimWith(c)); (ce != nil) != terminal || (ce != nil && !errors.Is(ce, ErrClaimFailed)) {
			t.Errorf("%q: terminal %v, got %v", msg, terminal, ce)
		}
	}
	msg := (&ConditionError{Kind: "SandboxClaim", Namespace: "ns", Name: "c1", Type: "Ready", Reason: "TemplateNotFound",
		Message: `SandboxTemplate "t" not found`}).Error()
	if msg != `SandboxClaim ns/c1: Ready condition reason TemplateNotFound: SandboxTemplate "t" not found` {
		t.Errorf("message %q", msg)
	}
}

func TestPickPodIPAndGatewayAddress(t *testing.T) {
	for want, ips := range map[string][]string{
		"10.0.0.2": {"fd00::1", "10.0.0.2"}, "fd00::1": {"bogus", "fd00::1"}, "1.2.3.4": {"::ffff:1.2.3.4"}, "": {"x"},
	} {
		if got := pickPodIP(ips); got != want {
			t.Errorf("pickPodIP(%v) = %q, want %q", ips, got, want)
		}
	}
	gw := func(v string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"status": map[string]any{
			"addresses": []any{map[string]any{"type": "IPAddress", "value": v}}}}}
	}
	for v, want := range map[string]string{"1.2.3.4": "1.2.3.4", "gw.example.com": "gw.example.com", "::1": "::1",
		"a/b": "", "u@h": "", "": "", "h:80": ""} {
		if got := gatewayAddressOf(gw(v)); got != want {
			t.Errorf("gatewayAddressOf(%q) = %q, want %q", v, got, want)
		}
	}
	if hostURL("http", "::1", 0) != "http://[::1]" || hostURL("http", "fd00::1", 8080) != "http://[fd00::1]:8080" {
		t.Error("IPv6 hosts must be bracketed")
	}
}

func TestReadyEndpointPod(t *testing.T) {
	slice := &unstructured.Unstructured{Object: map[string]any{"endpoints": []any{
		map[string]any{"conditions": map[string]any{"ready": false}, "targetRef": map[string]any{"kind": "Pod", "name": "down"}},
		map[string]any{"conditions": map[string]any{"ready": true}, "targetRef": map[string]any{"kind": "Pod", "name": "up"}},
	}}}
	if got := readyEndpointPod(slice); got != "up" {
		t.Errorf("readyEndpointPod = %q", got)
	}
}

func TestPortForwardURL(t *testing.T) {
	u, err := portForwardURL("https://127.0.0.1:6443/base", "", "ns", "pod-1")
	if err != nil || u.String() != "https://127.0.0.1:6443/base/api/v1/namespaces/ns/pods/pod-1/portforward" {
		t.Errorf("%v %v", u, err)
	}
}

// fakeCluster is a dynamic fake client for the watch logic of waitReady (pure logic: the real API server
// is exercised by the e2e suite).
func fakeCluster(t *testing.T, objs ...runtime.Object) (*Sandbox, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		claimsGVR: "SandboxClaimList", sandboxesGVR: "SandboxList", gatewaysGVR: "GatewayList",
		endpointSlicesGVR: "EndpointSliceList", servicesGVR: "ServiceList", podsGVR: "PodList",
		archivesGVR: "SandboxArchiveList",
	}, objs...)
	o := Options{Quiet: true, SandboxReadyTimeout: 2 * time.Second, Namespace: "ns"}
	o.setDefaults()
	s := newSandbox(o, &K8sHelper{Config: &rest.Config{}, Dynamic: dyn, log: logr.Discard()})
	return s, dyn
}

func unstructuredObj(apiVersion, kind, name string, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
	u.SetName(name)
	u.SetNamespace("ns")
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func readyStatus(status, reason string) map[string]any {
	return map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": status, "reason": reason}},
		"podIPs": []any{"127.10.0.5"}}
}

func TestWaitReadyFollowsClaimThenSandbox(t *testing.T) {
	claim := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", nil)
	s, dyn := fakeCluster(t, claim)
	go func() {
		time.Sleep(50 * time.Millisecond)
		sb := unstructuredObj("agents.x-k8s.io/v1beta1", "Sandbox", "sb1", readyStatus("False", "DependenciesNotReady"))
		sb.SetAnnotations(map[string]string{PodNameAnnotation: "pod-x"})
		_, _ = dyn.Resource(sandboxesGVR).Namespace("ns").Create(context.Background(), sb, metav1.CreateOptions{})
		bound := claim.DeepCopy()
		bound.Object["status"] = map[string]any{"sandbox": map[string]any{"name": "sb1"}}
		_, _ = dyn.Resource(claimsGVR).Namespace("ns").Update(context.Background(), bound, metav1.UpdateOptions{})
		time.Sleep(50 * time.Millisecond)
		sb.Object["status"] = readyStatus("True", "DependenciesReady")
		_, _ = dyn.Resource(sandboxesGVR).Namespace("ns").Update(context.Background(), sb, metav1.UpdateOptions{})
	}()
	name, info, err := s.waitReady(context.Background(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	if name != "sb1" || info.podName != "pod-x" || info.podIP != "127.10.0.5" {
		t.Errorf("name %q info %+v", name, info)
	}
}

func TestWaitReadyFailsFastOnTerminalReason(t *testing.T) {
	claim := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", readyStatus("False", "TemplateNotFound"))
	s, _ := fakeCluster(t, claim)
	_, _, err := s.waitReady(context.Background(), "c1")
	var ce *ConditionError
	if !errors.As(err, &ce) || ce.Reason != "TemplateNotFound" || !errors.Is(err, ErrTemplateNotFound) {
		t.Fatalf("err = %v", err)
	}
}

func TestWaitReadyDeletedAndTimeout(t *testing.T) {
	claim := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", readyStatus("False", "SandboxMissing"))
	s, dyn := fakeCluster(t, claim)
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = dyn.Resource(claimsGVR).Namespace("ns").Delete(context.Background(), "c1", metav1.DeleteOptions{})
	}()
	if _, _, err := s.waitReady(context.Background(), "c1"); !errors.Is(err, ErrSandboxDeleted) ||
		!strings.Contains(err.Error(), "SandboxClaim c1 disappeared") {
		t.Fatalf("deleted: err = %v", err)
	}
	// a claim that never existed is "not found", not "disappeared"
	if _, _, err := s.waitReady(context.Background(), "never"); !errors.Is(err, ErrSandboxDeleted) ||
		!strings.Contains(err.Error(), "SandboxClaim ns/never not found") {
		t.Fatalf("missing: err = %v", err)
	}
	s2, _ := fakeCluster(t, claim.DeepCopy())
	s2.opts.SandboxReadyTimeout = 200 * time.Millisecond
	_, _, err := s2.waitReady(context.Background(), "c1")
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "SandboxMissing") ||
		strings.Contains(err.Error(), "controller running") {
		t.Fatalf("timeout: err = %v", err)
	}
	// the caller's own deadline passes first: its identity and its name, not SandboxReadyTimeout's
	s4, _ := fakeCluster(t, unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c3", nil))
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	_, _, err = s4.waitReady(short, "c3")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrTimeout) ||
		!strings.Contains(err.Error(), "not ready when the caller's deadline passed") {
		t.Fatalf("caller's deadline: err = %v", err)
	}
	cancelled, cancelNow := context.WithCancel(context.Background())
	go func() { time.Sleep(50 * time.Millisecond); cancelNow() }()
	if _, _, err = s4.waitReady(cancelled, "c3"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
	// a claim nobody ever answered: the controller is what is missing, and the error says so
	s3, _ := fakeCluster(t, unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c2", nil))
	s3.opts.SandboxReadyTimeout = 200 * time.Millisecond
	_, _, err = s3.waitReady(context.Background(), "c2")
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(),
		"no conditions - nothing wrote its status: is the agent-sandbox controller running, and watching this namespace?") {
		t.Fatalf("untouched: err = %v", err)
	}
}

// withGateway creates gw through the client (the fake's constructor would file a Gateway under the
// guessed resource "gatewaies").
func withGateway(t *testing.T, gw *unstructured.Unstructured) (*Sandbox, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	s, dyn := fakeCluster(t)
	if _, err := dyn.Resource(gatewaysGVR).Namespace("ns").Create(context.Background(), gw, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return s, dyn
}

func TestGatewayAddressWaitsForAUsableAddress(t *testing.T) {
	gw := unstructuredObj("gateway.networking.k8s.io/v1", "Gateway", "gw", map[string]any{
		"addresses": []any{map[string]any{"value": "not/usable"}}})
	s, dyn := withGateway(t, gw)
	s.opts.GatewayName, s.opts.GatewayNamespace, s.opts.GatewayReadyTimeout = "gw", "ns", 2*time.Second
	go func() {
		time.Sleep(50 * time.Millisecond)
		ready := gw.DeepCopy()
		ready.Object["status"] = map[string]any{"addresses": []any{map[string]any{"value": "fd00::7"}}}
		_, _ = dyn.Resource(gatewaysGVR).Namespace("ns").Update(context.Background(), ready, metav1.UpdateOptions{})
	}()
	addr, err := s.gatewayAddress(context.Background())
	if err != nil || addr != "fd00::7" {
		t.Fatalf("gatewayAddress = %q, %v", addr, err)
	}
	if _, err := s.connect(context.Background(), "sb", sandboxInfo{}); err != nil {
		t.Fatal(err)
	}

	s2, dyn2 := withGateway(t, gw.DeepCopy())
	s2.opts.GatewayName, s2.opts.GatewayNamespace = "gw", "ns"
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = dyn2.Resource(gatewaysGVR).Namespace("ns").Delete(context.Background(), "gw", metav1.DeleteOptions{})
	}()
	if _, err := s2.gatewayAddress(context.Background()); !errors.Is(err, ErrGatewayDeleted) {
		t.Fatalf("deleted gateway: %v", err)
	}
	s3, _ := withGateway(t, gw.DeepCopy())
	s3.opts.GatewayName, s3.opts.GatewayNamespace, s3.opts.GatewayReadyTimeout = "gw", "ns", 100*time.Millisecond
	if _, err := s3.gatewayAddress(context.Background()); !errors.Is(err, ErrTimeout) {
		t.Fatalf("no address: %v", err)
	}
}

func TestGatewayModeConnectsToTheAddress(t *testing.T) {
	gw := unstructuredObj("gateway.networking.k8s.io/v1", "Gateway", "gw", map[string]any{
		"addresses": []any{map[string]any{"value": "fd00::7"}}})
	s, _ := withGateway(t, gw)
	s.opts.GatewayName, s.opts.GatewayNamespace, s.opts.GatewayScheme = "gw", "ns", "https"
	c, err := s.connect(context.Background(), "sb", sandboxInfo{podIP: "10.0.0.9"})
	if err != nil {
		t.Fatal(err)
	}
	if c.ep.restBase.String() != "https://[fd00::7]" || !c.ep.router || c.ep.currentPodIP() != "10.0.0.9" || c.ep.sandboxID != "sb" {
		t.Errorf("endpoint = %+v (base %s)", c.ep, c.ep.restBase)
	}
}

func TestRouterPortForwardFindsAReadyRouterPod(t *testing.T) {
	slice := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": "r-1", "namespace": "ns",
			"labels": map[string]any{"kubernetes.io/service-name": RouterServiceName}},
		"endpoints": []any{map[string]any{"conditions": map[string]any{"ready": true},
			"targetRef": map[string]any{"kind": "Pod", "name": "router-abc"}}},
	}}
	s, _ := fakeCluster(t, slice)
	pod, err := s.routerPod(context.Background())
	if err != nil || pod != "router-abc" {
		t.Fatalf("routerPod = %q, %v", pod, err)
	}
	empty, _ := fakeCluster(t)
	if _, err := empty.routerPod(context.Background()); !errors.Is(err, ErrNotReady) {
		t.Fatalf("no endpoints: %v", err)
	}
}

func routerPodObj(name string, labels map[string]any, phase string, ready string, deleting bool) *unstructured.Unstructured {
	meta := map[string]any{"name": name, "namespace": "ns", "labels": labels}
	if deleting {
		meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": meta,
		"status": map[string]any{"phase": phase, "conditions": []any{
			map[string]any{"type": "PodScheduled", "status": "True"},
			map[string]any{"type": "Ready", "status": ready}}},
	}}
}

// With no EndpointSlice listing a ready Pod (the EndpointSlice controller cannot publish loopback addresses),
// the router Pod is found as kubectl finds it: the Service's selector, a Running and Ready Pod.
func TestRouterPortForwardFallsBackToTheServiceSelector(t *testing.T) {
	app := map[string]any{"app": "sandbox-router"}
	svc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": RouterServiceName, "namespace": "ns"},
		"spec":     map[string]any{"selector": map[string]any{"app": "sandbox-router"}},
	}}
	emptySlice := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": "r-1", "namespace": "ns",
			"labels": map[string]any{"kubernetes.io/service-name": RouterServiceName}},
		"endpoints": []any{},
	}}
	s, _ := fakeCluster(t, svc, emptySlice,
		routerPodObj("0-other", map[string]any{"app": "other"}, "Running", "True", false),
		routerPodObj("a-pending", app, "Pending", "False", false),
		routerPodObj("b-unready", app, "Running", "False", false),
		routerPodObj("c-deleting", app, "Running", "True", true),
		routerPodObj("d-ready", app, "Running", "True", false))
	pod, err := s.routerPod(context.Background())
	if err != nil || pod != "d-ready" {
		t.Fatalf("routerPod = %q, %v; want d-ready", pod, err)
	}

	none, _ := fakeCluster(t, svc, routerPodObj("b-unready", app, "Running", "False", false))
	_, err = none.routerPod(context.Background())
	if !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "none of the 1 Pods") {
		t.Fatalf("no ready Pod: %v", err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := none.routerPod(cancelled); !errors.Is(err, context.Canceled) || errors.Is(err, ErrNotReady) {
		t.Fatalf("cancelled while looking: %v, want context.Canceled", err)
	}
	noSelector := svc.DeepCopy()
	unstructured.RemoveNestedField(noSelector.Object, "spec", "selector")
	bare, _ := fakeCluster(t, noSelector, routerPodObj("d-ready", app, "Running", "True", false))
	if _, err := bare.routerPod(context.Background()); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), "no selector") {
		t.Fatalf("Service without selector: %v", err)
	}
}

func TestInClusterModesPickTheirAddress(t *testing.T) {
	s, _ := fakeCluster(t)
	s.opts.Connectivity, s.opts.Runtime = ConnectivityInCluster, RuntimeSandboxd
	c, err := s.connect(context.Background(), "sb", sandboxInfo{podIP: "127.10.0.3"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	if c.ep.restBase.String() != "http://127.10.0.3:8080" || c.ep.grpcTarget != "127.10.0.3:9090" || c.ep.router || c.proc == nil {
		t.Errorf("sandboxd pod IP endpoint = %+v", c.ep)
	}
	s.opts.Connectivity = ConnectivityInClusterService
	if _, err := s.connect(context.Background(), "sb", sandboxInfo{podIP: "127.10.0.3"}); !errors.Is(err, ErrNoService) {
		t.Errorf("service mode without serviceFQDN: %v", err)
	}
	c, err = s.connect(context.Background(), "sb", sandboxInfo{serviceFQDN: "sb.ns.svc.cluster.local"})
	if err != nil || c.ep.restBase.Host != "sb.ns.svc.cluster.local:8080" {
		t.Errorf("service endpoint: %v %v", c, err)
	}
	s.opts.Connectivity, s.opts.Runtime = ConnectivityInCluster, RuntimeLegacyPython
	if _, err := s.connect(context.Background(), "sb", sandboxInfo{}); !errors.Is(err, ErrNotReady) {
		t.Errorf("pod IP mode without an IP: %v", err)
	}
}

func TestRouterURLFromTheEnvironment(t *testing.T) {
	t.Setenv(RouterURLEnv, "http://127.0.0.1:9999")
	o := Options{Quiet: true}
	o.setDefaults()
	if o.APIURL != "http://127.0.0.1:9999" || o.mode() != modeDirect {
		t.Errorf("APIURL %q mode %v", o.APIURL, o.mode())
	}
	for _, explicit := range []Options{
		{Runtime: RuntimeSandboxd}, {Connectivity: ConnectivityInCluster}, {GatewayName: "gw"}, {APIURL: "http://x"},
	} {
		explicit.Quiet = true
		explicit.setDefaults()
		if explicit.APIURL == "http://127.0.0.1:9999" {
			t.Errorf("the environment overrode an explicit mode: %+v", explicit)
		}
	}
}

// A client built from the SDK's config has no client-side rate limiter unless the caller asks for one:
// client-go's unset default (5/s, burst 10) made goroutines opening sandboxes together wait ~1 s each.
func TestKubernetesClientsAreNotThrottledUnlessAsked(t *testing.T) {
	limiter := func(cfg *rest.Config) flowcontrol.RateLimiter {
		t.Helper()
		h, err := NewK8sHelper(cfg, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		c := rest.CopyConfig(h.Config)
		c.GroupVersion = &schema.GroupVersion{Version: "v1"}
		c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
		rc, err := rest.RESTClientFor(c)
		if err != nil {
			t.Fatal(err)
		}
		return rc.GetRateLimiter()
	}
	if l := limiter(&rest.Config{Host: "https://127.0.0.1:1"}); l != nil {
		t.Errorf("unset QPS: a %T limits the SDK's requests", l)
	}
	if l := limiter(&rest.Config{Host: "https://127.0.0.1:1", QPS: 20, Burst: 30}); l == nil || l.QPS() != 20 {
		t.Errorf("QPS 20 asked for, got %v", l)
	}
	own := flowcontrol.NewTokenBucketRateLimiter(3, 3)
	if l := limiter(&rest.Config{Host: "https://127.0.0.1:1", RateLimiter: own}); l != own {
		t.Errorf("the caller's RateLimiter was replaced by %v", l)
	}
}

// With credentials that cannot read Sandboxes, a handle re-reads its pod IP (a pod moved behind its back)
// from its claim's status.sandbox.podIPs, and says so when the claim is bound elsewhere now.
func TestReadPodIPFromTheClaimWhenSandboxesAreForbidden(t *testing.T) {
	claim := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", map[string]any{
		"sandbox": map[string]any{"name": "sb1", "podIPs": []any{"127.10.0.9"}},
	})
	s, dyn := fakeCluster(t, claim)
	dyn.PrependReactor("*", "sandboxes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(sandboxesGVR.GroupResource(), "sb1", errors.New("claims only"))
	})
	s.claimName, s.sandboxName = "c1", "sb1"
	if ip, err := s.readPodIP(context.Background(), "sb1"); err != nil || ip != "127.10.0.9" || s.PodIP() != ip {
		t.Fatalf("readPodIP = %q, %v (handle %q)", ip, err, s.PodIP())
	}
	if _, err := s.readPodIP(context.Background(), "sb-old"); !errors.Is(err, ErrSandboxDeleted) {
		t.Fatalf("a claim bound to another Sandbox: %v", err)
	}
}

func TestWaitReadyOnTheClaimWhenSandboxesAreForbidden(t *testing.T) {
	claim := unstructuredObj("extensions.agents.x-k8s.io/v1beta1", "SandboxClaim", "c1", nil)
	s, dyn := fakeCluster(t, claim)
	dyn.PrependReactor("*", "sandboxes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(sandboxesGVR.GroupResource(), "", errors.New("claims only"))
	})
	go func() {
		time.Sleep(50 * time.Millisecond)
		bound := claim.DeepCopy()
		bound.Object["status"] = map[string]any{"sandbox": map[string]any{"name": "sb1"}}
		_, _ = dyn.Resource(claimsGVR).Namespace("ns").Update(context.Background(), bound, metav1.UpdateOptions{})
		time.Sleep(50 * time.Millisecond)
		ready := readyStatus("True", "DependenciesReady")
		ready["sandbox"] = map[string]any{"name": "sb1", "podIPs": []any{"127.10.0.7"}}
		bound.Object["status"] = ready
		_, _ = dyn.Resource(claimsGVR).Namespace("ns").Update(context.Background(), bound, metav1.UpdateOptions{})
	}()
	name, info, err := s.waitReady(context.Background(), "c1")
	if err != nil || name != "sb1" || info.podIP != "127.10.0.7" || info.podName != "sb1" {
		t.Fatalf("waitReady = %q %+v %v", name, info, err)
	}
}
