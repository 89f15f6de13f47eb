package sandbox

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http/httpguts"
	"k8s.io/client-go/rest"
)

// Runtime selects the protocol the sandbox container speaks (spec §2). There is no auto-detection.
type Runtime string

const (
	// RuntimeLegacyPython is the python-runtime HTTP API (POST /execute, /upload, GET /download|list|exists)
	// on ServerPort, reached through the router unless Connectivity selects the Pod. Default.
	RuntimeLegacyPython Runtime = "legacy-python"
	// RuntimeSandboxd is sandboxd (KEP-539.2): REST files on SandboxdRESTPort plus the gRPC ProcessService on
	// SandboxdGRPCPort, reached on the sandbox Pod (the router cannot carry the gRPC service).
	RuntimeSandboxd Runtime = "sandboxd"
)

// Connectivity selects how the runtime is reached when neither APIURL nor GatewayName decides it.
type Connectivity string

const (
	// ConnectivityPortForward: a SPDY port-forward through the API server, to the router Pod (legacy) or to
	// the sandbox Pod (sandboxd). Works wherever a kubeconfig does. Default.
	ConnectivityPortForward Connectivity = "port-forward"
	// ConnectivityInCluster dials the sandbox Pod IP (Sandbox status.podIPs) directly, without router
	// headers: ServerPort for the legacy runtime, SandboxdRESTPort/SandboxdGRPCPort for sandboxd.
	ConnectivityInCluster Connectivity = "in-cluster"
	// ConnectivityInClusterService dials the Sandbox's headless Service (status.serviceFQDN); the template
	// must set spec.service: true, otherwise Open fails with ErrNoService.
	ConnectivityInClusterService Connectivity = "in-cluster-service"
)

// Names the router and the controller agree on (spec §0, §1.2).
const (
	// PodNameAnnotation on a Sandbox names its Pod (absent: the Pod is named like the Sandbox).
	PodNameAnnotation = "agents.x-k8s.io/pod-name"
	// CreatedByLabel marks claims made by this SDK (value "go-client").
	CreatedByLabel = "agents.x-k8s.io/created-by"
	// FirstRequestedAtAnnotation records when the client asked for the sandbox (RFC 3339, UTC, nanoseconds).
	FirstRequestedAtAnnotation = "agents.x-k8s.io/client-first-requested-at"
	// ClientRequestIDAnnotation (ours: not in upstream's spec, read by nothing but this SDK) is a random id
	// (128 bits, hex) of the create that made the claim: a create whose answer was lost adopts (or deletes) a
	// claim only when it carries this id, since client-first-requested-at alone is not unique - a Windows
	// clock ticks every 0.5-15.6 ms, macOS's every microsecond.
	ClientRequestIDAnnotation = "agents.x-k8s.io/client-request-id"
	// TraceContextAnnotation carries the W3C trace context of the Open span, when tracing is on.
	TraceContextAnnotation = "opentelemetry.io/trace-context"
	// RouterServiceName is the router's Service, whose Pod port-forward mode finds through its EndpointSlices
	// (or, failing that, its selector).
	RouterServiceName = "sandbox-router-svc"
	// RouterPort is the router's proxy port on its Pod.
	RouterPort = 8080
)

const (
	defaultNamespace               = "default"
	defaultServerPort              = 8888
	defaultSandboxdRESTPort        = 8080
	defaultSandboxdGRPCPort        = 9090
	defaultSandboxReadyTimeout     = 180 * time.Second
	defaultGatewayReadyTimeout     = 180 * time.Second
	defaultPortForwardReadyTimeout = 30 * time.Second
	defaultCleanupTimeout          = 30 * time.Second
	defaultRequestTimeout          = 180 * time.Second
	defaultPerAttemptTimeout       = 60 * time.Second
	defaultMaxDownloadSize         = 256 << 20
	defaultMaxUploadSize           = 256 << 20
	defaultTraceServiceName        = "sandbox-client"
)

// EnvVar is one entry of the claim's spec.env: injected into the sandbox container (forces a cold start,
// and the template must allow it).
type EnvVar struct {
	Name  string
	Value string
	// ContainerName targets one container; empty means the template's default.
	ContainerName string
}

