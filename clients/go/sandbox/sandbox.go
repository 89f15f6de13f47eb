package sandbox

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// Sandbox is one claim and its transport. Create one with New (or through a Client), then Open it. All
// methods are safe for concurrent use.
type Sandbox struct {
	opts     Options
	k8s      *K8sHelper
	http     *httpCaller
	tracing  *tracing
	legacy   *legacyRuntime
	sandboxd *sandboxdRuntime

	mu          sync.Mutex
	claimName   string
	claimUID    types.UID
	explicit    bool // the user named the claim: never deleted by a rollback
	attach      bool // the claim exists already (GetSandbox): Open reconnects, waiting for readiness
	orphaned    bool
	sandboxName string
	info        sandboxInfo
	conn        *liveConn
	// noConn says why conn is nil, for ErrNotReady ("" before the first Open): until December 6 every call
	// after Suspend, Disconnect or Close said only "sandbox is not ready".
	noConn string
	// inflight counts one-shot calls (Run, Read, Write, ...), which Close and Disconnect let finish; streams
	// are the started Processes, which they end instead (a stream lasts as long as its command: until
	// December 6 it held an in-flight slot, and Close waited out its whole drain for it, then cut it anyway).
	inflight int
	streams  map[*streamSlot]struct{}
	// opening is the Open or Resume in progress (nil when none): another Open or Resume is refused with
	// ErrAlreadyOpen, and Close cuts it (openRun.closed) and waits for it. Until December 6 a Close during an
	// Open deleted nothing (the claim's name was not known yet) and the Open then connected the closed handle,
	// its claim leaked; two Opens of one handle each created a claim and overwrote each other's; a Close
	// during a Resume, or two Resumes, left the handle connected (to a deleted claim; one transport leaked).
	opening *openRun
	// closing is closed when the Close in progress ends (nil when none): an Open or Resume begun meanwhile
	// waits for it, and goes on from the handle it leaves. Until December 6 such an Open reconnected to the
	// claim the Close was about to delete, and stayed connected to it.
	closing chan struct{}
	// lostCreates are the stamps of this handle's creates of Options.ClaimName whose answer was lost and
	// whose claim was not found then (the API server may apply such a create later): a claim of that name
	// with one of these stamps is the handle's (ownUnanswered).
	lostCreates []createStamp
	// lostAutoCreates are the stamps of this handle's auto-named creates whose answer was lost and whose claim
	// could not be looked for or deleted then (the search by stamp or the DELETE failed): Close repeats the
	// search and deletes what it finds. Until December 7 such a failure was only logged, and the claim leaked.
	lostAutoCreates []createStamp
	// client is the Client that made the handle (nil for New): a successful Open registers the handle under its
	// claim there, a successful Close removes it. Set before the handle is shared, never changed.
	client *Client
}

// openRun is one Open or Resume in progress.
type openRun struct {
	what   string                  // "Open" or "Resume"
	cause  error                   // what Close ends its context with: errClosedDuringOpen or errClosedDuringResume
	cancel context.CancelCauseFunc // ends its context
	done   chan struct{}           // closed when it has returned
	closed bool                    // Close cut it: it connects nothing (s.mu)
}

// errClosedDuringOpen and errClosedDuringResume are the causes of an Open's or a Resume's context that Close
// ended.
var (
	errClosedDuringOpen   = errors.New("the handle was closed (Close) during Open")
	errClosedDuringResume = errors.New("the handle was closed (Close) during Resume")
)

// startRun makes an Open or Resume the handle's one in progress (s.mu held, s.opening nil) and returns its
// context, which Close ends; endRun must be called when it returns.
func (s *Sandbox) startRun(ctx context.Context, what string, cause error) (context.Context, *openRun) {
	ctx, cancel := context.WithCancelCause(ctx)
	run := &openRun{what: what, cause: cause, cancel: cancel, done: make(chan struct{})}
	s.opening = run
	return ctx, run
}

// wasCut reports whether a Close cut run (beginClose).
func (s *Sandbox) wasCut(run *openRun) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return run.closed
}

// endRun ends run (the Open or Resume has returned).
func (s *Sandbox) endRun(run *openRun) {
	s.mu.Lock()
	if s.opening == run {
		s.opening = nil
	}
	s.mu.Unlock()
	run.cancel(nil)
	close(run.done)
}

// awaitClose waits, s.mu held, until no Close of the handle is in progress (s.mu is unlocked meanwhile, and
// held again when it returns); ctx ending first is its error.
func (s *Sandbox) awaitClose(ctx context.Context) error {
	for s.closing != nil {
		ch := s.closing
		s.mu.Unlock()
		select {
		case <-ch:
			s.mu.Lock()
		case <-ctx.Done():
			s.mu.Lock()
			return fmt.Errorf("waiting for the Close of this handle in progress: %w", ctx.Err())
		}
	}
	return nil
}

// refuseRun is ErrAlreadyOpen for an Open or Resume while another is in progress (s.mu held).
func (s *Sandbox) refuseRun() error {
	what := "an Open"
	if s.opening.what == "Resume" {
		what = "a Resume"
	}
	return fmt.Errorf("%w (%s of this handle is in progress)", ErrAlreadyOpen, what)
}

// createStamp marks the claim a create asked for: its client-first-requested-at time and its random
// client-request-id. The time alone is not unique: a Windows clock ticks every 0.5-15.6 ms, macOS's every
// microsecond, so until December 6 a create whose answer was lost could adopt - and its Close delete - the
// claim another handle made under the same name within the same tick.
type createStamp struct{ at, id string }

// stampOf is the createStamp a claim carries ("" fields when it carries none).
func stampOf(obj *unstructured.Unstructured) createStamp {
	a := obj.GetAnnotations()
	return createStamp{at: a[FirstRequestedAtAnnotation], id: a[ClientRequestIDAnnotation]}
}

// streamSlot is a started Process's place among the handle's streams: p once Start has it; cut is why the
// handle ended it before that ("" while it may run).
type streamSlot struct {
	p   *Process
	cut string
}

// New validates opts and returns an unopened handle. It talks to nothing yet.
func New(ctx context.Context, opts Options) (*Sandbox, error) {
	_ = ctx
	opts, k, err := prepare(opts)
	if err != nil {
		return nil, err
	}
	return newSandbox(opts, k), nil
}

// prepare fills in defaults, validates, and builds (or takes) the Kubernetes helper.
func prepare(opts Options) (Options, *K8sHelper, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return Options{}, nil, fmt.Errorf("sandbox: %w", err)
	}
	k := opts.K8sHelper
	if k == nil {
		var err error
		if k, err = NewK8sHelper(opts.RestConfig, opts.Logger); err != nil {
			return Options{}, nil, fmt.Errorf("sandbox: %w", err)
		}
	}
	opts.K8sHelper = k
	return opts, k, nil
}

func newSandbox(opts Options, k *K8sHelper) *Sandbox {
	opts.Headers = opts.Headers.Clone()
	tr := newTracing(opts.TracerProvider, opts.TraceServiceName)
	hc := newHTTPCaller(&opts, tr)
	s := &Sandbox{opts: opts, k8s: k, http: hc, tracing: tr}
	s.legacy = &legacyRuntime{http: hc, opts: &s.opts}
	s.sandboxd = &sandboxdRuntime{http: hc, opts: &s.opts}
	s.http.opts = &s.opts
	// Options.ClaimName is only the name Open asks for: the handle owns a claim (claimName, claimUID) once
	// its create or attach succeeded. Until December 6 it was recorded here, so Close of a handle whose Open
	// was refused "already exists" - or that was never opened - deleted another owner's claim of that name.
	return s
}

