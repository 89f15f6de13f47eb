package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	processv1 "agent-sandbox.invalid/clients/go/internal/processv1"
)

// ConnectionStrategy produces the base URL runtime requests go to, and releases what it holds on Close.
// DirectStrategy is the trivial one; the SDK's other modes (gateway, port-forward, in-cluster) are internal.
type ConnectionStrategy interface {
	Connect(ctx context.Context) (baseURL string, err error)
	Close() error
}

// DirectStrategy connects to a fixed URL (Options.APIURL).
type DirectStrategy struct{ URL string }

// Connect returns the URL.
func (d DirectStrategy) Connect(context.Context) (string, error) { return d.URL, nil }

// Close does nothing.
func (DirectStrategy) Close() error { return nil }

// liveConn is an open transport: where requests go, the gRPC client when there is one, how to close it,
// and (for tunnels) a channel closed when it dies.
type liveConn struct {
	ep       *endpoint
	grpcConn *grpc.ClientConn
	proc     processv1.ProcessServiceClient
	died     <-chan struct{}
	dieErr   func() error
	closers  []func()
	closeOne sync.Once
	// closedWhy is why the handle closed this transport (nil while open): calls it cut say so (cut).
	closedWhy atomic.Pointer[string]
	// stopped ends (cause errTransportCut) when the transport is closed: every one-shot call's context is
	// bound to it (bind), so an HTTP call still in flight is cut as gRPC calls and tunnels are. Until
	// December 6 only those were: through a router, a gateway, a pod IP or a Service an HTTP call went on
	// after Close, and returned the runtime's answer once the claim's deletion killed its command (exit -15,
	// nil error).
	stopped context.Context
	stop    context.CancelCauseFunc
}

// errTransportCut is the cause of a call's context the closing of its transport ended.
var errTransportCut = errors.New("the handle closed its transport")

// newLiveConn is an open transport to ep.
func newLiveConn(ep *endpoint) *liveConn {
	c := &liveConn{ep: ep}
	c.stopped, c.stop = context.WithCancelCause(context.Background())
	return c
}

// bind returns ctx, also ended when the transport is closed; unbind releases it.
func (c *liveConn) bind(ctx context.Context) (bound context.Context, unbind func()) {
	if c.stopped == nil {
		return ctx, func() {}
	}
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.stopped, func() { cancel(errTransportCut) })
	return bctx, func() { stop(); cancel(nil) }
}

// cutBound is cut for a call whose bound context (bind) the closing of the transport ended: err is then only
// how the cancellation showed ("context canceled"), and becomes ErrNotReady wrapping ErrTransportClosed.
func (c *liveConn) cutBound(bound context.Context, err error) error {
	why := c.closedWhy.Load()
	if err == nil || why == nil || !errors.Is(context.Cause(bound), errTransportCut) || errors.Is(err, ErrNotReady) {
		return c.cut(err)
	}
	return fmt.Errorf("%w: %w (%s): %v", ErrNotReady, ErrTransportClosed, *why, err)
}

// closeWith closes the transport for the reason why (the handle's noConn text).
func (c *liveConn) closeWith(why string) {
	c.closedWhy.CompareAndSwap(nil, &why)
	c.close()
}

// cut makes err, of a call on this transport, ErrNotReady wrapping ErrTransportClosed when the handle closed
// the transport under it (gRPC's "the client connection is closing", a tunnel closed under an HTTP call);
// other errors, and errors that already say what ended the call, are returned as they are.
func (c *liveConn) cut(err error) error {
	why := c.closedWhy.Load()
	if err == nil || why == nil || errors.Is(err, ErrNotReady) || errors.Is(err, ErrProcessClosed) ||
		errors.Is(err, ErrTimeout) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w (%s): %w", ErrNotReady, ErrTransportClosed, *why, err)
}