// Options configures a Sandbox (New) or a Client (NewClient). The zero value of every field means its
// default. Fields marked "ours" are not in the upstream Go SDK.
type Options struct {
	// WarmPoolName is the SandboxWarmPool a new claim names (spec.warmPoolRef.name). Required for Open of a
	// new sandbox; a DNS subdomain. On a Client it is the default for CreateSandbox.
	WarmPoolName string

	// ClaimName (ours) gives the claim an explicit name instead of generateName "sandbox-claim-". An Open
	// that fails never deletes an explicitly named claim. The handle owns the claim once its create answered;
	// when the answer was lost (a deadline, a connection reset after the request went out), the claim of that
	// name is read and, if it carries this request's created-by label and client-first-requested-at stamp,
	// owned as well (Close deletes it, Open waits for it).
	ClaimName string

	// Runtime selects the runtime protocol. Default RuntimeLegacyPython.
	Runtime Runtime

	// Connectivity selects the transport when APIURL and GatewayName are empty. Default
	// ConnectivityPortForward. The in-cluster modes conflict with APIURL and GatewayName.
	Connectivity Connectivity

	// SandboxdRESTPort and SandboxdGRPCPort are sandboxd's pod ports. Defaults 8080 / 9090; must differ.
	SandboxdRESTPort int
	SandboxdGRPCPort int

	// Namespace of the claim. Default "default"; a DNS label.
	Namespace string

	// GatewayName selects gateway mode: the base URL is <GatewayScheme>://<status.addresses[0].value> of
	// this gateway.networking.k8s.io/v1 Gateway. GatewayNamespace defaults to "default", GatewayScheme to
	// "http". Not with RuntimeSandboxd.
	GatewayName      string
	GatewayNamespace string
	GatewayScheme    string

	// APIURL selects direct mode: requests go to this http(s) URL (normally the router). It wins over every
	// other mode. With RuntimeSandboxd only the REST calls can use it (Run then fails with ErrNotReady).
	// Left empty with Runtime, Connectivity and GatewayName unset, it is read from $AGENT_SANDBOX_ROUTER_URL.
	APIURL string

	// RouterNamespace (ours) is where port-forward mode looks for the router Service's EndpointSlices (and,
	// when none lists a ready Pod, the Pods of its selector, as kubectl does). Default: the sandbox Namespace
	// (upstream's behaviour).
	RouterNamespace string

	// ServerPort is the legacy runtime's port (X-Sandbox-Port, or the Pod port in-cluster). Default 8888.
	ServerPort int

	// Headers (ours) are added to every runtime request that goes to a router or a gateway (modes APIURL,
	// GatewayName and router port-forward), e.g. Authorization for a router with authz. They are never sent
	// to the sandbox itself (pod IP, Service and sandboxd port-forward modes): its code is not trusted with
	// the router's credentials. Router headers (X-Sandbox-*) may not be set here, nor names and values no HTTP
	// request can carry (New: ErrInvalidArgument).
	Headers http.Header

	// Labels (ours) are added to the claim's labels; PodLabels / PodAnnotations go to
	// spec.additionalPodMetadata; Env to spec.env.
	Labels         map[string]string
	PodLabels      map[string]string
	PodAnnotations map[string]string
	Env            []EnvVar

	// ShutdownAfter (ours), when positive, sets spec.lifecycle.shutdownTime to now+ShutdownAfter (whole
	// seconds) with shutdownPolicy Delete: the controller deletes the claim then.
	ShutdownAfter time.Duration

	// SandboxReadyTimeout bounds name resolution and readiness together. Default 180 s.
	SandboxReadyTimeout time.Duration
	// GatewayReadyTimeout bounds the wait for the Gateway address. Default 180 s.
	GatewayReadyTimeout time.Duration
	// PortForwardReadyTimeout bounds tunnel set-up. Default 30 s.
	PortForwardReadyTimeout time.Duration
	// CleanupTimeout bounds claim deletion on rollback and Close (detached from the caller's context).
	// Default 30 s.
	CleanupTimeout time.Duration
	// RequestTimeout bounds one call (all attempts and waits) when its context has no deadline. Default 180 s.
	RequestTimeout time.Duration
	// PerAttemptTimeout bounds the wait for response headers of one attempt. Default 60 s. A Run with
	// WithCommandTimeout(d) waits up to max(PerAttemptTimeout, d+10s).
	PerAttemptTimeout time.Duration
	// MaxDownloadSize caps Read; MaxUploadSize caps Write. Defaults 256 MiB each.
	MaxDownloadSize int64
	MaxUploadSize   int64

	// Logger receives the SDK's log lines. Default: stderr with timestamps; Quiet discards them.
	Logger logr.Logger
	Quiet  bool

	// K8sHelper shares Kubernetes clients between sandboxes; otherwise one is built from RestConfig, or from
	// in-cluster config, or from the default kubeconfig rules (KUBECONFIG, ~/.kube/config).
	K8sHelper  *K8sHelper
	RestConfig *rest.Config

	// HTTPTransport replaces the SDK's transport for runtime requests (custom TLS, proxies). It stays the
	// caller's: Close and Disconnect leave its connections alone (those of the transport the SDK builds for
	// each handle otherwise are closed).
	HTTPTransport http.RoundTripper

	// TraceServiceName prefixes span names ("<name>.run"). Default "sandbox-client".
	TraceServiceName string
	// TracerProvider creates spans; nil means no spans. W3C trace context is sent either way when the
	// caller's context carries a span.
	TracerProvider trace.TracerProvider

	// DisablePodIPRouting stops sending X-Sandbox-Pod-IP in router modes (the router then resolves by name).
	// Without it the pod IP is still left out when Headers carry a scoped token (Authorization "Bearer
	// v1.<payload>.<signature>"): a router in scoped-token authz mode refuses requests that name a pod IP.
	DisablePodIPRouting bool
}