// ClaimName is the name of the SandboxClaim the handle owns ("" before Open, after an Open that created
// nothing - Options.ClaimName taken by another claim - and after a successful Close).
func (s *Sandbox) ClaimName() string { s.mu.Lock(); defer s.mu.Unlock(); return s.claimName }

// SandboxName is the bound Sandbox's name (the router's X-Sandbox-ID).
func (s *Sandbox) SandboxName() string { s.mu.Lock(); defer s.mu.Unlock(); return s.sandboxName }

// PodName is the Pod backing the Sandbox (annotation agents.x-k8s.io/pod-name, or the Sandbox name).
func (s *Sandbox) PodName() string { s.mu.Lock(); defer s.mu.Unlock(); return s.info.podName }

// PodIP is the Pod's address as last read (first IPv4, else the first valid IP).
func (s *Sandbox) PodIP() string { s.mu.Lock(); defer s.mu.Unlock(); return s.info.podIP }

// Namespace is the claim's namespace.
func (s *Sandbox) Namespace() string { return s.opts.Namespace }

// Annotations are the Sandbox's annotations as last read (a copy).
func (s *Sandbox) Annotations() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.info.annotations)
}

// IsReady says whether the transport is connected (and, for tunnels, still alive).
func (s *Sandbox) IsReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn != nil && s.conn.dead() == nil
}

func (s *Sandbox) wrap(err error) error {
	s.mu.Lock()
	claim := s.claimName
	s.mu.Unlock()
	if claim == "" {
		claim = s.opts.ClaimName
	}
	if claim == "" {
		claim = "<unclaimed>"
	}
	return wrapErr(s.opts.Namespace, claim, err)
}

// Open creates the claim, waits until its Sandbox is Ready and connects the transport; on a handle that
// already has a claim (after Disconnect, or from Client.GetSandbox) it verifies the claim and reconnects.
// A failed Open of a new, auto-named claim deletes the claim again.
//
// One Open at a time: an Open while another Open or a Resume of the same handle is in progress fails with
// ErrAlreadyOpen at once (it creates nothing). A Close during an Open ends the Open, which fails with
// ErrNotReady ("closed during Open") and connects nothing; Close waits for it and deletes the claim it made.
// An Open during a Close waits for the Close to end (or ctx), and goes on from the closed handle.
//
// On a handle a Client made, Open is seen by the Client as its CreateSandbox is: DeleteAll and
// EnableAutoCleanup end it (and delete its claim) while it runs, it is tracked under its claim once it
// succeeds, and kept for DeleteAll when it fails leaving a claim to delete (ErrOrphanedClaim).
func (s *Sandbox) Open(ctx context.Context) error {
	if s.client != nil {
		return s.client.reopen(ctx, s)
	}
	return s.open(ctx)
}

// open is Open without a Client's bookkeeping (Client.open and Client.reopen do it).
func (s *Sandbox) open(ctx context.Context) (err error) {
	ctx, span := s.tracing.start(ctx, "open", attribute.String("sandbox.namespace", s.opts.Namespace))
	defer func() { endSpan(span, err) }()
	s.mu.Lock()
	if err := s.awaitClose(ctx); err != nil {
		s.mu.Unlock()
		return s.wrap(err)
	}
	switch {
	case s.opening != nil:
		err := s.refuseRun()
		s.mu.Unlock()
		return s.wrap(err)
	case s.conn != nil:
		s.mu.Unlock()
		return s.wrap(ErrAlreadyOpen)
	case s.orphaned:
		s.mu.Unlock()
		return s.wrap(ErrOrphanedClaim)
	}
	ctx, run := s.startRun(ctx, "Open", errClosedDuringOpen)
	existing := s.claimName != ""
	s.mu.Unlock()
	defer s.endRun(run)
	if existing {
		err = s.reconnect(ctx, run)
	} else {
		err = s.create(ctx, run)
	}
	if err != nil && s.wasCut(run) {
		// what failed is only how the cut showed (a cancelled wait, a refused create): Close cleans up
		err = fmt.Errorf("%w: %w; Close deletes the claim it made or attached (the Open ended with: %v)",
			ErrNotReady, errClosedDuringOpen, err)
	}
	return s.wrap(err)
}

// publishConn makes conn the handle's transport unless Close cut this Open (then conn is closed and false
// returned); set runs under s.mu with it.
func (s *Sandbox) publishConn(run *openRun, conn *liveConn, set func()) bool {
	s.mu.Lock()
	if run.closed {
		s.mu.Unlock()
		conn.closeWith(run.cause.Error())
		return false
	}
	set()
	s.conn = conn
	s.mu.Unlock()
	s.watchTunnel(conn)
	return true
}

func (s *Sandbox) create(ctx context.Context, run *openRun) error {
	o := &s.opts
	if err := validateWarmPoolName(o.WarmPoolName); err != nil {
		return err
	}
	obj := buildClaim(o, time.Now(), newClaimRequestID(), s.tracing.annotation(ctx))
	stamp := stampOf(obj)
	attempts := &requestAttempts{}
	created, err := s.k8s.createClaim(context.WithValue(ctx, requestAttemptsKey{}, attempts), o.Namespace, obj)
	if err != nil {
		lost := attempts.answerLost(err)
		switch {
		case o.ClaimName == "" && lost:
			if cerr := s.removeUnansweredClaim(ctx, stamp); cerr != nil {
				return fmt.Errorf("%w: creating SandboxClaim from warm pool %q: %w; %w", ErrClaimFailed,
					o.WarmPoolName, err, cerr)
			}
		case o.ClaimName != "" && lost:
			// The claim may exist, and it is this handle's: adopted, as a create that answered, so Close deletes
			// it and the next Open waits for it. Until December 6 it was nobody's: Close left it, and a retried
			// Open failed "already exists; this handle did not create it".
			if own := s.ownUnanswered(ctx, stamp); own != nil {
				s.adopt(own)
				return fmt.Errorf("%w: creating SandboxClaim %s/%s: no answer (%w); the claim was made and is this "+
					"handle's: Open waits for it, Close deletes it", ErrClaimFailed, o.Namespace, o.ClaimName, err)
			}
			s.mu.Lock()
			s.lostCreates = append(s.lostCreates, stamp)
			s.mu.Unlock()
		case o.ClaimName != "" && apierrors.IsAlreadyExists(err):
			// This very create may have made it: client-go retries a create answered 5xx with Retry-After by
			// itself, and the retry of an applied first attempt is answered 409. Only a claim carrying this
			// create's random request id (or an earlier unanswered one's) is the handle's; until December 6 it
			// was "did not create it", and leaked.
			if own := s.ownUnanswered(ctx, append(s.lostStamps(), stamp)...); own != nil {
				s.adopt(own)
				return s.reconnect(ctx, run) // waits for it, as for a claim this Open made
			}
			s.mu.Lock()
			lost := len(s.lostCreates) > 0
			s.mu.Unlock()
			if !lost {
				// someone's claim: this handle neither uses nor deletes it (the Python SDK's "already exists;
				// pass adopt_existing=True")
				return fmt.Errorf("%w: SandboxClaim %s/%s already exists; this handle did not create it and will "+
					"not delete it (Client.GetSandbox attaches to it): %w", ErrClaimFailed, o.Namespace, o.ClaimName, err)
			}
			return fmt.Errorf("%w: SandboxClaim %s/%s already exists; an earlier Open of this handle got no answer "+
				"to its create and this claim could not be confirmed as the one it made, so this handle does not "+
				"use or delete it (Client.GetSandbox attaches to it; delete it if it is yours): %w", ErrClaimFailed,
				o.Namespace, o.ClaimName, err)
		}
		return fmt.Errorf("%w: creating SandboxClaim from warm pool %q: %w", ErrClaimFailed, o.WarmPoolName, err)
	}
	// this Open's claim: its rollback deletes it by these, whatever the handle's fields say by then
	claim, uid, explicit := created.GetName(), created.GetUID(), o.ClaimName != ""
	s.mu.Lock()
	s.claimName, s.claimUID, s.explicit = claim, uid, explicit
	s.lostCreates = nil // a name is unique: an earlier unanswered create of it made nothing
	s.mu.Unlock()
	o.Logger.V(1).Info("claim created", "namespace", o.Namespace, "claim", claim)

	name, info, err := s.waitReady(ctx, claim)
	var conn *liveConn
	if err == nil {
		conn, err = s.connect(ctx, name, info)
	}
	if err == nil && !s.publishConn(run, conn, func() { s.sandboxName, s.info = name, info }) {
		err = run.cause
	}
	if err != nil {
		return s.rollback(ctx, claim, uid, explicit, err)
	}
	return nil
}

