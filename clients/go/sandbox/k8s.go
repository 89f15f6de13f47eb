package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Resources the SDK touches (spec 0.1). All through the dynamic client: the SDK needs a handful of fields,
// and generated clientsets would add minutes of compile time for nothing.
var (
	claimsGVR         = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxclaims"}
	sandboxesGVR      = schema.GroupVersionResource{Group: "agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxes"}
	gatewaysGVR       = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	endpointSlicesGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	servicesGVR       = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	podsGVR           = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

const (
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 5 * time.Second
)

// K8sHelper holds the Kubernetes clients of one or more sandboxes (share it through Options.K8sHelper).
type K8sHelper struct {
	// Config is the REST config every client (and port-forward) uses.
	Config *rest.Config
	// Dynamic is the dynamic client for claims, Sandboxes, Gateways, EndpointSlices, Services and Pods.
	Dynamic dynamic.Interface
	log     logr.Logger
	// sandboxesForbidden: these credentials were refused Sandboxes (a role granting claims only), so waits
	// go straight to the claim instead of asking for the Sandbox again on every Open.
	sandboxesForbidden atomic.Bool
}

// NewK8sHelper builds the clients from cfg; nil cfg means in-cluster config, else the default kubeconfig
// loading rules (KUBECONFIG, ~/.kube/config).
func NewK8sHelper(cfg *rest.Config, log logr.Logger) (*K8sHelper, error) {
	if cfg == nil {
		var err error
		if cfg, err = defaultRestConfig(); err != nil {
			return nil, err
		}
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "agent-sandbox-go-client"
	}
	if cfg.QPS == 0 && cfg.Burst == 0 && cfg.RateLimiter == nil {
		// client-go's unset default is 5 requests/s (burst 10): a create is ~5 requests, so goroutines opening
		// sandboxes together queued behind each other ("client-side throttling", 12 sandboxes: 1.2 s of
		// waits each). As controller-runtime does since 2025 (#3119), on SIG API Machinery's advice: no client-side
		// limit, the API server's Priority and Fairness decides. Set QPS/Burst or RateLimiter to have one.
		cfg.QPS = -1
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return recordAttempts{rt} })
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	return &K8sHelper{Config: cfg, Dynamic: dyn, log: log}, nil
}

func defaultRestConfig() (*rest.Config, error) {
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes configuration (in-cluster or kubeconfig): %w", err)
	}
	return cfg, nil
}

func (k *K8sHelper) claims(ns string) dynamic.ResourceInterface {
	return k.Dynamic.Resource(claimsGVR).Namespace(ns)
}

func (k *K8sHelper) sandboxes(ns string) dynamic.ResourceInterface {
	return k.Dynamic.Resource(sandboxesGVR).Namespace(ns)
}

// deleteClaim deletes a claim; a claim already gone is success. uid, when set, is a precondition (a claim
// re-created under the same name is never deleted by a rollback or a Close): the API server refuses it with
// 409 Conflict then, which is success too - the claim with that UID is gone.
func (k *K8sHelper) deleteClaim(ctx context.Context, ns, name string, uid types.UID) error {
	opts := metav1.DeleteOptions{}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := k.claims(ns).Delete(ctx, name, opts)
	if err == nil || apierrors.IsNotFound(err) || (uid != "" && apierrors.IsConflict(err)) {
		return nil
	}
	return err
}

// errObjectGone: the observed object does not exist or was deleted.
var errObjectGone = errors.New("object is gone")

// observe reads the object ns/name of gvr and then watches it, calling check with the current state and
// after every change until check says done or fails. A missing or deleted object is errObjectGone. Broken
// watches are re-established from a fresh list, backing off 100 ms -> 5 s; errors the API server will
// repeat (forbidden, unknown resource, invalid) end the wait at once.
func (k *K8sHelper) observe(ctx context.Context, gvr schema.GroupVersionResource, ns, name string,
	check func(obj *unstructured.Unstructured) (bool, error)) error {
	res := k.Dynamic.Resource(gvr).Namespace(ns)
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	delay := watchBackoffMin
	pause := func() error {
		if err := sleepCtx(ctx, delay); err != nil {
			return err
		}
		delay = min(delay*2, watchBackoffMax)
		return nil
	}
	for {
		list, err := res.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if permanentAPIError(err) {
				return err
			}
			k.log.V(1).Info("list failed; retrying", "resource", gvr.Resource, "name", name, "error", err.Error())
			if err := pause(); err != nil {
				return err
			}
			continue
		}
		if len(list.Items) == 0 {
			return errObjectGone
		}
		if done, err := check(&list.Items[0]); done || err != nil {
			return err
		}
		w, err := res.Watch(ctx, metav1.ListOptions{
			FieldSelector: sel, ResourceVersion: list.GetResourceVersion(), AllowWatchBookmarks: true,
		})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if permanentAPIError(err) {
				return err
			}
			if err := pause(); err != nil {
				return err
			}
			continue
		}
		done, err := k.drainWatch(ctx, w, check)
		w.Stop()
		if done || err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := pause(); err != nil {
			return err
		}
	}
}

// drainWatch feeds watch events to check until done, an error, or the watch ends (false, nil: relist).
func (k *K8sHelper) drainWatch(ctx context.Context, w watch.Interface,
	check func(obj *unstructured.Unstructured) (bool, error)) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				obj, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				if done, err := check(obj); done || err != nil {
					return done, err
				}
			case watch.Deleted:
				return false, errObjectGone
			case watch.Error:
				// typically 410 Gone (resourceVersion too old): relist
				return false, nil
			}
		}
	}
}

