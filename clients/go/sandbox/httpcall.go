package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Router header names, spelled as the spec spells them (set without Go's canonicalisation).
const (
	headerSandboxID        = "X-Sandbox-ID"
	headerSandboxNamespace = "X-Sandbox-Namespace"
	headerSandboxPort      = "X-Sandbox-Port"
	headerSandboxPodIP     = "X-Sandbox-Pod-IP"
	headerSandboxTimeout   = "X-Sandbox-Timeout"
	headerRequestID        = "X-Request-ID"
)

const (
	defaultFileAttempts = 6
	defaultRunAttempts  = 1
	maxRunResponse      = 16 << 20 // legacy /execute JSON
	maxListResponse     = 32 << 20 // listings and exists answers (~380,000 legacy entries; 8 MiB refused 100,000)
	backoffFirst        = 500 * time.Millisecond
	backoffCap          = 8 * time.Second
	backoffJitter       = 0.25
	commandTimeoutSlack = 10 * time.Second
)

// endpoint is where runtime requests of one connection go.
type endpoint struct {
	restBase   *url.URL // base URL; may carry a path prefix
	grpcTarget string   // host:port of process.v1; "" when this transport has none
	router     bool     // send X-Sandbox-* routing headers
	sandboxID  string
	namespace  string
	serverPort int
	podIP      atomic.Pointer[string] // X-Sandbox-Pod-IP; nil when unknown, disabled or refused
	// podIPStale is set when the router could not reach podIP (a 502): the Sandbox may have a new pod (it was
	// suspended and resumed by the lifecycle controller, another client, the CLI), so it is read again.
	podIPStale atomic.Bool
	// lookupPodIP reads the Sandbox's pod IP now ("" for none); nil when the pod IP is not sent.
	lookupPodIP func(ctx context.Context) (string, error)
	// explain reads the Sandbox after a call could not reach it (Sandbox.whyUnreachable): stop is why no
	// attempt can reach it (ErrSandboxDeleted: gone; ErrNotReady: suspended, or for a connection to the pod's
	// own address on another pod now); note a state that may pass (that pod not Ready), named in the call's
	// error only if it fails anyway. nil func: no Kubernetes client.
	explain func(ctx context.Context) (stop, note error)
	// sendHeaders: the requests go to a router or a gateway, so Options.Headers (its credentials) go with
	// them. Until December 6 they went to the sandbox too (pod IP, Service, sandboxd port-forward modes),
	// handing e.g. the router's Authorization token to the code running in it.
	sendHeaders bool
}

func newEndpoint(router bool, sandboxID, namespace string, serverPort int, podIP string) *endpoint {
	ep := &endpoint{router: router, sandboxID: sandboxID, namespace: namespace, serverPort: serverPort}
	if router && podIP != "" {
		ep.podIP.Store(&podIP)
	}
	return ep
}

// viaRouter: the requests go to a router or a gateway (with either runtime; router is the legacy runtime's
// X-Sandbox-* headers only), so a request without response says nothing of the sandbox.
func (ep *endpoint) viaRouter() bool { return ep.sendHeaders }

// currentPodIP is the X-Sandbox-Pod-IP to send ("" for none).
func (ep *endpoint) currentPodIP() string {
	if p := ep.podIP.Load(); p != nil {
		return *p
	}
	return ""
}

// podIPForAttempt is the pod IP to send now, read again from the Sandbox first when it went stale. The
// error is the lookup's when it found the Sandbox gone (ErrSandboxDeleted) or suspended (ErrNotReady): no
// attempt can reach it then. Other lookup failures are not the call's (the cached IP is sent).
func (ep *endpoint) podIPForAttempt(ctx context.Context) (string, error) {
	if ep.podIPStale.Load() && ep.lookupPodIP != nil {
		lctx, cancel := context.WithTimeout(ctx, explainTimeout) // as whyUnreachable: not the call's budget
		ip, err := ep.lookupPodIP(lctx)
		cancel()
		if errors.Is(err, ErrSandboxDeleted) || errors.Is(err, ErrNotReady) {
			return "", err
		}
		if err == nil {
			if ip == "" {
				ep.podIP.Store(nil)
			} else {
				ep.podIP.Store(&ip)
			}
			ep.podIPStale.Store(false)
		}
	}
	return ep.currentPodIP(), nil
}

// explainTimeout bounds the reads that say why a call could not reach its sandbox: a diagnosis, which a
// hung API server must not turn into the call's whole budget (until December 6 it could).
var explainTimeout = 5 * time.Second

// diagnosis is what one call learnt from its Sandbox after failing to reach it (read at most once per call).
type diagnosis struct {
	asked bool
	note  error
}

// whyUnreachable asks the Sandbox why a call could not reach it, at most once per call: the named error
// (ErrSandboxDeleted, ErrNotReady) that ends the call when it tells one, else nil; a state that may pass is
// kept for the call's final error (d.final). Bounded by explainTimeout. Until December 6 only a next
// attempt's pod-IP lookup asked, so a Run or Start (one attempt), and any call without X-Sandbox-Pod-IP,
// got the bare 502 the first time and the cause only on the call after.
func (ep *endpoint) whyUnreachable(ctx context.Context, d *diagnosis) error {
	if ep.explain == nil || d.asked {
		return nil
	}
	d.asked = true
	rctx, cancel := context.WithTimeout(ctx, explainTimeout)
	defer cancel()
	type answer struct{ stop, note error }
	told := make(chan answer, 1)
	go func() { // a client that ignores its context's deadline does not hold the call either
		stop, note := ep.explain(rctx)
		told <- answer{stop, note}
	}()
	var a answer
	select {
	case a = <-told:
	case <-rctx.Done():
		return nil
	}
	d.note = a.note
	if errors.Is(a.stop, ErrSandboxDeleted) || errors.Is(a.stop, ErrNotReady) {
		return a.stop
	}
	return nil
}

// final is a call's last error with what its Sandbox said of a state that may pass (nothing when it said
// nothing): e.g. ErrNotReady for a pod not Ready that did not come back within the call's attempts.
func (d *diagnosis) final(err error) error {
	if err == nil || d.note == nil {
		return err
	}
	return fmt.Errorf("%w; %w", err, d.note)
}

// unreachableStatus is a router's (or gateway's) answer that it could not reach the sandbox: a 502 (the
// router's "Could not connect to the backend sandbox"). Ours: not a 503 - the router's own are its
// overload answer ("Too many concurrent requests.": until December 6 each failed call added a Sandbox read
// to an overloaded cluster) and a lifecycle router's ("Sandbox <ns>/<name> could not be resumed: ...",
// "... is resuming but was not Ready within <n>s"), which say why themselves or that it is coming back:
// until December 6 the latter, for a Sandbox being hibernated and restored, ended the call "no longer
// exists". The Python SDK reads the Sandbox after a 503 too.
func unreachableStatus(e *HTTPError) bool {
	return e.StatusCode == http.StatusBadGateway
}

// dropPodIP stops sending ip (if it is still the one sent) until the Sandbox is read again: the router
// then finds the pod by the Sandbox's name.
func (ep *endpoint) dropPodIP(ip string) {
	if p := ep.podIP.Load(); p != nil && *p == ip {
		ep.podIP.CompareAndSwap(p, nil)
	}
	ep.podIPStale.Store(true)
}

// stalePodIPRefusal is the router's 403 for an X-Sandbox-Pod-IP that is not its Sandbox's pod: refused before
// anything was forwarded, so the request can be sent again without the header.
func stalePodIPRefusal(e *HTTPError) bool {
	return e.StatusCode == http.StatusForbidden && strings.Contains(e.Body, "does not belong to sandbox")
}

// httpCaller sends runtime requests: headers, per-attempt header timeout, retries with backoff, redirects
// refused, non-2xx turned into *HTTPError. It holds no per-sandbox state.
type httpCaller struct {
	client  *http.Client
	opts    *Options
	tracing *tracing
	// own is the transport the SDK built for this handle (nil when the caller gave Options.HTTPTransport):
	// closeIdle closes its kept-alive connections.
	own *http.Transport
	// sleep and jitter are replaced by tests.
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func() float64 // in [0, 1)
}

func newHTTPCaller(opts *Options, tr *tracing) *httpCaller {
	rt := opts.HTTPTransport
	var own *http.Transport
	if rt == nil {
		own = defaultTransport(opts.PerAttemptTimeout)
		rt = own
	}
	return &httpCaller{
		own: own,
		client: &http.Client{
			Transport: rt,
			// Redirects are never followed (spec 4.7.2): the 3xx comes back and becomes an *HTTPError.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		opts:    opts,
		tracing: tr,
		sleep:   sleepCtx,
		jitter:  mathrand.Float64,
	}
}

func defaultTransport(dialTimeout time.Duration) *http.Transport {
	dialer := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   10,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// closeIdle closes the connections the SDK's own transport keeps alive, once the handle has no transport
// (Close, Disconnect, Suspend) and no call in flight: until December 6 they stayed open for IdleConnTimeout
// (90 s) after the handle was done, one set per handle (each has its own transport), most of them to the
// router every client shares. A transport given as Options.HTTPTransport is the caller's, maybe shared by
// other handles: left alone. The transport stays usable: an Open after Disconnect dials again.
func (c *httpCaller) closeIdle() {
	if c.own != nil {
		c.own.CloseIdleConnections()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// wireRequest is one logical call; do() may send it several times.
type wireRequest struct {
	op     string // SDK operation for errors and spans, e.g. "read"
	method string
	path   string // already-encoded path relative to the base, e.g. "download/a%2Fb"
	query  url.Values
	// body is called once per attempt, with the attempt's context (ended when the attempt is: a body that
	// reads something else should stop when it ends, see uploadSource); nil = no body
	body        func(ctx context.Context) (io.Reader, error)
	contentType string
	accept      func(status int) bool // success statuses besides 2xx (e.g. 404 for HEAD)
	maxAttempts int
	// headerTimeout bounds the wait for response headers of one attempt (0: PerAttemptTimeout); headerLimit
	// names where it came from, for the error.
	headerTimeout time.Duration
	headerLimit   string
	// answerAtExit: the answer comes when the command ends (legacy POST execute). Sent once (not retried),
	// such a request waits for it as long as the call lasts (WithTimeout, RequestTimeout, the caller's
	// deadline), as the Python SDK's run(timeout=...) does: until December 6 a Run of a command quiet for
	// longer than PerAttemptTimeout (60 s) always failed, and the command was killed.
	answerAtExit bool
}

func (r *wireRequest) describe() string {
	return fmt.Sprintf("%s (%s %s)", r.op, r.method, r.path)
}

// backoff is the wait before attempt n (n >= 2): 0, 500 ms, 1 s, 2 s, 4 s, 8 s, 8 s, ... with +-25 % jitter.
func backoff(n int, jitter float64) time.Duration {
	if n <= 2 {
		return 0
	}
	d := float64(backoffFirst) * math.Pow(2, float64(n-3))
	if d > float64(backoffCap) {
		d = float64(backoffCap)
	}
	return time.Duration(d * (1 - backoffJitter + 2*backoffJitter*jitter))
}

func retryableStatus(code int) bool {
	switch code {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable,
		http.StatusGatewayTimeout:
		return true
	}
	return false
}

func newRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// timeoutHeader is X-Sandbox-Timeout: the seconds left in the call ("" when the call has no deadline, a
// stream started without one). Not capped at the per-attempt timeout as upstream's Go SDK does: this
// project's router, like upstream's Python router, bounds the whole exchange by it, so a cap would cut
// long downloads and streams (docs/sdk/go.md).
func timeoutHeader(ctx context.Context) string {
	dl, ok := ctx.Deadline()
	if !ok {
		return ""
	}
	left := time.Until(dl)
	if left < time.Millisecond {
		left = time.Millisecond
	}
	return strconv.FormatFloat(left.Seconds(), 'f', 3, 64)
}

// headerTimeoutError is an attempt that got no response headers within its limit (retryable like a dial
// error). It is ErrTimeout and names the limit: until December 6 it matched no sentinel and said "the
// per-attempt timeout" whichever limit it was.
func headerTimeoutError(limit string, d time.Duration) error {
	return fmt.Errorf("%w: no response headers within %s (%s)", ErrTimeout, limit, d)
}

// connectionError is a request that got no response at all: a *ConnectionError (ErrConnection) wrapping the
// transport error, saying whether the request was sent.
func connectionError(method string, sent bool, err error) error {
	if errors.Is(err, ErrTimeout) || errors.Is(err, ErrConnection) {
		return err
	}
	return &ConnectionError{Method: method, RequestSent: sent, Err: err}
}

// sendTrace follows one attempt through the transport, to tell a request never sent (safe to repeat) from
// one lost after it was written (it may have run). Until December 7 both read "could not connect".
type sendTrace struct {
	traced atomic.Bool // the transport reported its steps (an *http.Transport does)
	sent   atomic.Bool // the headers were written on the connection last asked for
}

func (t *sendTrace) clientTrace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		// a new connection for the same request (net/http resends one that it knows went out unwritten on a
		// dead kept-alive connection): what counts is what was written on this one
		GetConn:      func(string) { t.traced.Store(true); t.sent.Store(false) },
		WroteHeaders: func() { t.sent.Store(true) },
	}
}

// requestSent says whether err's request may have reached the server: by the trace when the transport gave
// one (conservative: headers written count, even if the bytes never left a buffer), else anything but a
// failed dial or name lookup, as the Python SDK's request_sent.
func (t *sendTrace) requestSent(err error) bool {
	if t.traced.Load() {
		return t.sent.Load()
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var dns *net.DNSError
	return !errors.As(err, &dns)
}

// do sends r until it succeeds, fails for good, or runs out of attempts. On success the caller owns the
// response body (closing it releases the attempt).
func (c *httpCaller) do(ctx context.Context, ep *endpoint, r wireRequest) (*http.Response, error) {
	attempts := r.maxAttempts
	if attempts <= 0 {
		attempts = 1
	}
	if r.headerTimeout <= 0 {
		r.headerTimeout, r.headerLimit = c.opts.PerAttemptTimeout, "PerAttemptTimeout"
	}
	if r.headerLimit == "" {
		r.headerLimit = "the per-attempt timeout"
	}
	if _, ok := ctx.Deadline(); ok && r.answerAtExit && attempts == 1 {
		r.headerTimeout = 0 // the call's deadline bounds the wait (its error names it)
	}
	reqID := newRequestID()
	var last error
	resentWithoutIP, immediate := false, false
	var diag diagnosis
	for n := 1; n <= attempts; n++ {
		if n > 1 && !immediate {
			if err := c.sleep(ctx, backoff(n, c.jitter())); err != nil {
				return nil, callContextError(ctx, r.describe(), diag.final(last))
			}
		}
		podIP := ""
		if !immediate { // the resend after a refused pod IP goes without one
			var gone error
			if podIP, gone = ep.podIPForAttempt(ctx); gone != nil {
				// Ours: the router's 502 for a Sandbox that no longer exists, or is suspended, cannot turn into
				// an answer (the remaining attempts took 15 s of backoff and more).
				if last == nil {
					return nil, fmt.Errorf("%s: %w", r.describe(), gone)
				}
				return nil, fmt.Errorf("%w; %w", last, gone)
			}
		}
		immediate = false
		trace := &sendTrace{}
		resp, err := c.attempt(ctx, ep, &r, reqID, podIP, trace)
		if err != nil {
			if ctx.Err() != nil {
				return nil, callContextError(ctx, r.describe(), err)
			}
			var invalid *invalidBodyError
			if errors.As(err, &invalid) {
				return nil, invalid.err
			}
			if errors.Is(err, ErrInvalidArgument) {
				// The body refused itself while being sent (WriteFrom past MaxUploadSize): every attempt would
				// again send up to the limit and fail the same way. Until December 6 all six attempts ran.
				return nil, fmt.Errorf("%s: %w", r.describe(), err)
			}
			last = fmt.Errorf("%s: %w", r.describe(), connectionError(r.method, trace.requestSent(err), err))
			if !ep.viaRouter() && errors.Is(last, ErrConnection) {
				// Straight to the sandbox (its pod IP, Service, tunnel): no answer may mean it is gone or
				// suspended, which no further attempt changes (in pod-IP mode a deleted sandbox's Write used to
				// spend six attempts, ~7.5 s, and end without a cause). Through a router it says nothing of the
				// sandbox (until December 6 a sandboxd runtime's call to an unreachable router read it).
				if gone := ep.whyUnreachable(ctx, &diag); gone != nil {
					return nil, fmt.Errorf("%w; %w", last, gone)
				}
			}
			continue
		}
		if (resp.StatusCode >= 200 && resp.StatusCode < 300) || (r.accept != nil && r.accept(resp.StatusCode)) {
			return resp, nil
		}
		httpErr := readHTTPError(resp, r.describe())
		if resp.StatusCode == http.StatusGatewayTimeout && callDeadlineReached(ctx, httpErr) {
			// The router's timer is X-Sandbox-Timeout, the time left in this call, so its 504 and the call's own
			// deadline race; whichever wins, the call ran out of time. Until December 6 a Run could come back
			// as this *HTTPError instead of ErrTimeout.
			return nil, deadlineError(r.describe(), httpErr)
		}
		if podIP != "" && stalePodIPRefusal(httpErr) {
			// Ours (the Python SDK does the same): without this, every later call repeated the refusal.
			ep.dropPodIP(podIP)
			if !resentWithoutIP {
				resentWithoutIP, immediate = true, true
				n-- // a resend, not an attempt: refused before anything was forwarded
				continue
			}
		}
		if !retryableStatus(resp.StatusCode) {
			return nil, httpErr
		}
		if podIP != "" && resp.StatusCode == http.StatusBadGateway {
			ep.podIPStale.Store(true) // the pod at that address may be gone: read the Sandbox again
		}
		// The router could not reach the sandbox. Unless the next attempt reads the Sandbox anyway (for its pod
		// IP), read it now: gone or suspended, the call ends here with the cause (wrapping this answer).
		lookupNext := podIP != "" && resp.StatusCode == http.StatusBadGateway && ep.lookupPodIP != nil && n < attempts
		if unreachableStatus(httpErr) && !lookupNext {
			if gone := ep.whyUnreachable(ctx, &diag); gone != nil {
				return nil, fmt.Errorf("%w; %w", httpErr, gone)
			}
		}
		last = httpErr
	}
	final := last
	if attempts > 1 {
		final = fmt.Errorf("%w after %d attempts: %w", ErrRetriesExhausted, attempts, last)
	}
	var he *HTTPError
	if !idempotent(r.method) && errors.As(last, &he) && he.StatusCode == http.StatusBadGateway {
		// A POST's 502 from a router (or gateway) whose Sandbox exists and is not suspended (whyUnreachable
		// said nothing): its "Could not connect to the backend sandbox" covers any failure of its exchange with
		// the sandbox, a runtime dying mid-command too - which had started the command. Said so, as the Python
		// SDK's may_have_run does: until December 7 it read as if nothing had run, and a caller ran it again.
		final = &mayHaveRunError{err: final, attempts: attempts}
	}
	return nil, diag.final(final)
}

// callContextError reports a call whose context ended: ErrTimeout for a deadline (also matching
// context.DeadlineExceeded), the context's error for a cancel.
func callContextError(ctx context.Context, what string, last error) error {
	cause := ctx.Err()
	if errors.Is(cause, context.DeadlineExceeded) {
		return deadlineError(what, last)
	}
	return fmt.Errorf("%s: %w", what, cause)
}

// deadlineError reports a call whose deadline passed: ErrTimeout, also matching context.DeadlineExceeded.
func deadlineError(what string, last error) error {
	if last != nil {
		return fmt.Errorf("%s: %w (%w); last error: %v", what, ErrTimeout, context.DeadlineExceeded, last)
	}
	return fmt.Errorf("%s: %w (%w)", what, ErrTimeout, context.DeadlineExceeded)
}

// routerTimeoutMargin: a router 504 for its X-Sandbox-Timeout that arrives less than this before the call's
// deadline is that deadline running out (the header is sent rounded, and the router may start its timer
// before the request reached it whole).
const routerTimeoutMargin = time.Second

// callDeadlineReached says whether a 504 is the call running out of time: its deadline has passed, or the
// router's timer for X-Sandbox-Timeout (the time left in the call) went off within routerTimeoutMargin of it.
func callDeadlineReached(ctx context.Context, e *HTTPError) bool {
	dl, ok := ctx.Deadline()
	if !ok {
		return false
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || !time.Now().Before(dl) {
		return true
	}
	// the Python router's text: "Timed out waiting for the backend sandbox: <id> (<what> <s> s: X-Sandbox-Timeout)"
	routerTimer := strings.HasPrefix(e.Body, "Timed out waiting for the backend sandbox") &&
		strings.HasSuffix(e.Body, ": X-Sandbox-Timeout)")
	return routerTimer && time.Until(dl) < routerTimeoutMargin
}

type invalidBodyError struct{ err error }

func (e *invalidBodyError) Error() string { return e.err.Error() }

// attempt sends one request. The attempt's context is cancelled when the body is closed, or at once if no
// response headers arrive within the header timeout.
func (c *httpCaller) attempt(
	ctx context.Context, ep *endpoint, r *wireRequest, reqID, podIP string, trace *sendTrace,
) (*http.Response, error) {
	target := strings.TrimSuffix(ep.restBase.String(), "/") + "/" + r.path
	if r.query != nil {
		target += "?" + r.query.Encode()
	}
	actx, cancel := context.WithCancel(ctx)
	var body io.Reader
	if r.body != nil {
		b, err := r.body(actx)
		if err != nil {
			cancel()
			return nil, &invalidBodyError{err: err}
		}
		body = b
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(actx, trace.clientTrace()), r.method, target, body)
	if err != nil {
		cancel()
		return nil, &invalidBodyError{err: fmt.Errorf("%s: %w", r.describe(), err)}
	}
	if ep.sendHeaders {
		for k, vs := range c.opts.Headers {
			req.Header[k] = append([]string(nil), vs...)
		}
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	req.Header[headerRequestID] = []string{reqID}
	if ep.router {
		req.Header[headerSandboxID] = []string{ep.sandboxID}
		req.Header[headerSandboxNamespace] = []string{ep.namespace}
		req.Header[headerSandboxPort] = []string{strconv.Itoa(ep.serverPort)}
		if t := timeoutHeader(ctx); t != "" {
			req.Header[headerSandboxTimeout] = []string{t}
		}
		if podIP != "" {
			req.Header[headerSandboxPodIP] = []string{podIP}
		}
	}
	c.tracing.inject(ctx, req.Header)

	if r.headerTimeout <= 0 { // bounded by the call's deadline only (answerAtExit)
		resp, err := c.client.Do(req)
		if err != nil {
			cancel()
			return nil, err
		}
		resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
		return resp, nil
	}
	timedOut := make(chan struct{})
	timer := time.AfterFunc(r.headerTimeout, func() { close(timedOut); cancel() })
	resp, err := c.client.Do(req)
	if !timer.Stop() {
		// the timer fired: whatever Do returned belongs to a cancelled attempt
		if resp != nil {
			_ = resp.Body.Close()
		}
		<-timedOut
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, headerTimeoutError(r.headerLimit, r.headerTimeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// readHTTPError turns an unsuccessful response into *HTTPError (and closes the body).
func readHTTPError(resp *http.Response, op string) *HTTPError {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return &HTTPError{StatusCode: resp.StatusCode, Body: renderErrorBody(raw), Operation: op}
}

// renderErrorBody shows the known JSON error shapes as text: sandboxd {"code","message"} as
// "CODE: message", the router's {"detail"} and the legacy runtime's {"message"} as their text.
func renderErrorBody(raw []byte) string {
	var shaped struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Detail  json.RawMessage `json:"detail"`
	}
	text := string(raw)
	if json.Unmarshal(raw, &shaped) == nil {
		var detail string
		switch {
		case shaped.Code != "" && shaped.Message != "":
			text = shaped.Code + ": " + shaped.Message
		case len(shaped.Detail) > 0 && json.Unmarshal(shaped.Detail, &detail) == nil:
			text = detail
		case shaped.Message != "":
			text = shaped.Message
		}
	}
	if len(text) > maxErrorBody {
		text = text[:maxErrorBody]
	}
	return text
}

// readLimited reads the whole body, failing with ErrResponseTooLarge past limit bytes.
func readLimited(body io.Reader, limit int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: reading response: %w", what, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: %w (%d bytes)", what, ErrResponseTooLarge, limit)
	}
	return b, nil
}

// bytesBody makes a per-attempt body from bytes (each attempt reads from the start).
func bytesBody(b []byte) func(context.Context) (io.Reader, error) {
	return func(context.Context) (io.Reader, error) { return bytes.NewReader(b), nil }
}