// requestAttemptsKey marks a request's context with the requestAttempts that recordAttempts fills in.
type requestAttemptsKey struct{}

// requestAttempts records what became of each attempt of one request: client-go sends a POST again by itself
// when an answer is a 5xx or 429 with Retry-After (an API server that lost etcd mid-create answers so, and
// the create may have been applied), and the error it returns is only the last attempt's.
type requestAttempts struct {
	seen atomic.Bool // recordAttempts saw an attempt: the helper was made by NewK8sHelper
	sent atomic.Bool // an attempt reached the API server (an answer, or an error after it was written)
}

// answerLost is answerLost(err), except that a request none of whose attempts reached the API server made
// nothing. Until December 7 (its first version) a dial error of a retried create counted as "never sent": the
// first attempt's claim leaked. Without a record (a K8sHelper not made by NewK8sHelper) notSent(err) decides.
func (a *requestAttempts) answerLost(err error) bool {
	if !a.seen.Load() {
		return answerLost(err)
	}
	return a.sent.Load() && answerLostAfterSend(err)
}

// recordAttempts is the transport wrapper NewK8sHelper installs for requestAttempts.
type recordAttempts struct{ next http.RoundTripper }

func (r recordAttempts) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if a, ok := req.Context().Value(requestAttemptsKey{}).(*requestAttempts); ok {
		a.seen.Store(true)
		if err == nil || !notSent(err) {
			a.sent.Store(true)
		}
	}
	return resp, err
}

// answerLost: the create may have been applied although no answer says so - any failure but a refusal (a
// 4xx status): no answer at all (a cancelled context, a connection reset after the request went out), or a
// 5xx - the API server's own 504 Timeout ("may still be processing the request"), a 500, a proxy's 502, 503
// or 504 (client-go makes its error page a status error). Until December 6 every status counted as a
// refusal, and the claim such a create made leaked. A claim is only ever adopted or deleted by its stamp,
// so counting a create that was not applied does no harm.
//
// A request that was never sent (notSent: the connection could not be made) is not a lost answer: the API
// server never saw it. Until this was checked an unreachable API server made every Open wait out
// CleanupTimeout searching for a claim that could not exist, report ErrOrphanedClaim, and keep a stamp that
// made every Close do the same.
func answerLost(err error) bool {
	return !notSent(err) && answerLostAfterSend(err)
}

// answerLostAfterSend is answerLost for a request known to have reached the API server.
func answerLostAfterSend(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true
	}
	code := status.Status().Code
	return code < 400 || code >= 500
}

// removeUnansweredClaim deletes the claims auto-named creates without an answer may have made. Their names
// came from generateName, so they are found by the requests' stamps (client-first-requested-at and the random
// client-request-id) among the Go client's claims of the same warm pool. Within CleanupTimeout, even when ctx
// is already cancelled, retrying transient failures (cleanupRetry): an orphaned claim would hold a sandbox
// until someone deletes it. If the search or a deletion still fails, the stamps are kept (lostAutoCreates) -
// Close repeats the search, and a Client keeps the handle so DeleteAll does - and the error wraps
// ErrOrphanedClaim. Until December 7 such a failure was only logged: the claim leaked and Close returned nil.
func (s *Sandbox) removeUnansweredClaim(ctx context.Context, stamps ...createStamp) error {
	o := &s.opts
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.CleanupTimeout)
	defer cancel()
	err := s.searchAndDelete(dctx, stamps)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		for _, st := range stamps {
			if !slices.Contains(s.lostAutoCreates, st) {
				s.lostAutoCreates = append(s.lostAutoCreates, st)
			}
		}
		return fmt.Errorf("removing the claim a create without an answer may have made: %w: %w", err, ErrOrphanedClaim)
	}
	s.lostAutoCreates = slices.DeleteFunc(s.lostAutoCreates, func(st createStamp) bool { return slices.Contains(stamps, st) })
	return nil
}

// searchAndDelete lists the Go client's claims and deletes those of warm pool Options.WarmPoolName carrying
// one of stamps (by UID), retrying transient failures until ctx ends; the failures left are joined.
func (s *Sandbox) searchAndDelete(ctx context.Context, stamps []createStamp) error {
	o := &s.opts
	var list *unstructured.UnstructuredList
	err := cleanupRetry(ctx, func() error {
		var err error
		list, err = s.k8s.claims(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: CreatedByLabel + "=go-client"})
		return err
	})
	if err != nil {
		return fmt.Errorf("listing claims: %w", err)
	}
	var errs []error
	for _, item := range list.Items {
		if !madeByCreate(&item, o.WarmPoolName, stamps...) {
			continue
		}
		if err := cleanupRetry(ctx, func() error {
			return s.k8s.deleteClaim(ctx, o.Namespace, item.GetName(), item.GetUID())
		}); err != nil {
			errs = append(errs, fmt.Errorf("deleting claim %s: %w", item.GetName(), err))
			continue
		}
		o.Logger.V(1).Info("deleted the claim a create without an answer made", "claim", item.GetName())
	}
	return errors.Join(errs...)
}

// cleanupBackoffMin and cleanupBackoffMax bound the waits between the attempts of a cleanup request.
const (
	cleanupBackoffMin = 100 * time.Millisecond
	cleanupBackoffMax = 2 * time.Second
)

// cleanupRetry runs do - a cleanup request (a claim's DELETE, the search for a claim) - again after a failure
// another attempt may not meet (transientFailure), backing off 100 ms -> 2 s, until it succeeds, fails
// otherwise, or ctx (the cleanup's CleanupTimeout) ends; its last error is returned. Until December 7 one 500
// or reset connection made the claim an orphan. A request that was never sent (notSent: the API server is
// unreachable) is not retried, and no retry starts after the deadline of the caller of a Close or DeleteAll
// (withRetryDeadline; its first attempt is made all the same): until this was checked a DeleteAll with a
// 10 s deadline and an unreachable API server took CleanupTimeout (30 s) per batch of handles.
func cleanupRetry(ctx context.Context, do func() error) error {
	until, _ := ctx.Value(retryDeadlineKey{}).(time.Time)
	delay := cleanupBackoffMin
	for {
		err := do()
		if err == nil || !transientFailure(err) || ctx.Err() != nil {
			return err
		}
		if !until.IsZero() && time.Until(until) < delay {
			return err
		}
		if sleepCtx(ctx, delay) != nil {
			return err
		}
		delay = min(delay*2, cleanupBackoffMax)
	}
}