// RouterURLEnv names the environment variable that supplies APIURL when no mode is chosen (the Python
// SDK and the CLI read the same variable; `agent-sandbox dev router-url` prints it for a dev cluster).
const RouterURLEnv = "AGENT_SANDBOX_ROUTER_URL"

func (o *Options) setDefaults() {
	if o.APIURL == "" && o.GatewayName == "" && o.Runtime == "" && o.Connectivity == "" {
		o.APIURL = os.Getenv(RouterURLEnv)
	}
	if o.Runtime == "" {
		o.Runtime = RuntimeLegacyPython
	}
	if o.Connectivity == "" {
		o.Connectivity = ConnectivityPortForward
	}
	if o.Namespace == "" {
		o.Namespace = defaultNamespace
	}
	if o.GatewayNamespace == "" {
		o.GatewayNamespace = defaultNamespace
	}
	if o.GatewayScheme == "" {
		o.GatewayScheme = "http"
	}
	if o.RouterNamespace == "" {
		o.RouterNamespace = o.Namespace
	}
	setInt(&o.ServerPort, defaultServerPort)
	setInt(&o.SandboxdRESTPort, defaultSandboxdRESTPort)
	setInt(&o.SandboxdGRPCPort, defaultSandboxdGRPCPort)
	setDuration(&o.SandboxReadyTimeout, defaultSandboxReadyTimeout)
	setDuration(&o.GatewayReadyTimeout, defaultGatewayReadyTimeout)
	setDuration(&o.PortForwardReadyTimeout, defaultPortForwardReadyTimeout)
	setDuration(&o.CleanupTimeout, defaultCleanupTimeout)
	setDuration(&o.RequestTimeout, defaultRequestTimeout)
	setDuration(&o.PerAttemptTimeout, defaultPerAttemptTimeout)
	if o.MaxDownloadSize == 0 {
		o.MaxDownloadSize = defaultMaxDownloadSize
	}
	if o.MaxUploadSize == 0 {
		o.MaxUploadSize = defaultMaxUploadSize
	}
	if o.TraceServiceName == "" {
		o.TraceServiceName = defaultTraceServiceName
	}
	if o.Logger.GetSink() == nil {
		if o.Quiet {
			o.Logger = logr.Discard()
		} else {
			o.Logger = funcr.New(func(prefix, args string) {
				if prefix != "" {
					fmt.Fprintf(os.Stderr, "%s: %s\n", prefix, args)
					return
				}
				fmt.Fprintln(os.Stderr, args)
			}, funcr.Options{LogTimestamp: true})
		}
	}
}

func setInt(v *int, def int) {
	if *v == 0 {
		*v = def
	}
}

func setDuration(v *time.Duration, def time.Duration) {
	if *v == 0 {
		*v = def
	}
}

var (
	dnsLabelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// Kubernetes label keys: optional DNS-subdomain prefix + "/" + name; values: name syntax or empty.
	labelNameRE = regexp.MustCompile(`^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$`)
	envNameRE   = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)
)

func isDNSLabel(s string) bool { return len(s) <= 63 && dnsLabelRE.MatchString(s) }

func isDNSSubdomain(s string) bool { return len(s) <= 253 && dnsSubdomainRE.MatchString(s) }