func (c *liveConn) close() {
	c.closeOne.Do(func() {
		if c.stop != nil {
			c.stop(errTransportCut)
		}
		if c.grpcConn != nil {
			_ = c.grpcConn.Close()
		}
		for i := len(c.closers) - 1; i >= 0; i-- {
			c.closers[i]()
		}
	})
}

// dead reports a tunnel that died (nil while alive or for transports that cannot die).
func (c *liveConn) dead() error {
	if c.died == nil {
		return nil
	}
	select {
	case <-c.died:
		err := c.dieErr()
		if err == nil {
			return ErrPortForwardDied
		}
		return fmt.Errorf("%w: %v", ErrPortForwardDied, err)
	default:
		return nil
	}
}

func hostURL(scheme, host string, port int) string {
	if port > 0 {
		host = net.JoinHostPort(host, strconv.Itoa(port))
	} else if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return scheme + "://" + host
}

// connect opens the transport of the sandbox's mode (spec 4.6 + the in-cluster modes).
func (s *Sandbox) connect(ctx context.Context, sandboxName string, info sandboxInfo) (*liveConn, error) {
	o := &s.opts
	router := o.routerHeaders()
	podIPRouting := router && o.podIPRouting()
	podIP := ""
	if podIPRouting {
		podIP = info.podIP
	}
	c := newLiveConn(newEndpoint(router, sandboxName, o.Namespace, o.ServerPort, podIP))
	c.ep.sendHeaders = o.toRouter()
	if podIPRouting && s.k8s != nil {
		c.ep.lookupPodIP = func(ctx context.Context) (string, error) { return s.readPodIP(ctx, sandboxName) }
	}
	if s.k8s != nil {
		directIP, viaRouter := "", o.toRouter()
		if o.mode() == modeInClusterPodIP {
			directIP = info.podIP
		}
		c.ep.explain = func(ctx context.Context) (error, error) {
			return s.whyUnreachable(ctx, sandboxName, directIP, viaRouter)
		}
	}
	var base string
	switch o.mode() {
	case modeDirect:
		var err error
		if base, err = (DirectStrategy{URL: o.APIURL}).Connect(ctx); err != nil {
			return nil, err
		}
	case modeGateway:
		addr, err := s.gatewayAddress(ctx)
		if err != nil {
			return nil, err
		}
		base = hostURL(o.GatewayScheme, addr, 0)
	case modeRouterPortForward:
		pod, err := s.routerPod(ctx)
		if err != nil {
			return nil, err
		}
		pf, err := startPortForward(ctx, s.k8s, o.RouterNamespace, pod, []int{RouterPort}, o.PortForwardReadyTimeout)
		if err != nil {
			return nil, err
		}
		c.closers = append(c.closers, pf.close)
		c.died, c.dieErr = pf.done, pf.err
		base = hostURL("http", "127.0.0.1", pf.local[0])
	case modeSandboxdPortForward:
		pf, err := startPortForward(ctx, s.k8s, o.Namespace, info.podName,
			[]int{o.SandboxdRESTPort, o.SandboxdGRPCPort}, o.PortForwardReadyTimeout)
		if err != nil {
			return nil, err
		}
		c.closers = append(c.closers, pf.close)
		c.died, c.dieErr = pf.done, pf.err
		base = hostURL("http", "127.0.0.1", pf.local[0])
		c.ep.grpcTarget = net.JoinHostPort("127.0.0.1", strconv.Itoa(pf.local[1]))
	case modeInClusterPodIP, modeInClusterService:
		host := info.podIP
		if o.mode() == modeInClusterService {
			if info.serviceFQDN == "" {
				return nil, ErrNoService
			}
			host = info.serviceFQDN
		} else if host == "" {
			return nil, fmt.Errorf("%w: the Sandbox has no pod IP yet", ErrNotReady)
		}
		if o.Runtime == RuntimeSandboxd {
			base = hostURL("http", host, o.SandboxdRESTPort)
			c.ep.grpcTarget = net.JoinHostPort(host, strconv.Itoa(o.SandboxdGRPCPort))
		} else {
			base = hostURL("http", host, o.ServerPort)
		}
	}
	u, err := url.Parse(base)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("base URL %q: %w", base, err)
	}
	u.RawQuery, u.Fragment = "", ""
	c.ep.restBase = u
	if o.Runtime == RuntimeSandboxd && c.ep.grpcTarget != "" {
		conn, err := grpc.NewClient("passthrough:///"+c.ep.grpcTarget,
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			c.close()
			return nil, fmt.Errorf("gRPC client for %s: %w", c.ep.grpcTarget, err)
		}
		c.grpcConn = conn
		c.proc = processv1.NewProcessServiceClient(conn)
	}
	return c, nil
}