// notSent: err came before the request was written - the connection to the API server (or its proxy) could
// not be made: refused, unreachable, a dial timeout, a name that does not resolve, a TLS handshake that
// failed (an untrusted or invalid certificate, an alert). The API server never saw such a request, so it
// applied nothing; and it is not retried by a cleanup (cleanupRetry), which would only wait out
// CleanupTimeout against a server that is not there (a claim it could not delete stays the handle's, and
// Close or DeleteAll try again).
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && (op.Op == "dial" || op.Op == "proxyconnect") {
		return true
	}
	var (
		dns     *net.DNSError
		verify  *tls.CertificateVerificationError
		header  tls.RecordHeaderError
		alert   tls.AlertError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
	)
	return errors.As(err, &dns) || errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &alert) ||
		errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host)
}

// retryDeadlineKey marks a Close's context with its caller's deadline (withRetryDeadline): the cleanup's
// retries (cleanupRetry) stop there, though the cleanup is detached from that context.
type retryDeadlineKey struct{}

// withRetryDeadline records ctx's deadline, if it has one, for cleanupRetry.
func withRetryDeadline(ctx context.Context) context.Context {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithValue(ctx, retryDeadlineKey{}, dl)
	}
	return ctx
}

// transientFailure: a request failed in a way a later attempt may not - no answer (a reset or refused
// connection, a timeout), a 5xx, or 429 Too Many Requests; any other 4xx is a refusal it would meet again.
func transientFailure(err error) bool {
	return answerLost(err) || apierrors.IsTooManyRequests(err)
}

func (s *Sandbox) lostStamps() []createStamp {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lostCreates)
}

// ownUnanswered reads the claim Options.ClaimName names and returns it if a create of this handle whose
// answer was lost made it: it carries this SDK's created-by label, the warm pool asked for, and one of the
// requests' stamps (client-first-requested-at and the random client-request-id: no other request has it).
// nil when it does not exist, is someone else's, or cannot be read (logged). Within CleanupTimeout, even
// when ctx is cancelled.
func (s *Sandbox) ownUnanswered(ctx context.Context, stamps ...createStamp) *unstructured.Unstructured {
	o := &s.opts
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.CleanupTimeout)
	defer cancel()
	obj, err := s.k8s.getClaim(gctx, o.Namespace, o.ClaimName)
	if err != nil {
		if !isNotFound(err) {
			o.Logger.Info("could not read the claim a create without an answer may have made", "claim", o.ClaimName,
				"error", err.Error())
		}
		return nil
	}
	if !madeByCreate(obj, o.WarmPoolName, stamps...) {
		return nil
	}
	return obj
}

// madeByCreate: obj is a claim one of the Go client's creates with these stamps made from warm pool `pool`
// (its created-by label, pool and stamp; the stamp's random request id is this create's alone).
func madeByCreate(obj *unstructured.Unstructured, pool string, stamps ...createStamp) bool {
	from, _, _ := unstructured.NestedString(obj.Object, "spec", "warmPoolRef", "name")
	return obj.GetLabels()[CreatedByLabel] == "go-client" && from == pool && slices.Contains(stamps, stampOf(obj))
}

// adopt makes a claim of Options.ClaimName that this handle's unanswered create made the handle's, as a
// create that answered would have: Close deletes it (by UID), Open waits for it (attach).
func (s *Sandbox) adopt(obj *unstructured.Unstructured) {
	s.mu.Lock()
	s.claimName, s.claimUID, s.explicit, s.attach = obj.GetName(), obj.GetUID(), true, true
	s.lostCreates = nil
	s.mu.Unlock()
	s.opts.Logger.V(1).Info("the claim a create without an answer made is this handle's", "namespace", s.opts.Namespace,
		"claim", obj.GetName())
}

// rollback deletes an auto-named claim after a failed Open (explicit names are kept). If the deletion fails
// too, the handle keeps the claim name and reports ErrOrphanedClaim until Close succeeds.
func (s *Sandbox) rollback(ctx context.Context, claim string, uid types.UID, explicit bool, cause error) error {
	if explicit {
		// kept: the next Open attaches to it (waiting for readiness) instead of creating it again
		s.mu.Lock()
		s.attach = true
		s.mu.Unlock()
		return cause
	}
	if claim == "" {
		return cause // nothing was made (until December 6 a rollback then asked to delete "": "name is required")
	}
	if err := s.deleteClaim(ctx, claim, uid); err != nil {
		return fmt.Errorf("%w; deleting the claim failed too (%v): %w", cause, err, ErrOrphanedClaim)
	}
	s.mu.Lock()
	if s.claimName == claim && s.claimUID == uid {
		s.claimName, s.claimUID = "", ""
	}
	s.mu.Unlock()
	return cause
}

// deleteClaim deletes the claim (by UID: 404 or a UID conflict is success) within CleanupTimeout, even when
// ctx is already cancelled, retrying transient failures (cleanupRetry); a failure left marks the handle
// orphaned (Open refuses, Close retries, and a Client keeps the handle so DeleteAll does).
func (s *Sandbox) deleteClaim(ctx context.Context, claim string, uid types.UID) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.CleanupTimeout)
	defer cancel()
	err := cleanupRetry(dctx, func() error { return s.k8s.deleteClaim(dctx, s.opts.Namespace, claim, uid) })
	if err != nil {
		s.mu.Lock()
		s.orphaned = true
		s.mu.Unlock()
	}
	return err
}

// reconnect re-opens the transport of an existing claim (spec 4.5 "Reconnect").
func (s *Sandbox) reconnect(ctx context.Context, run *openRun) error {
	s.mu.Lock()
	claim, attach := s.claimName, s.attach
	s.mu.Unlock()
	var name string
	var info sandboxInfo
	if attach {
		// a handle made by GetSandbox: a suspended or hibernated Sandbox will not become Ready by waiting
		if held, err := s.attachHeld(ctx, claim); held {
			return err
		}
		// the claim may still be provisioning, so wait like a new one
		var err error
		if name, info, err = s.waitReady(ctx, claim); err != nil {
			if errors.Is(err, ErrSandboxDeleted) {
				s.forget()
			}
			return err
		}
	} else {
		obj, err := s.k8s.getClaim(ctx, s.opts.Namespace, claim)
		if err != nil {
			if isNotFound(err) {
				s.forget()
				return fmt.Errorf("claim %s: %w", claim, ErrSandboxDeleted)
			}
			return fmt.Errorf("verifying claim %s: %v: %w", claim, err, ErrOrphanedClaim)
		}
		if name = claimSandboxName(obj); name == "" {
			return fmt.Errorf("claim %s has no bound Sandbox: %w", claim, ErrOrphanedClaim)
		}
		sb, err := s.k8s.sandboxes(s.opts.Namespace).Get(ctx, name, getOpts)
		switch {
		case apierrors.IsForbidden(err):
			// claims-only credentials (waitClaimReady): the claim's Ready mirrors the Sandbox's
			sb, info = obj, claimSandboxInfo(obj)
		case isNotFound(err):
			if archived, expired := s.hibernation(ctx, name); archived {
				if expired != nil {
					return expired
				}
				return fmt.Errorf("%w: %s", ErrNotReady, s.hibernatedText(name))
			}
			return fmt.Errorf("verifying Sandbox %s: %v: %w", name, err, ErrOrphanedClaim)
		case err != nil:
			return fmt.Errorf("verifying Sandbox %s: %v: %w", name, err, ErrOrphanedClaim)
		default:
			info = readSandboxInfo(sb)
		}
		if info.mode == "Suspended" {
			return fmt.Errorf("%w: Sandbox %s is suspended; call Resume", ErrNotReady, name)
		}
		if c := findCondition(conditionsOf(sb), "Ready"); c == nil || c.Status != "True" {
			return fmt.Errorf("Sandbox %s is not Ready (%s): %w", name, describeConditions(conditionsOf(sb)),
				ErrOrphanedClaim)
		}
	}
	conn, err := s.connect(ctx, name, info)
	if err != nil {
		return err
	}
	if !s.publishConn(run, conn, func() { s.sandboxName, s.info, s.attach = name, info, false }) {
		return run.cause // the claim stays the handle's: Close, waiting for this Open, deletes it
	}
	return nil
}

