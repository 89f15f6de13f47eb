//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"agent-sandbox.invalid/clients/go/sandbox"
)

// claimsOnlyConfig is the cluster's REST config with the token of a new ServiceAccount whose Role grants
// sandbox claims and nothing else (the least a platform can give an agent).
func claimsOnlyConfig(t *testing.T, account string) *rest.Config {
	t.Helper()
	ctx := ctxFor(t, time.Minute)
	ns := cluster.Namespace
	create := func(gvr schema.GroupVersionResource, obj map[string]any, sub ...string) *unstructured.Unstructured {
		t.Helper()
		got, err := k8s.Dynamic.Resource(gvr).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: obj},
			metav1.CreateOptions{}, sub...)
		if err != nil {
			t.Fatalf("create %s %v: %v", gvr.Resource, sub, err)
		}
		return got
	}
	accounts := schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	rbac := func(resource string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: resource}
	}
	create(accounts, map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": account}})
	create(rbac("roles"), map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": map[string]any{"name": account},
		"rules": []any{map[string]any{
			"apiGroups": []any{"extensions.agents.x-k8s.io"}, "resources": []any{"sandboxclaims"},
			"verbs": []any{"get", "list", "watch", "create", "delete"},
		}},
	})
	create(rbac("rolebindings"), map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": map[string]any{"name": account},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": account, "namespace": ns}},
	})
	token := create(accounts, map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "metadata": map[string]any{"name": account},
		"spec": map[string]any{"expirationSeconds": int64(3600)},
	}, "token")
	bearer, _, _ := unstructured.NestedString(token.Object, "status", "token")
	if bearer == "" {
		t.Fatalf("no token in %v", token.Object)
	}
	cfg := rest.AnonymousClientConfig(restConfig)
	cfg.BearerToken = bearer
	// The authorizer learns of a new binding from its informer: wait until the role applies.
	deadline := time.Now().Add(30 * time.Second)
	probe, err := sandbox.NewK8sHelper(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := probe.Dynamic.Resource(claimsGVR).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the claims-only role never applied: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	sandboxes := schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	if _, err := probe.Dynamic.Resource(sandboxes).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1}); !apierrors.IsForbidden(err) {
		t.Fatalf("the role must not grant Sandboxes; listing them gave %v", err)
	}
	return cfg
}

// A role that grants claims only is all the Python SDK and the CLI need; the Go SDK waited on the Sandbox
// and so failed Open with "forbidden" for a sandbox that had been made. It now waits on the claim's Ready
// and connects with what the claim's status says (name, pod IPs), through the router and by pod IP.
func TestClaimsOnlyCredentialsOpenAndUseASandbox(t *testing.T) {
	t.Parallel()
	cfg := claimsOnlyConfig(t, fmt.Sprintf("claims-only-%d", time.Now().UnixNano()%1_000_000))
	for _, mode := range []string{"router", "pod-ip"} {
		t.Run(mode, func(t *testing.T) {
			opts := sandbox.Options{
				WarmPoolName: cluster.WarmPool, Namespace: cluster.Namespace, RestConfig: cfg, Quiet: true,
				SandboxReadyTimeout: 90 * time.Second,
			}
			if mode == "router" {
				opts.APIURL = cluster.RouterURL
			} else {
				opts.Connectivity = sandbox.ConnectivityInCluster
			}
			sb := open(t, opts)
			if sb.SandboxName() == "" || !strings.HasPrefix(sb.PodIP(), "127.") {
				t.Errorf("identity from the claim: sandbox %q pod IP %q", sb.SandboxName(), sb.PodIP())
			}
			exerciseCommon(t, sb)
			// Status is the claim's (it was "forbidden"); what needs the Sandbox itself says so, not "deleted"
			// or a hang.
			st, err := sb.Status(ctxFor(t, 30*time.Second))
			if err != nil || !st.FromClaim || !st.Ready || st.PodIP != sb.PodIP() || st.PodName != sb.SandboxName() {
				t.Errorf("Status with claims-only credentials: %+v, %v", st, err)
			}
			if err := sb.Suspend(ctxFor(t, 30*time.Second)); err == nil || !strings.Contains(err.Error(), "forbidden") {
				t.Errorf("Suspend with claims-only credentials: %v", err)
			}
		})
	}
}