// gatewayAddress waits (GatewayReadyTimeout) for the Gateway's first usable status address.
func (s *Sandbox) gatewayAddress(ctx context.Context) (string, error) {
	o := &s.opts
	ctx, cancel := context.WithTimeout(ctx, o.GatewayReadyTimeout)
	defer cancel()
	var addr string
	err := s.k8s.observe(ctx, gatewaysGVR, o.GatewayNamespace, o.GatewayName,
		func(obj *unstructured.Unstructured) (bool, error) {
			addr = gatewayAddressOf(obj)
			return addr != "", nil
		})
	switch {
	case err == nil:
		return addr, nil
	case errors.Is(err, errObjectGone):
		return "", fmt.Errorf("gateway %s/%s: %w", o.GatewayNamespace, o.GatewayName, ErrGatewayDeleted)
	case errors.Is(err, context.DeadlineExceeded):
		return "", fmt.Errorf("gateway %s/%s has no address after %s: %w", o.GatewayNamespace, o.GatewayName,
			o.GatewayReadyTimeout, ErrTimeout)
	}
	return "", fmt.Errorf("gateway %s/%s: %w", o.GatewayNamespace, o.GatewayName, err)
}

// gatewayAddressOf is status.addresses[0].value once it is an IP or a hostname without / ? # @.
func gatewayAddressOf(obj *unstructured.Unstructured) string {
	addrs, _, _ := unstructured.NestedSlice(obj.Object, "status", "addresses")
	if len(addrs) == 0 {
		return ""
	}
	m, _ := addrs[0].(map[string]any)
	v, _ := m["value"].(string)
	if v == "" || strings.ContainsAny(v, "/?#@ ") {
		return ""
	}
	if net.ParseIP(v) != nil {
		return v
	}
	if strings.Contains(v, ":") { // not an IP, and a hostname has no colon
		return ""
	}
	return v
}

// routerPod finds a ready Pod behind the router Service: from its EndpointSlices first (upstream's way), else
// from the Pods its selector matches, as `kubectl port-forward svc/...` picks one. The second way covers a
// Pod no EndpointSlice lists: the EndpointSlice controller cannot publish a loopback address (the dev
// cluster's Pods are all on 127.x), and a new Pod may be Ready before its slice is updated.
func (s *Sandbox) routerPod(ctx context.Context) (string, error) {
	ns := s.opts.RouterNamespace
	list, err := s.k8s.Dynamic.Resource(endpointSlicesGVR).Namespace(ns).List(ctx, metav1.ListOptions{
		LabelSelector: "kubernetes.io/service-name=" + RouterServiceName,
	})
	if err != nil {
		return "", fmt.Errorf("listing EndpointSlices of %s/%s: %w", ns, RouterServiceName, err)
	}
	for _, slice := range list.Items {
		if pod := readyEndpointPod(&slice); pod != "" {
			return pod, nil
		}
	}
	pod, why := s.routerPodBySelector(ctx, ns)
	if pod != "" {
		return pod, nil
	}
	if err := ctx.Err(); err != nil { // the fallback ran out of time: say so, not "not ready"
		return "", fmt.Errorf("finding a Pod of %s/%s: %w", ns, RouterServiceName, err)
	}
	return "", fmt.Errorf("%w: service %s/%s has no ready endpoint backed by a Pod (%s)", ErrNotReady, ns, RouterServiceName, why)
}