// attachHeld is the check GetSandbox makes before it waits for readiness: a claim whose Sandbox is
// suspended, or hibernated (its SandboxArchive exists, restorable), does not become Ready by waiting. Then
// held is true and the handle is bound (claim, UID, Sandbox name) but not connected, err is ErrNotReady
// with the advice a reconnect gives, and Resume (suspended) or a restore (hibernated) is the way on. An
// expired archive is its *ConditionError SandboxExpired (ErrSandboxDeleted), nothing bound. held is false
// when there is nothing to say (also when the claim or Sandbox cannot be read: the wait reports it). Until
// December 6 GetSandbox waited out SandboxReadyTimeout for a suspended Sandbox and returned no handle, and
// called a hibernated one deleted.
func (s *Sandbox) attachHeld(ctx context.Context, claim string) (held bool, err error) {
	obj, err := s.k8s.getClaim(ctx, s.opts.Namespace, claim)
	if err != nil || obj.GetDeletionTimestamp() != nil {
		return false, nil
	}
	s.mu.Lock()
	if s.claimUID == "" {
		// the handle owns this claim from here on: Close deletes it by this UID, never a successor
		s.claimUID = obj.GetUID()
	}
	s.mu.Unlock()
	name := claimSandboxName(obj)
	if name == "" {
		name = obj.GetAnnotations()[hibernatedSandboxAnnotation]
	}
	if name == "" {
		return false, nil
	}
	var why error
	sb, err := s.k8s.sandboxes(s.opts.Namespace).Get(ctx, name, getOpts)
	switch {
	case apierrors.IsForbidden(err):
		// claims-only credentials: the claim's Ready reason says it
		ready := findCondition(conditionsOf(obj), "Ready")
		switch {
		case ready == nil || ready.Status == "True":
			return false, nil
		case ready.Reason == reasonSandboxHibernated:
			why = fmt.Errorf("%w: %s", ErrNotReady, s.hibernatedText(name))
		case ready.Reason == reasonSandboxSuspended:
			why = fmt.Errorf("%w: Sandbox %s/%s is suspended: call Resume (or `agent-sandbox resume`)", ErrNotReady,
				s.opts.Namespace, name)
		default:
			return false, nil
		}
	case isNotFound(err):
		archived, expired := s.hibernation(ctx, name)
		if !archived {
			return false, nil
		}
		if expired != nil {
			return true, expired
		}
		why = fmt.Errorf("%w: %s", ErrNotReady, s.hibernatedText(name))
	case err != nil:
		return false, nil
	default:
		if mode, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode"); mode != "Suspended" {
			return false, nil
		}
		why = fmt.Errorf("%w: %s", ErrNotReady, s.suspendedText(ctx, sb))
	}
	s.mu.Lock()
	s.sandboxName, s.attach = name, false
	if sb != nil && err == nil {
		s.info = readSandboxInfo(sb)
	}
	s.noConn = strings.TrimPrefix(why.Error(), ErrNotReady.Error()+": ")
	s.mu.Unlock()
	return true, why
}

// forget clears the local state of a claim that no longer exists.
func (s *Sandbox) forget() {
	s.mu.Lock()
	s.claimName, s.claimUID, s.sandboxName, s.info, s.attach = "", "", "", sandboxInfo{}, false
	s.noConn = "its claim no longer exists: open a new sandbox"
	s.mu.Unlock()
}

// watchTunnel logs when a tunnel dies; calls then fail with ErrNotReady wrapping ErrPortForwardDied.
func (s *Sandbox) watchTunnel(c *liveConn) {
	if c.died == nil {
		return
	}
	go func() {
		<-c.died
		s.mu.Lock()
		current := s.conn == c
		s.mu.Unlock()
		if current {
			s.opts.Logger.Info("port-forward tunnel lost; call Open to reconnect", "error", fmt.Sprint(c.dead()))
		}
	}()
}

// Disconnect closes the transport and keeps the claim; Open reconnects. New calls fail with ErrNotReady at
// once. Started Processes' streams are ended at once (the runtime kills their commands; they fail with
// ErrNotReady wrapping ErrTransportClosed); one-shot calls in flight (Run, Read, Write, ...) may finish, for
// at most half of CleanupTimeout (or until ctx ends), before the transport is closed - one still running
// then fails with ErrNotReady wrapping ErrTransportClosed. The kept-alive HTTP connections of the handle's
// own transport (not of Options.HTTPTransport) are closed once no call is in flight.
func (s *Sandbox) Disconnect(ctx context.Context) error {
	s.disconnect(ctx, "the handle was disconnected (Disconnect): call Open to reconnect", s.opts.CleanupTimeout/2)
	return nil
}

// disconnect detaches the transport (calls then fail with ErrNotReady and why), lets calls in flight finish
// for at most grace (0: none; Suspend and Resume, whose Pod goes or went away), and closes it. The kept-alive
// connections are closed now, or by the last call in flight when it ends (begin's release). Until December 6
// the transport was closed first, which on sandboxd cut every gRPC call in flight.
func (s *Sandbox) disconnect(ctx context.Context, why string, grace time.Duration) {
	conn := s.detach(why)
	if conn != nil && grace > 0 {
		s.drain(ctx, grace)
	}
	if conn != nil {
		conn.closeWith(why)
	}
	s.mu.Lock()
	idle := s.inflight == 0
	s.mu.Unlock()
	if idle {
		s.http.closeIdle()
	}
}

// Close refuses new calls, ends started Processes' streams at once (ErrNotReady wrapping
// ErrTransportClosed; the runtime kills their commands), lets one-shot calls in flight finish (at most half
// of CleanupTimeout), closes the transport - a call still running then, gRPC or HTTP, fails with ErrNotReady
// wrapping ErrTransportClosed (until December 6 an HTTP call went on, and through a router returned the
// runtime's answer once the claim's deletion killed its command: exit -15, nil error) - and deletes the
// claim (a claim already gone is fine). If the
// deletion fails the claim name is kept so Close can be retried. Close on a handle without a claim deletes
// nothing - but the claim of an unanswered create of Options.ClaimName that has appeared since with this
// handle's stamps (a failed deletion of it is ErrOrphanedClaim, and Close can be retried), and the claims of
// auto-named creates without an answer that an Open could not look for or delete (ErrOrphanedClaim again
// while that still fails). A Client's handle leaves the Client's registry once Close succeeds. The kept-alive
// HTTP connections of the handle's own transport (not of Options.HTTPTransport) are closed once no call is
// in flight. Until December 6 a streaming Process held
// Close for its whole drain (15 s by default), and was cut then anyway.
//
// A Close during an Open or a Resume of the handle ends it (it fails with ErrNotReady, "closed during Open"
// or "closed during Resume", and connects nothing), waits for it to return (at most twice CleanupTimeout:
// an Open deletes an auto-named claim it made itself), and then deletes the claim the handle owns. Until
// December 6 such a Close deleted nothing and the Open connected the closed handle afterwards, its claim
// leaked; a Resume connected the closed handle. A Client.GetSandbox handle whose Open it ended before the
// claim was ever read deletes nothing: it never attached to it (it has no UID to delete it by). An Open or
// Resume begun during a Close waits for it; a Close during another Close waits for it too, then deletes
// what is left (usually nothing).
func (s *Sandbox) Close(ctx context.Context) (err error) {
	return s.close(ctx, time.Now().Add(s.opts.CleanupTimeout/2))
}