func validLabelKey(k string) bool {
	name := k
	if i := strings.LastIndex(k, "/"); i >= 0 {
		prefix := k[:i]
		name = k[i+1:]
		if !isDNSSubdomain(prefix) {
			return false
		}
	}
	return len(name) <= 63 && labelNameRE.MatchString(name)
}

func validLabelValue(v string) bool { return v == "" || (len(v) <= 63 && labelNameRE.MatchString(v)) }

func validatePort(field string, p int) error {
	if p <= 0 || p > 65535 {
		return invalidf("%s must be between 1 and 65535, got %d", field, p)
	}
	return nil
}

func validateWarmPoolName(name string) error {
	if name == "" {
		return invalidf("WarmPoolName is required")
	}
	if !isDNSSubdomain(name) {
		return invalidf("WarmPoolName %q is not a valid Kubernetes DNS subdomain name", name)
	}
	return nil
}

// validate checks options after setDefaults. WarmPoolName is checked by Open (a Client may leave it empty).
func (o *Options) validate() error {
	if o.APIURL != "" {
		u, err := url.Parse(o.APIURL)
		if err != nil {
			return invalidf("APIURL %q is not a valid URL: %v", o.APIURL, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return invalidf("APIURL must have an http or https scheme, got %q", o.APIURL)
		}
		if u.Host == "" {
			return invalidf("APIURL %q must include a host", o.APIURL)
		}
	}
	// in a fixed order, Namespace first: RouterNamespace defaults to it, and until December 6 (map order) a bad
	// Namespace was reported as RouterNamespace about 40% of the time
	for _, f := range []struct{ field, ns string }{
		{"Namespace", o.Namespace}, {"GatewayNamespace", o.GatewayNamespace}, {"RouterNamespace", o.RouterNamespace},
	} {
		if !isDNSLabel(f.ns) {
			return invalidf("%s %q is not a valid Kubernetes namespace (DNS label)", f.field, f.ns)
		}
	}
	if o.WarmPoolName != "" {
		if err := validateWarmPoolName(o.WarmPoolName); err != nil {
			return err
		}
	}
	if o.ClaimName != "" && !isDNSSubdomain(o.ClaimName) {
		return invalidf("ClaimName %q is not a valid Kubernetes DNS subdomain name", o.ClaimName)
	}
	if o.GatewayName != "" && !isDNSSubdomain(o.GatewayName) {
		return invalidf("GatewayName %q is not a valid Kubernetes DNS subdomain name", o.GatewayName)
	}
	if o.GatewayScheme != "http" && o.GatewayScheme != "https" {
		return invalidf("GatewayScheme must be \"http\" or \"https\", got %q", o.GatewayScheme)
	}
	if err := validatePort("ServerPort", o.ServerPort); err != nil {
		return err
	}
	switch o.Runtime {
	case RuntimeLegacyPython, RuntimeSandboxd:
	default:
		return invalidf("Runtime must be %q or %q, got %q", RuntimeLegacyPython, RuntimeSandboxd, o.Runtime)
	}
	switch o.Connectivity {
	case ConnectivityPortForward:
	case ConnectivityInCluster, ConnectivityInClusterService:
		if o.APIURL != "" || o.GatewayName != "" {
			return invalidf("Connectivity %q cannot be combined with APIURL or GatewayName: both pick the endpoint",
				o.Connectivity)
		}
	default:
		return invalidf("Connectivity must be %q, %q or %q, got %q", ConnectivityPortForward,
			ConnectivityInCluster, ConnectivityInClusterService, o.Connectivity)
	}
	if o.Runtime == RuntimeSandboxd {
		if o.GatewayName != "" {
			return invalidf("RuntimeSandboxd cannot be combined with GatewayName: sandboxd is reached on the " +
				"sandbox Pod, not through the router")
		}
		if err := validatePort("SandboxdRESTPort", o.SandboxdRESTPort); err != nil {
			return err
		}
		if err := validatePort("SandboxdGRPCPort", o.SandboxdGRPCPort); err != nil {
			return err
		}
		if o.SandboxdRESTPort == o.SandboxdGRPCPort {
			return invalidf("SandboxdRESTPort and SandboxdGRPCPort must differ (both %d)", o.SandboxdRESTPort)
		}
	}
	for name, values := range o.Headers {
		// what net/http would refuse on every request (until December 6 each call then failed as ErrConnection)
		if !httpguts.ValidHeaderFieldName(name) {
			return invalidf("Headers: %q is not a valid HTTP header name", name)
		}
		for _, v := range values {
			if !httpguts.ValidHeaderFieldValue(v) {
				return invalidf("Headers: the value of %q is not a valid HTTP header value (control characters "+
					"such as CR, LF or NUL)", name)
			}
		}
		if strings.HasPrefix(http.CanonicalHeaderKey(name), "X-Sandbox-") {
			return invalidf("Headers may not set router header %q (the SDK sets the X-Sandbox-* headers)", name)
		}
	}
	for _, m := range []struct {
		field  string
		labels map[string]string
	}{{"Labels", o.Labels}, {"PodLabels", o.PodLabels}} {
		for k, v := range m.labels {
			if !validLabelKey(k) || !validLabelValue(v) {
				return invalidf("%s entry %q=%q is not a valid Kubernetes label", m.field, k, v)
			}
		}
	}
	for k := range o.PodAnnotations {
		if !validLabelKey(k) {
			return invalidf("PodAnnotations key %q is not a valid Kubernetes annotation key", k)
		}
	}
	for i, e := range o.Env {
		if !envNameRE.MatchString(e.Name) || e.Name == "." || e.Name == ".." || strings.HasPrefix(e.Name, "..") {
			return invalidf("Env[%d].Name %q is not a valid environment variable name", i, e.Name)
		}
	}
	if o.ShutdownAfter < 0 {
		return invalidf("ShutdownAfter must not be negative")
	}
	for _, f := range []struct {
		field string
		d     time.Duration
	}{
		{"SandboxReadyTimeout", o.SandboxReadyTimeout}, {"GatewayReadyTimeout", o.GatewayReadyTimeout},
		{"PortForwardReadyTimeout", o.PortForwardReadyTimeout}, {"CleanupTimeout", o.CleanupTimeout},
		{"RequestTimeout", o.RequestTimeout}, {"PerAttemptTimeout", o.PerAttemptTimeout},
	} {
		if f.d <= 0 {
			return invalidf("%s must be positive, got %s", f.field, f.d)
		}
	}
	if o.MaxDownloadSize <= 0 || o.MaxUploadSize <= 0 {
		return invalidf("MaxDownloadSize and MaxUploadSize must be positive")
	}
	return nil
}

// mode is the transport a sandbox uses, decided once from the options (spec 4.3 "Mode selection").
type mode int

const (
	modeDirect mode = iota
	modeGateway
	modeRouterPortForward
	modeSandboxdPortForward
	modeInClusterPodIP
	modeInClusterService
)

func (o *Options) mode() mode {
	switch {
	case o.APIURL != "":
		return modeDirect
	case o.Connectivity == ConnectivityInCluster:
		return modeInClusterPodIP
	case o.Connectivity == ConnectivityInClusterService:
		return modeInClusterService
	case o.Runtime == RuntimeSandboxd:
		return modeSandboxdPortForward
	case o.GatewayName != "":
		return modeGateway
	default:
		return modeRouterPortForward
	}
}

// toRouter says whether runtime requests go to a router or a gateway (any runtime), not to the sandbox itself.
func (o *Options) toRouter() bool {
	m := o.mode()
	return m == modeDirect || m == modeGateway || m == modeRouterPortForward
}

// routerHeaders says whether requests carry X-Sandbox-* headers: only router modes with the legacy runtime.
func (o *Options) routerHeaders() bool {
	return o.Runtime == RuntimeLegacyPython && o.toRouter()
}

// scopedTokenRE is an Authorization value carrying a scoped token as routers in scoped-token authz mode
// verify it (spec 1.10: "Bearer v1.<payload>.<signature>", base64url), the Python SDK's pattern.
var scopedTokenRE = regexp.MustCompile(`(?i)^\s*bearer\s+v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\s*$`)

// podIPRouting says whether router requests may carry X-Sandbox-Pod-IP: not when DisablePodIPRouting is
// set, nor when Headers carry a scoped token - a router in scoped-token mode refuses a request that names a
// pod IP with 403 (spec 1.10 step 2) and finds the pod by the Sandbox's name. The Python SDK decides the
// same way (pod_ip_routing); until December 6 every call through such a router failed unless the user
// knew to set DisablePodIPRouting.
func (o *Options) podIPRouting() bool {
	if o.DisablePodIPRouting {
		return false
	}
	for name, values := range o.Headers {
		if !strings.EqualFold(name, "Authorization") {
			continue
		}
		for _, v := range values {
			if scopedTokenRE.MatchString(v) {
				return false
			}
		}
	}
	return true
}