func permanentAPIError(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err) ||
		(apierrors.IsNotFound(err) && !isObjectNotFound(err))
}

// isObjectNotFound tells a missing object (which a list never returns) from a missing resource type.
func isObjectNotFound(err error) bool {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		d := st.Status().Details
		return d != nil && d.Name != ""
	}
	return false
}

// condition is a metav1.Condition read from unstructured status.
type condition struct {
	Type, Status, Reason, Message string
	// ObservedGeneration is the metadata.generation the condition was written for (0 when absent).
	ObservedGeneration int64
}

func conditionsOf(obj *unstructured.Unstructured) []condition {
	raw, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	out := make([]condition, 0, len(raw))
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		str := func(k string) string { s, _ := m[k].(string); return s }
		c := condition{Type: str("type"), Status: str("status"), Reason: str("reason"), Message: str("message")}
		switch g := m["observedGeneration"].(type) { // int64 from the API server's JSON; float64 in fakes
		case int64:
			c.ObservedGeneration = g
		case float64:
			c.ObservedGeneration = int64(g)
		}
		out = append(out, c)
	}
	return out
}

func findCondition(conds []condition, typ string) *condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

func describeConditions(conds []condition) string {
	if len(conds) == 0 {
		return "no conditions"
	}
	s := ""
	for i, c := range conds {
		if i > 0 {
			s += "; "
		}
		s += fmt.Sprintf("%s=%s", c.Type, c.Status)
		if c.Reason != "" {
			s += " (" + c.Reason
			if c.Message != "" {
				s += ": " + c.Message
			}
			s += ")"
		}
	}
	return s
}

// claimTerminal returns the ConditionError for a claim condition the SDK gives up on (spec 0.2), or nil.
func claimTerminal(obj *unstructured.Unstructured) *ConditionError {
	for _, c := range conditionsOf(obj) {
		terminal := c.Reason == reasonWarmPoolNotFound ||
			(c.Type == "Ready" && c.Status == "False" && terminalReasons[c.Reason]) || rejectedAsInvalid(c)
		if terminal {
			return &ConditionError{Kind: "SandboxClaim", Namespace: obj.GetNamespace(), Name: obj.GetName(),
				Type: c.Type, Reason: c.Reason, Message: c.Message}
		}
	}
	return nil
}

// rejectedAsInvalid is ours (upstream waits out the timeout): a Ready=False ReconcilerError whose message is
// the API server's 422 for a child object (`Pod "x" is invalid: spec.containers[0].name: ...`) or Pod
// Security admission's refusal (`pods "x" is forbidden: violates PodSecurity "restricted:latest": ...`).
// Neither changes on a retry, so the claim cannot become Ready (a quota's 403 can heal: not matched).
func rejectedAsInvalid(c condition) bool {
	return c.Type == "Ready" && c.Status == "False" && c.Reason == "ReconcilerError" &&
		(strings.Contains(c.Message, " is invalid: ") || strings.Contains(c.Message, " is forbidden: violates PodSecurity "))
}

// sandboxTerminalReasons are Sandbox Ready=False reasons that will not heal by waiting.
var sandboxTerminalReasons = map[string]bool{"PodFailed": true, "PodSucceeded": true, "SandboxExpired": true}

// claimSandboxName is status.sandbox.name of a claim (the legacy key "Name" is accepted too).
func claimSandboxName(obj *unstructured.Unstructured) string {
	if n, _, _ := unstructured.NestedString(obj.Object, "status", "sandbox", "name"); n != "" {
		return n
	}
	n, _, _ := unstructured.NestedString(obj.Object, "status", "sandbox", "Name")
	return n
}

// sandboxInfo is what a handle records from its Sandbox (spec 4.5 step 4).
type sandboxInfo struct {
	podName     string
	podIP       string
	serviceFQDN string
	annotations map[string]string
	mode        string
}

func readSandboxInfo(obj *unstructured.Unstructured) sandboxInfo {
	info := sandboxInfo{podName: obj.GetName(), annotations: obj.GetAnnotations()}
	if n := info.annotations[PodNameAnnotation]; n != "" {
		info.podName = n
	}
	ips, _, _ := unstructured.NestedStringSlice(obj.Object, "status", "podIPs")
	info.podIP = pickPodIP(ips)
	info.serviceFQDN, _, _ = unstructured.NestedString(obj.Object, "status", "serviceFQDN")
	info.mode, _, _ = unstructured.NestedString(obj.Object, "spec", "operatingMode")
	return info
}

// claimSandboxInfo is what a claim's status tells of its Sandbox (status.sandbox.name and podIPs), for
// credentials that cannot read Sandboxes: the pod is taken to be named after the Sandbox.
func claimSandboxInfo(obj *unstructured.Unstructured) sandboxInfo {
	name := claimSandboxName(obj)
	ips, _, _ := unstructured.NestedStringSlice(obj.Object, "status", "sandbox", "podIPs")
	return sandboxInfo{podName: name, podIP: pickPodIP(ips)}
}

// pickPodIP returns the first IPv4 address (IPv4-mapped IPv6 converted), else the first valid IP, else "".
func pickPodIP(ips []string) string {
	first := ""
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			continue
		}
		if v4 := ip.To4(); v4 != nil {
			return v4.String()
		}
		if first == "" {
			first = ip.String()
		}
	}
	return first
}