// close is Close, letting one-shot calls in flight finish until drainUntil.
func (s *Sandbox) close(ctx context.Context, drainUntil time.Time) (err error) {
	ctx, span := s.tracing.start(ctx, "close")
	defer func() { endSpan(span, err) }()
	ctx = withRetryDeadline(ctx) // the cleanup's retries stop at the caller's deadline
	why := "the handle was closed (Close); Open claims a new sandbox"
	run, end := s.beginClose()
	defer end()
	if err := s.cutOpen(run); err != nil {
		return s.wrap(err)
	}
	s.mu.Lock()
	claim, uid := s.claimName, s.claimUID
	if claim != "" && uid == "" && s.attach && !s.explicit {
		// an attach (Client.GetSandbox) whose Open this Close ended before it ever read the claim: the handle
		// never owned it (a claim is the handle's by the UID it made or attached), so it deletes nothing -
		// until this was checked, such a Close deleted whatever claim had the name, with no UID precondition
		claim, s.claimName, s.attach = "", "", false
	}
	s.mu.Unlock()
	conn := s.detach(why)
	// calls in flight finish before the transport closes (until December 6 it closed first, cutting
	// sandboxd's gRPC calls with an untyped Canceled; the legacy runtime's calls happened to survive)
	s.drain(context.WithoutCancel(ctx), time.Until(drainUntil))
	if conn != nil {
		conn.closeWith(why)
	}
	// a call still in flight (past the drain) closes them when it ends: begin's release
	s.http.closeIdle()
	if claim == "" {
		if err := s.removeLostCreates(ctx); err != nil {
			return s.wrap(err)
		}
	} else {
		if err := s.deleteClaim(ctx, claim, uid); err != nil {
			return s.wrap(fmt.Errorf("deleting claim %s: %v: %w", claim, err, ErrOrphanedClaim))
		}
		s.mu.Lock()
		s.claimName, s.claimUID, s.sandboxName, s.orphaned, s.attach = "", "", "", false, false
		s.explicit = false
		s.mu.Unlock()
	}
	if stamps := s.lostAutoStamps(); len(stamps) > 0 {
		if err := s.removeUnansweredClaim(ctx, stamps...); err != nil {
			return s.wrap(err)
		}
	}
	if s.client != nil {
		// nothing left to delete: the Client forgets the handle (until December 7 it kept every closed one)
		s.client.closed(s)
	}
	return nil
}

func (s *Sandbox) lostAutoStamps() []createStamp {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.lostAutoCreates)
}

// leftover reports what a failed Open left for Close to delete: the claim it owns when its rollback's
// deletion failed (orphaned), or - claim "" - the claims of auto-named creates without an answer that could
// not be looked for or deleted (lostAutoCreates).
func (s *Sandbox) leftover() (claim string, left bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimName, (s.orphaned && s.claimName != "") || len(s.lostAutoCreates) > 0
}

// ownedClaim is the claim Close would delete ("" when none): not one an attach (Client.GetSandbox) never read,
// which it has no UID of (see close).
func (s *Sandbox) ownedClaim() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claimUID == "" && s.attach && !s.explicit {
		return ""
	}
	return s.claimName
}

// beginClose makes this Close the handle's one in progress, once any other has ended - Opens and Resumes
// begun from now on wait for end - and returns the Open or Resume in progress (nil when none), marked cut:
// it connects nothing.
func (s *Sandbox) beginClose() (run *openRun, end func()) {
	s.mu.Lock()
	_ = s.awaitClose(context.Background()) // never ends early
	ch := make(chan struct{})
	s.closing = ch
	run = s.opening
	if run != nil {
		run.closed = true
	}
	s.mu.Unlock()
	return run, func() {
		s.mu.Lock()
		s.closing = nil
		s.mu.Unlock()
		close(ch)
	}
}

// cutOpen ends the Open or Resume run (nil: none; beginClose marked it cut) and waits for it to return - at
// most twice CleanupTimeout: an Open's own cleanup (a rollback, a search for the claim of a create without
// an answer) is bounded by CleanupTimeout per step, even with its context ended.
func (s *Sandbox) cutOpen(run *openRun) error {
	if run == nil {
		return nil
	}
	run.cancel(run.cause)
	wait := 2 * s.opts.CleanupTimeout
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-run.done:
		return nil
	case <-t.C:
		return fmt.Errorf("the %s this Close ended had not returned after %s; it connects nothing, but the claim "+
			"it may have made is deleted only by calling Close again once it has returned: %w", run.what, wait,
			ErrOrphanedClaim)
	}
}

// removeLostCreates deletes the claim of Options.ClaimName if an unanswered create of this handle made it after
// all (the API server applied the request after it was given up): a claim nobody would delete otherwise.
// A failed deletion is ErrOrphanedClaim, and the stamps are kept so Close can be retried (until December 6
// it was only logged, and Close returned nil); a claim that cannot be read is logged (ownUnanswered).
func (s *Sandbox) removeLostCreates(ctx context.Context) error {
	stamps := s.lostStamps()
	if len(stamps) == 0 {
		return nil
	}
	own := s.ownUnanswered(ctx, stamps...)
	if own == nil {
		return nil
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.CleanupTimeout)
	defer cancel()
	if err := cleanupRetry(dctx, func() error {
		return s.k8s.deleteClaim(dctx, s.opts.Namespace, own.GetName(), own.GetUID())
	}); err != nil {
		return fmt.Errorf("deleting claim %s, which an Open of this handle whose create got no answer made: %v: %w",
			own.GetName(), err, ErrOrphanedClaim)
	}
	s.opts.Logger.V(1).Info("deleted the claim a create without an answer made", "claim", own.GetName())
	s.mu.Lock()
	s.lostCreates = nil
	s.mu.Unlock()
	return nil
}

// detach takes the transport from the handle - new calls fail with ErrNotReady and why - and ends the
// started Processes' streams (they fail with ErrNotReady wrapping ErrTransportClosed); one-shot calls in
// flight keep the transport, which the caller closes.
func (s *Sandbox) detach(why string) *liveConn {
	s.mu.Lock()
	conn := s.conn
	s.conn, s.noConn = nil, why
	var procs []*Process
	for slot := range s.streams {
		slot.cut = why
		if slot.p != nil {
			procs = append(procs, slot.p)
		}
	}
	clear(s.streams)
	s.mu.Unlock()
	for _, p := range procs {
		p.abort(why)
	}
	return conn
}

// drain waits until no one-shot call is in flight, at most d (and no longer than ctx).
func (s *Sandbox) drain(ctx context.Context, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		s.mu.Lock()
		n := s.inflight
		s.mu.Unlock()
		if n == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// usable is the current transport, or ErrNotReady with why there is none. s.mu is held.
func (s *Sandbox) usable() error {
	if s.conn == nil {
		why := s.noConn
		if why == "" {
			why = "the handle is not open: call Open"
		}
		return fmt.Errorf("%w: %s", ErrNotReady, why)
	}
	if err := s.conn.dead(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	return nil
}

// begin registers an in-flight call on the current transport; release must be called when it ends.
func (s *Sandbox) begin() (*liveConn, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return nil, nil, err
	}
	s.inflight++
	var once sync.Once
	return s.conn, func() {
		once.Do(func() {
			s.mu.Lock()
			s.inflight--
			// the last call of a handle that was closed or disconnected meanwhile: nothing will use the
			// connections it leaves kept alive (an Open sets conn again first)
			idle := s.inflight == 0 && len(s.streams) == 0 && s.conn == nil
			s.mu.Unlock()
			if idle {
				s.http.closeIdle()
			}
		})
	}, nil
}

// beginStream registers a stream (Start) on the current transport; endStream must be called when it ends,
// attachStream once its Process exists.
func (s *Sandbox) beginStream() (*liveConn, *streamSlot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return nil, nil, err
	}
	if s.streams == nil {
		s.streams = map[*streamSlot]struct{}{}
	}
	slot := &streamSlot{}
	s.streams[slot] = struct{}{}
	return s.conn, slot, nil
}