// routerPodBySelector returns a Running, Ready, not deleting Pod matched by the router Service's selector,
// or "" and why there is none.
func (s *Sandbox) routerPodBySelector(ctx context.Context, ns string) (string, string) {
	svc, err := s.k8s.Dynamic.Resource(servicesGVR).Namespace(ns).Get(ctx, RouterServiceName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Sprintf("reading the Service: %v", err)
	}
	selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	if len(selector) == 0 {
		return "", "the Service has no selector"
	}
	pods, err := s.k8s.Dynamic.Resource(podsGVR).Namespace(ns).List(ctx, metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(selector).String(),
	})
	if err != nil {
		return "", fmt.Sprintf("listing the Pods of its selector: %v", err)
	}
	for _, p := range pods.Items {
		if podReady(&p) {
			return p.GetName(), ""
		}
	}
	return "", fmt.Sprintf("none of the %d Pods its selector matches is Running and Ready", len(pods.Items))
}

// podReady: phase Running, condition Ready True, not being deleted.
func podReady(pod *unstructured.Unstructured) bool {
	if pod.GetDeletionTimestamp() != nil {
		return false
	}
	if phase, _, _ := unstructured.NestedString(pod.Object, "status", "phase"); phase != "Running" {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(pod.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			return m["status"] == "True"
		}
	}
	return false
}

func readyEndpointPod(slice *unstructured.Unstructured) string {
	eps, _, _ := unstructured.NestedSlice(slice.Object, "endpoints")
	for _, e := range eps {
		m, _ := e.(map[string]any)
		ready, found, _ := unstructured.NestedBool(m, "conditions", "ready")
		if found && !ready {
			continue
		}
		kind, _, _ := unstructured.NestedString(m, "targetRef", "kind")
		name, _, _ := unstructured.NestedString(m, "targetRef", "name")
		if kind == "Pod" && name != "" {
			return name
		}
	}
	return ""
}

// readPodIP reads the Sandbox's pod IP now (and keeps it as the handle's PodIP).
func (s *Sandbox) readPodIP(ctx context.Context, sandboxName string) (string, error) {
	var ip string
	obj, err := s.k8s.sandboxes(s.opts.Namespace).Get(ctx, sandboxName, metav1.GetOptions{})
	switch {
	case apierrors.IsForbidden(err):
		// claims-only credentials (waitClaimReady): the claim's status carries the pod IPs too
		claim, cerr := s.boundClaim(ctx, sandboxName)
		if cerr != nil {
			return "", cerr
		}
		ip = claimSandboxInfo(claim).podIP
	case isNotFound(err):
		// (through a router: this lookup is for X-Sandbox-Pod-IP) hibernated and restorable, no pod IP: the
		// router finds the Sandbox by name, and a lifecycle router restores it on request. Until December 6
		// the call ended "no longer exists" here.
		if gone := s.whyMissing(ctx, sandboxName, true); gone != nil {
			return "", gone
		}
		ip = ""
	case err != nil:
		return "", err
	default:
		info := readSandboxInfo(obj)
		if info.mode == "Suspended" {
			return "", fmt.Errorf("%s: %w", s.suspendedText(ctx, obj), ErrNotReady)
		}
		ip = info.podIP
	}
	s.mu.Lock()
	if s.sandboxName == sandboxName {
		s.info.podIP = ip
	}
	s.mu.Unlock()
	return ip, nil
}