// attachStream gives the slot its Process, or ends the Process at once when the handle ended the slot's
// stream while it was being started (Close or Disconnect in between).
func (s *Sandbox) attachStream(slot *streamSlot, p *Process) {
	s.mu.Lock()
	why := slot.cut
	if why == "" {
		slot.p = p
	}
	s.mu.Unlock()
	if why != "" {
		p.abort(why)
	}
}

// endStream unregisters a stream that ended (once is enough; a slot the handle ended is gone already).
func (s *Sandbox) endStream(slot *streamSlot) {
	s.mu.Lock()
	_, live := s.streams[slot]
	delete(s.streams, slot)
	idle := live && s.inflight == 0 && len(s.streams) == 0 && s.conn == nil
	s.mu.Unlock()
	if idle {
		s.http.closeIdle()
	}
}

// callContext bounds a call: WithTimeout, else RequestTimeout when ctx has no deadline (raised to fit a
// command timeout). budget names the limit, for the error when it runs out.
func (s *Sandbox) callContext(ctx context.Context, o *callOptions) (context.Context, context.CancelFunc, string) {
	parent, hasParent := ctx.Deadline()
	// Until December 7 only a positive WithTimeout applied: a negative one (a deadline computed as already
	// past) ran the call under RequestTimeout, 180 s.
	if o.timeoutSet {
		c, cancel := context.WithTimeout(ctx, o.timeout)
		if hasParent && time.Until(parent) < o.timeout {
			return c, cancel, "the context's deadline"
		}
		return c, cancel, fmt.Sprintf("WithTimeout(%s)", o.timeout)
	}
	if hasParent {
		c, cancel := context.WithCancel(ctx)
		return c, cancel, "the context's deadline"
	}
	d, budget := s.opts.RequestTimeout, "RequestTimeout"
	if o.commandTimeout > 0 && o.commandTimeout+commandTimeoutSlack > d {
		d, budget = o.commandTimeout+commandTimeoutSlack, "WithCommandTimeout + 10s"
	}
	c, cancel := context.WithTimeout(ctx, d)
	return c, cancel, fmt.Sprintf("%s (%s)", budget, d)
}

// op runs one SDK call: options, span, deadline, in-flight accounting, error prefix.
func (s *Sandbox) op(ctx context.Context, name string, opts []CallOption, fileCall bool,
	fn func(ctx context.Context, c *liveConn, o *callOptions) error) (err error) {
	o := buildCallOptions(opts)
	if fileCall && o.execSet {
		return s.wrap(fmt.Errorf("%s: %w", name, invalidf("command options (env, cwd, stdin, ...) only apply to Run and Start")))
	}
	if o.fileMode != nil && name != "write" {
		return s.wrap(fmt.Errorf("%s: %w", name, invalidf("WithFileMode only applies to Write and WriteFrom")))
	}
	if o.fileMode != nil && *o.fileMode&^fs.ModePerm != 0 {
		return s.wrap(fmt.Errorf("%s: %w", name, invalidf("file mode %v has bits beyond the permission bits (0o777)", *o.fileMode)))
	}
	if err := o.validateExec(); err != nil {
		return s.wrap(fmt.Errorf("%s: %w", name, err))
	}
	ctx, span := s.tracing.start(ctx, name, attribute.String("sandbox.namespace", s.opts.Namespace))
	defer func() { endSpan(span, err) }()
	ctx, cancel, budget := s.callContext(ctx, &o)
	defer cancel()
	c, release, err := s.begin()
	if err != nil {
		return s.wrap(fmt.Errorf("%s: %w", name, err))
	}
	defer release()
	bound, unbind := c.bind(ctx)
	defer unbind()
	err = fn(bound, c, &o)
	// the handle closed the transport under the call - also when the caller's context ended after that (what
	// ended the call is what ended bound first: until December 6 such a call said context.Canceled)
	if err != nil && (ctx.Err() == nil || errors.Is(context.Cause(bound), errTransportCut)) {
		err = c.cutBound(bound, err)
	}
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && errors.Is(err, context.DeadlineExceeded) {
		if !errors.Is(err, ErrTimeout) {
			// the deadline met the call after its answer began (reading a Read's body, a listing): still the
			// documented ErrTimeout, which until December 6 only a call without an answer yet got
			err = fmt.Errorf("%s: %w: %w", name, ErrTimeout, err)
		}
		err = fmt.Errorf("%w - the call's budget, %s, ran out", err, budget) // which limit it was
	}
	return s.wrap(err)
}

// Run runs command (a shell command line on sandboxd; split without a shell by the legacy runtime) and
// returns its output and exit code; a non-zero exit is not an error. One attempt unless WithMaxAttempts.
// WithStdout / WithStderr / WithStdin / WithPTY stream through Start.
func (s *Sandbox) Run(ctx context.Context, command string, opts ...CallOption) (*ExecutionResult, error) {
	var res *ExecutionResult
	err := s.op(ctx, "run", opts, false, func(ctx context.Context, c *liveConn, o *callOptions) error {
		var err error
		if o.streaming() {
			res, err = s.runStreaming(ctx, c, command, o)
			return err
		}
		if s.opts.Runtime == RuntimeSandboxd {
			if c.proc == nil {
				return fmt.Errorf("run: %w: this transport has no gRPC target (APIURL with RuntimeSandboxd)", ErrNotReady)
			}
			res, err = s.sandboxd.run(ctx, c.proc, c.ep, command, o)
			return err
		}
		res, err = s.legacy.run(ctx, c.ep, command, o)
		return err
	})
	return res, err
}

func (s *Sandbox) runStreaming(ctx context.Context, c *liveConn, command string, o *callOptions) (*ExecutionResult, error) {
	p, err := s.startOn(ctx, c, command, o, func() {})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if o.stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, rerr := o.stdin.Read(buf)
				if n > 0 {
					if err := p.WriteStdin(ctx, buf[:n]); err != nil {
						return
					}
				}
				if rerr != nil {
					_ = p.CloseStdin(ctx)
					return
				}
			}
		}()
	}
	res, err := p.collect(o.stdout, o.stderr)
	if err != nil && ctx.Err() != nil {
		return nil, callContextError(ctx, "run (streamed)", err)
	}
	return res, err
}

// Start starts command and returns at once; its output and exit arrive as Events (see Process). The
// process lives until it exits, ctx ends, or Process.Close; RequestTimeout does not apply (WithTimeout
// does). The legacy runtime streams through this project's POST /execute/stream; stdin, signals and a PTY
// need sandboxd.
func (s *Sandbox) Start(ctx context.Context, command string, opts ...CallOption) (*Process, error) {
	o := buildCallOptions(opts)
	if err := o.validateExec(); err != nil {
		return nil, s.wrap(fmt.Errorf("start: %w", err))
	}
	parent := ctx
	var cancel context.CancelFunc = func() {}
	if o.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
	}
	// why ctx ended: its deadline (WithTimeout's or the caller's; gRPC may report it a moment before ctx
	// does), or the caller's cancel - not the cancel that ends a finished or closed Process
	ended := func() error {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return context.DeadlineExceeded
		}
		return parent.Err()
	}
	// a stream, not a one-shot call: Close and Disconnect end it rather than wait for it
	c, slot, err := s.beginStream()
	if err != nil {
		cancel()
		return nil, s.wrap(fmt.Errorf("start: %w", err))
	}
	p, err := s.startOn(ctx, c, command, &o, func() { cancel(); s.endStream(slot) })
	if err != nil {
		if ctx.Err() == nil {
			err = c.cut(err) // the handle closed the transport under the start
		}
		err = withContextCause(ended(), err)
		cancel()
		s.endStream(slot)
		return nil, s.wrap(err)
	}
	claim := s.ClaimName()
	p.ended, p.wrap = ended, func(err error) error { return wrapErr(s.opts.Namespace, claim, c.cut(err)) }
	s.attachStream(slot, p)
	return p, nil
}

func (s *Sandbox) startOn(ctx context.Context, c *liveConn, command string, o *callOptions, release func()) (*Process, error) {
	if s.opts.Runtime == RuntimeSandboxd {
		if c.proc == nil {
			return nil, fmt.Errorf("start: %w: this transport has no gRPC target (APIURL with RuntimeSandboxd)", ErrNotReady)
		}
		return s.sandboxd.start(ctx, c.proc, c.ep, command, o, release)
	}
	return s.legacy.start(ctx, c.ep, command, o, release)
}

// fileRuntime is the file half of a runtime protocol (legacyRuntime, sandboxdRuntime).
type fileRuntime interface {
	write(ctx context.Context, ep *endpoint, path string, src *uploadSource, o *callOptions) error
	readTo(ctx context.Context, ep *endpoint, path string, w io.Writer, o *callOptions) (int64, error)
	list(ctx context.Context, ep *endpoint, path string, o *callOptions) ([]FileEntry, error)
	exists(ctx context.Context, ep *endpoint, path string, o *callOptions) (bool, error)
	delete(ctx context.Context, ep *endpoint, path string, recursive bool, o *callOptions) error
}

func (s *Sandbox) files() fileRuntime {
	if s.opts.Runtime == RuntimeSandboxd {
		return s.sandboxd
	}
	return s.legacy
}

// Write stores content at path (relative to the runtime root; parent directories are created). The path
// must not be empty or contain ".." segments.
func (s *Sandbox) Write(ctx context.Context, path string, content []byte, opts ...CallOption) error {
	if int64(len(content)) > s.opts.MaxUploadSize {
		return s.wrap(invalidf("write %s: %d bytes exceed MaxUploadSize (%d)", path, len(content), s.opts.MaxUploadSize))
	}
	return s.op(ctx, "write", opts, true, func(ctx context.Context, c *liveConn, o *callOptions) error {
		return s.files().write(ctx, c.ep, path, bytesSource(content), o)
	})
}

// WriteFrom streams r to path without holding it in memory; past MaxUploadSize bytes the upload is
// aborted with ErrInvalidArgument. A reader that is also an io.Seeker is rewound for retries; any other
// reader is sent in a single attempt.
//
// r is read by one goroutine at a time, never the caller's. The call ends with its context even while a Read
// of r blocks (ErrTimeout at the deadline, context.Canceled at a cancel): that Read is then abandoned - it
// may return after WriteFrom has, and what it read is discarded; r is not read again. Otherwise WriteFrom
// has stopped reading r when it returns. Until December 6 a Read that blocked held WriteFrom until it
// returned (forever, for one that never does), whatever the context.
func (s *Sandbox) WriteFrom(ctx context.Context, path string, r io.Reader, opts ...CallOption) error {
	src, err := newUploadSource(r, s.opts.MaxUploadSize)
	if err != nil {
		return s.wrap(fmt.Errorf("write %s: %w", path, err))
	}
	return s.op(ctx, "write", opts, true, func(ctx context.Context, c *liveConn, o *callOptions) error {
		return s.files().write(ctx, c.ep, path, src, o)
	})
}

// Read returns the content of the file at path (at most MaxDownloadSize bytes).
func (s *Sandbox) Read(ctx context.Context, path string, opts ...CallOption) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := s.ReadTo(ctx, path, &buf, opts...); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ReadTo streams the file at path into w and returns the bytes written. More than MaxDownloadSize bytes
// fail with ErrResponseTooLarge (w has then received the first MaxDownloadSize bytes).
func (s *Sandbox) ReadTo(ctx context.Context, path string, w io.Writer, opts ...CallOption) (n int64, err error) {
	err = s.op(ctx, "read", opts, true, func(ctx context.Context, c *liveConn, o *callOptions) (err error) {
		n, err = s.files().readTo(ctx, c.ep, path, w, o)
		return err
	})
	return n, err
}

// List returns the children of the directory at path ("" or "." is the root).
func (s *Sandbox) List(ctx context.Context, path string, opts ...CallOption) (out []FileEntry, err error) {
	err = s.op(ctx, "list", opts, true, func(ctx context.Context, c *liveConn, o *callOptions) (err error) {
		out, err = s.files().list(ctx, c.ep, path, o)
		if errors.Is(err, ErrResponseTooLarge) {
			err = fmt.Errorf("%w - the listing of %q is over this SDK's %d MiB limit for one directory: list its "+
				"subdirectories, or run a command in the sandbox (`ls DIR | wc -l`, `find DIR -maxdepth 1 | head`)",
				err, path, maxListResponse>>20)
		}
		return err
	})
	return out, err
}

// Exists says whether a file or directory exists at path.
func (s *Sandbox) Exists(ctx context.Context, path string, opts ...CallOption) (out bool, err error) {
	if err := checkControlChars(path); err != nil {
		// as Write and Read refuse it, before anything is sent (until December 6 it was sent)
		return false, s.wrap(fmt.Errorf("exists: %w", err))
	}
	err = s.op(ctx, "exists", opts, true, func(ctx context.Context, c *liveConn, o *callOptions) (err error) {
		out, err = s.files().exists(ctx, c.ep, path, o)
		return err
	})
	return out, err
}

// Delete removes the file or directory at path (a non-empty directory needs recursive). sandboxd, or this
// project's legacy runtime (upstream's python-runtime: ErrUnsupportedByRuntime).
func (s *Sandbox) Delete(ctx context.Context, path string, recursive bool, opts ...CallOption) error {
	return s.op(ctx, "delete", opts, true, func(ctx context.Context, c *liveConn, o *callOptions) error {
		return s.files().delete(ctx, c.ep, path, recursive, o)
	})
}

// Commands groups the command calls of a Sandbox.
type Commands struct{ s *Sandbox }

// Commands returns the command engine.
func (s *Sandbox) Commands() Commands { return Commands{s} }

// Run is Sandbox.Run.
func (c Commands) Run(ctx context.Context, command string, opts ...CallOption) (*ExecutionResult, error) {
	return c.s.Run(ctx, command, opts...)
}

// Start is Sandbox.Start.
func (c Commands) Start(ctx context.Context, command string, opts ...CallOption) (*Process, error) {
	return c.s.Start(ctx, command, opts...)
}

// Files groups the file calls of a Sandbox.
type Files struct{ s *Sandbox }

// Files returns the file engine.
func (s *Sandbox) Files() Files { return Files{s} }

// Write is Sandbox.Write.
func (f Files) Write(ctx context.Context, path string, content []byte, opts ...CallOption) error {
	return f.s.Write(ctx, path, content, opts...)
}

// Read is Sandbox.Read.
func (f Files) Read(ctx context.Context, path string, opts ...CallOption) ([]byte, error) {
	return f.s.Read(ctx, path, opts...)
}

// List is Sandbox.List.
func (f Files) List(ctx context.Context, path string, opts ...CallOption) ([]FileEntry, error) {
	return f.s.List(ctx, path, opts...)
}

// Exists is Sandbox.Exists.
func (f Files) Exists(ctx context.Context, path string, opts ...CallOption) (bool, error) {
	return f.s.Exists(ctx, path, opts...)
}

// Delete is Sandbox.Delete.
func (f Files) Delete(ctx context.Context, path string, recursive bool, opts ...CallOption) error {
	return f.s.Delete(ctx, path, recursive, opts...)
}