// whyMissing says why a Sandbox that was not found cannot be reached (ErrSandboxDeleted): deleted (no
// SandboxArchive), or hibernated and expired (never restored). A hibernated Sandbox that can still be
// restored is nil through a router (viaRouter: a lifecycle router restores it on request, so the call's
// next attempt may be held while it does), and ErrSandboxDeleted straight to the sandbox (nothing there
// restores it; whyGone says how). Until December 6 a Sandbox being hibernated - or just hibernated, while
// the router was holding the request to restore it - ended the call "no longer exists" at the first 502.
func (s *Sandbox) whyMissing(ctx context.Context, sandboxName string, viaRouter bool) error {
	archived, expired := s.hibernation(ctx, sandboxName)
	switch {
	case !archived:
		return fmt.Errorf("Sandbox %s/%s no longer exists (deleted, or its claim expired): %w",
			s.opts.Namespace, sandboxName, ErrSandboxDeleted)
	case expired != nil:
		return expired
	case viaRouter:
		return nil
	}
	return fmt.Errorf("%s: %w", s.hibernatedText(sandboxName), ErrSandboxDeleted)
}

// whyUnreachable reads the Sandbox after a call could not reach it (the Python SDK's explain_unreachable).
// stop is why no further attempt can reach it: ErrSandboxDeleted when it is gone, being deleted, or
// hibernated where nothing restores it (see whyMissing); ErrNotReady when it is suspended, or - directIP,
// the pod IP a ConnectivityInCluster connection goes to ("" otherwise) - on another pod now. note is a state
// that may pass, for the call's error if it fails anyway: that pod not Ready (its runtime container
// restarting: same pod, same address, back in seconds; until December 6 the call ended at once with
// ErrNotReady instead of riding through its attempts), or, through a router, a hibernated Sandbox. Both nil
// when the Sandbox is fine or could not be read: the original error stands.
func (s *Sandbox) whyUnreachable(ctx context.Context, sandboxName, directIP string, viaRouter bool) (stop, note error) {
	where := s.opts.Namespace + "/" + sandboxName
	obj, err := s.k8s.sandboxes(s.opts.Namespace).Get(ctx, sandboxName, metav1.GetOptions{})
	var ready *condition
	var podIP string
	switch {
	case apierrors.IsForbidden(err):
		// claims-only credentials: the claim mirrors the Sandbox's Ready condition and pod IPs
		claim, cerr := s.boundClaim(ctx, sandboxName)
		if cerr != nil {
			if errors.Is(cerr, ErrSandboxDeleted) {
				return cerr, nil
			}
			return nil, nil
		}
		ready, podIP = findCondition(conditionsOf(claim), "Ready"), claimSandboxInfo(claim).podIP
	case isNotFound(err):
		if gone := s.whyMissing(ctx, sandboxName, viaRouter); gone != nil {
			return gone, nil
		}
		return nil, errors.New(s.hibernatedText(sandboxName)) // if the router does not bring it back
	case err != nil:
		return nil, nil
	default:
		info := readSandboxInfo(obj)
		if obj.GetDeletionTimestamp() != nil {
			return fmt.Errorf("Sandbox %s is being deleted: %w", where, ErrSandboxDeleted), nil
		}
		if info.mode == "Suspended" {
			return fmt.Errorf("%s: %w", s.suspendedText(ctx, obj), ErrNotReady), nil
		}
		ready, podIP = findCondition(conditionsOf(obj), "Ready"), info.podIP
	}
	if directIP == "" {
		return nil, nil // through a router or a Service: the router's own errors say the rest
	}
	if podIP != "" && podIP != directIP {
		return fmt.Errorf("Sandbox %s is on another pod now (pod IP %q, this handle connected to %s; it was "+
			"suspended and resumed elsewhere): call Disconnect, then Open to reconnect: %w", where, podIP, directIP,
			ErrNotReady), nil
	}
	if ready == nil || ready.Status != "True" {
		why := "no Ready condition"
		if ready != nil {
			why = fmt.Sprintf("Ready=%s, reason %s", ready.Status, ready.Reason)
			if ready.Message != "" {
				why += ": " + ready.Message
			}
		}
		return nil, fmt.Errorf("Sandbox %s is not Ready (%s): %w", where, why, ErrNotReady)
	}
	return nil, nil
}
