package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// archivesGVR is a hibernated Sandbox's SandboxArchive (ours, the opt-in lifecycle component; same name as
// the Sandbox). Read only to say why a Resume cannot be done: this SDK does not restore archives.
var archivesGVR = schema.GroupVersionResource{Group: "lifecycle.agents.x-k8s.io", Version: "v1alpha1", Resource: "sandboxarchives"}

// ExpiredAtAnnotation marks a SandboxArchive whose Sandbox expired while hibernated (shutdownPolicy
// Retain): kept, never restored.
const ExpiredAtAnnotation = "lifecycle.agents.x-k8s.io/expired-at"

const reasonClaimExpired = "ClaimExpired"

// Claim Ready reasons of a held-back Sandbox (ours): the claim controller's for a hibernated one, and the
// Sandbox's mirrored one for a suspended one.
const (
	reasonSandboxHibernated = "SandboxHibernated"
	reasonSandboxSuspended  = "SandboxSuspended"
)

// hibernatedSandboxAnnotation on a claim names its hibernated Sandbox (the lifecycle controller sets it while
// a SandboxArchive keeps the Sandbox; the claim controller may drop status.sandbox meanwhile).
const hibernatedSandboxAnnotation = "lifecycle.agents.x-k8s.io/hibernated-sandbox"

var getOpts = metav1.GetOptions{}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// newClaimRequestID is a create's random id (ClientRequestIDAnnotation).
func newClaimRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather than return an error since Go 1.24)
	return hex.EncodeToString(b[:])
}

// buildClaim is the SandboxClaim a new sandbox asks for (spec 4.5 step 1, plus this project's extras);
// requestID is the create's own id (ClientRequestIDAnnotation).
func buildClaim(o *Options, now time.Time, requestID, traceContext string) *unstructured.Unstructured {
	labels := map[string]any{}
	for k, v := range o.Labels {
		labels[k] = v
	}
	labels[CreatedByLabel] = "go-client"
	annotations := map[string]any{FirstRequestedAtAnnotation: now.UTC().Format(time.RFC3339Nano),
		ClientRequestIDAnnotation: requestID}
	if traceContext != "" {
		annotations[TraceContextAnnotation] = traceContext
	}
	meta := map[string]any{"labels": labels, "annotations": annotations}
	if o.ClaimName != "" {
		meta["name"] = o.ClaimName
	} else {
		meta["generateName"] = "sandbox-claim-"
	}
	spec := map[string]any{"warmPoolRef": map[string]any{"name": o.WarmPoolName}}
	if o.ShutdownAfter > 0 {
		at := now.Add(o.ShutdownAfter).UTC().Truncate(time.Second)
		spec["lifecycle"] = map[string]any{"shutdownTime": at.Format(time.RFC3339), "shutdownPolicy": "Delete"}
	}
	if len(o.PodLabels) > 0 || len(o.PodAnnotations) > 0 {
		apm := map[string]any{}
		if len(o.PodLabels) > 0 {
			apm["labels"] = stringMap(o.PodLabels)
		}
		if len(o.PodAnnotations) > 0 {
			apm["annotations"] = stringMap(o.PodAnnotations)
		}
		spec["additionalPodMetadata"] = apm
	}
	if len(o.Env) > 0 {
		env := make([]any, 0, len(o.Env))
		for _, e := range o.Env {
			m := map[string]any{"name": e.Name, "value": e.Value}
			if e.ContainerName != "" {
				m["containerName"] = e.ContainerName
			}
			env = append(env, m)
		}
		spec["env"] = env
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": claimsGVR.GroupVersion().String(),
		"kind":       "SandboxClaim",
		"metadata":   meta,
		"spec":       spec,
	}}
}

func stringMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (k *K8sHelper) createClaim(ctx context.Context, ns string, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	return k.claims(ns).Create(ctx, obj, metav1.CreateOptions{})
}

func (k *K8sHelper) getClaim(ctx context.Context, ns, name string) (*unstructured.Unstructured, error) {
	return k.claims(ns).Get(ctx, name, getOpts)
}

// waitReady resolves the claim's Sandbox and waits until it is Ready, within SandboxReadyTimeout (spec 4.5
// steps 2-4). Terminal claim or Sandbox conditions end the wait with a *ConditionError.
func (s *Sandbox) waitReady(ctx context.Context, claim string) (string, sandboxInfo, error) {
	o := &s.opts
	ctx, cancel := context.WithTimeoutCause(ctx, o.SandboxReadyTimeout, errReadyTimeout)
	defer cancel()
	var last lastSeen
	if s.k8s.sandboxesForbidden.Load() {
		return s.waitClaimReady(ctx, claim, &last)
	}

	var name string
	err := s.k8s.observe(ctx, claimsGVR, o.Namespace, claim, func(obj *unstructured.Unstructured) (bool, error) {
		last.set("SandboxClaim", obj)
		if err := s.claimFailure(claim, obj); err != nil {
			return false, err
		}
		name = claimSandboxName(obj)
		return name != "", nil
	})
	if err != nil {
		return "", sandboxInfo{}, s.waitError(ctx, err, "SandboxClaim", claim, &last)
	}

	var info sandboxInfo
	err = s.k8s.observe(ctx, sandboxesGVR, o.Namespace, name, func(obj *unstructured.Unstructured) (bool, error) {
		last.set("Sandbox", obj)
		ready := findCondition(conditionsOf(obj), "Ready")
		if ready != nil && ready.Status == "False" && (sandboxTerminalReasons[ready.Reason] || rejectedAsInvalid(*ready)) {
			return false, &ConditionError{Kind: "Sandbox", Namespace: obj.GetNamespace(), Name: obj.GetName(),
				Type: "Ready", Reason: ready.Reason, Message: ready.Message}
		}
		if ready == nil || ready.Status != "True" {
			return false, nil
		}
		info = readSandboxInfo(obj)
		return true, nil
	})
	if apierrors.IsForbidden(err) {
		s.k8s.log.V(1).Info("Sandboxes are not readable with these credentials; waiting on the claim", "claim", claim)
		s.k8s.sandboxesForbidden.Store(true)
		return s.waitClaimReady(ctx, claim, &last)
	}
	if err != nil {
		return "", sandboxInfo{}, s.waitError(ctx, err, "Sandbox", name, &last)
	}
	return name, info, nil
}

// waitClaimReady is ours, for a role that grants claims only (all the Python SDK and the CLI need; upstream's
// Go SDK needs Sandboxes get/list/watch): the claim's Ready condition mirrors its Sandbox's, and
// status.sandbox carries the name and pod IPs, which is what a handle connects with. The pod name is taken
// to be the Sandbox's; there is no service FQDN (in-cluster-service connectivity: ErrNoService).
func (s *Sandbox) waitClaimReady(ctx context.Context, claim string, last *lastSeen) (string, sandboxInfo, error) {
	var name string
	var info sandboxInfo
	err := s.k8s.observe(ctx, claimsGVR, s.opts.Namespace, claim, func(obj *unstructured.Unstructured) (bool, error) {
		last.set("SandboxClaim", obj)
		if err := s.claimFailure(claim, obj); err != nil {
			return false, err
		}
		ready := findCondition(conditionsOf(obj), "Ready")
		if name = claimSandboxName(obj); name == "" || ready == nil || ready.Status != "True" {
			return false, nil
		}
		info = claimSandboxInfo(obj)
		return true, nil
	})
	if err != nil {
		return "", sandboxInfo{}, s.waitError(ctx, err, "SandboxClaim", claim, last)
	}
	return name, info, nil
}

// claimFailure: the claim was replaced or is being deleted (ErrSandboxDeleted), or carries a condition that
// will not heal by waiting (*ConditionError).
func (s *Sandbox) claimFailure(claim string, obj *unstructured.Unstructured) error {
	if s.claimUIDChanged(obj) {
		return fmt.Errorf("claim %s was replaced (new UID): %w", claim, ErrSandboxDeleted)
	}
	if obj.GetDeletionTimestamp() != nil {
		return fmt.Errorf("claim %s is being deleted: %w", claim, ErrSandboxDeleted)
	}
	if ce := claimTerminal(obj); ce != nil {
		return ce
	}
	return nil
}

func (s *Sandbox) claimUIDChanged(obj *unstructured.Unstructured) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claimUID == "" && obj.GetName() == s.claimName {
		// an attach whose first read of the claim failed (attachHeld): the claim seen now is the handle's, and
		// Close deletes it by this UID - until December 6 by name, so a claim re-created under it since too
		s.claimUID = obj.GetUID()
		return false
	}
	return s.claimUID != "" && obj.GetUID() != s.claimUID
}

// errReadyTimeout is the cause of a wait's own SandboxReadyTimeout, told apart from the caller's deadline.
var errReadyTimeout = errors.New("SandboxReadyTimeout passed")

// lastSeen keeps the conditions of the object last observed, for timeout messages.
type lastSeen struct {
	mu    sync.Mutex
	kind  string
	conds []condition
}

func (l *lastSeen) set(kind string, obj *unstructured.Unstructured) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.kind, l.conds = kind, conditionsOf(obj)
}

// untouched reports whether no condition was ever seen: the controller answers a claim it sees at once, so
// nothing has reconciled it (no controller running, or one not watching this namespace).
func (l *lastSeen) untouched() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conds) == 0
}

// seen reports whether any state of the object was observed (false: it never existed for this wait).
func (l *lastSeen) seen() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.kind != ""
}

func (l *lastSeen) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kind == "" {
		return "nothing observed"
	}
	return l.kind + " " + describeConditions(l.conds)
}

func (s *Sandbox) waitError(ctx context.Context, err error, kind, name string, last *lastSeen) error {
	switch {
	case errors.Is(err, errObjectGone) && !last.seen():
		return fmt.Errorf("%s %s/%s not found: %w", kind, s.opts.Namespace, name, ErrSandboxDeleted)
	case errors.Is(err, errObjectGone):
		return fmt.Errorf("%s %s disappeared: %w", kind, name, ErrSandboxDeleted)
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), errReadyTimeout):
		// The caller's own context ended first (its deadline, or a cancel): say so and keep its error's
		// identity - until December 6 a caller's 10 ms deadline read as "not ready within
		// SandboxReadyTimeout (3m0s)" and did not match context.DeadlineExceeded.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%s %s not ready when the caller's deadline passed; last seen: %s: %w (%w)",
				kind, name, last, ErrTimeout, ctx.Err())
		}
		return fmt.Errorf("%s %s: waiting for it was cancelled; last seen: %s: %w", kind, name, last, ctx.Err())
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
		hint := ""
		if kind == "SandboxClaim" && last.untouched() {
			hint = " - nothing wrote its status: is the agent-sandbox controller running, and watching this namespace?"
		}
		return fmt.Errorf("%s %s not ready within SandboxReadyTimeout (%s); last seen: %s%s: %w",
			kind, name, s.opts.SandboxReadyTimeout, last, hint, ErrTimeout)
	}
	return err
}

// Status is the Sandbox's state as the API server reports it.
type Status struct {
	// Ready is the Sandbox's Ready condition (False while suspended).
	Ready   bool
	Reason  string
	Message string
	// OperatingMode is spec.operatingMode ("Running" or "Suspended"; empty means Running).
	OperatingMode string
	// Suspended is the Suspended condition: True once the Pod is gone.
	Suspended bool
	PodName   string
	PodIP     string
	// Hibernated (ours): the Sandbox is gone and its SandboxArchive keeps it (the lifecycle component's deep
	// hibernation); Suspended is true, OperatingMode "Suspended", Reason "SandboxHibernated", and Message
	// says how it is restored (this SDK does not restore archives).
	Hibernated bool
	// FromClaim: these credentials may not read Sandboxes (a role granting claims only), so this is the
	// claim's status, which mirrors the Sandbox's Ready condition and pod IPs; OperatingMode and Suspended
	// are not known then (empty and false).
	FromClaim bool
}

// Status reads the bound Sandbox, or its claim's status when the credentials may not read Sandboxes
// (Status.FromClaim). A Sandbox that is gone is ErrSandboxDeleted, unless it is hibernated: then its
// SandboxArchive is read and the Status says Hibernated (Suspended, reason SandboxHibernated, how it is
// restored), or, expired while hibernated, the *ConditionError SandboxExpired (also ErrSandboxDeleted) Resume
// gives. Until December 6 a hibernated Sandbox's Status said only "sandbox was deleted".
func (s *Sandbox) Status(ctx context.Context) (*Status, error) {
	name, err := s.boundName()
	if err != nil {
		return nil, s.wrap(err)
	}
	obj, err := s.k8s.sandboxes(s.opts.Namespace).Get(ctx, name, getOpts)
	switch {
	case apierrors.IsForbidden(err):
		st, cerr := s.claimStatus(ctx, name)
		if cerr != nil {
			return nil, s.wrap(cerr)
		}
		return st, nil
	case isNotFound(err):
		if archived, expired := s.hibernation(ctx, name); archived {
			if expired != nil {
				return nil, s.wrap(expired)
			}
			return hibernatedStatus(s.hibernatedText(name)), nil
		}
		return nil, s.wrap(fmt.Errorf("Sandbox %s: %w", name, ErrSandboxDeleted))
	case err != nil:
		return nil, s.wrap(err)
	}
	return statusOf(obj), nil
}

// claimStatus is Status from the claim, for claims-only credentials (as waitClaimReady waits on it).
func (s *Sandbox) claimStatus(ctx context.Context, sandboxName string) (*Status, error) {
	claim, err := s.boundClaim(ctx, sandboxName)
	if err != nil {
		return nil, err
	}
	if c := findCondition(conditionsOf(claim), "Ready"); c != nil && c.Status == "False" && c.Reason == reasonSandboxHibernated {
		st := hibernatedStatus(s.hibernatedText(sandboxName))
		st.FromClaim = true
		return st, nil
	}
	info := claimSandboxInfo(claim)
	st := &Status{PodName: info.podName, PodIP: info.podIP, FromClaim: true}
	if c := findCondition(conditionsOf(claim), "Ready"); c != nil {
		st.Ready, st.Reason, st.Message = c.Status == "True", c.Reason, c.Message
	}
	return st, nil
}

// hibernatedStatus is the Status of a hibernated Sandbox (gone, its SandboxArchive kept and restorable).
func hibernatedStatus(message string) *Status {
	return &Status{Reason: reasonSandboxHibernated, Message: message, OperatingMode: "Suspended", Suspended: true,
		Hibernated: true}
}

// boundClaim reads the handle's claim for credentials that may not read Sandboxes; ErrSandboxDeleted when
// it is gone or bound to another Sandbox than sandboxName now.
func (s *Sandbox) boundClaim(ctx context.Context, sandboxName string) (*unstructured.Unstructured, error) {
	claim, err := s.k8s.getClaim(ctx, s.opts.Namespace, s.ClaimName())
	if isNotFound(err) {
		return nil, fmt.Errorf("claim %s no longer exists: %w", s.ClaimName(), ErrSandboxDeleted)
	}
	if err != nil {
		return nil, err
	}
	bound := claimSandboxName(claim)
	if bound == "" {
		bound = claim.GetAnnotations()[hibernatedSandboxAnnotation] // status.sandbox may be dropped meanwhile
	}
	if bound != sandboxName {
		return nil, fmt.Errorf("claim %s is bound to Sandbox %q now, not %s: %w", s.ClaimName(), bound,
			sandboxName, ErrSandboxDeleted)
	}
	return claim, nil
}

func statusOf(obj *unstructured.Unstructured) *Status {
	info := readSandboxInfo(obj)
	st := &Status{OperatingMode: info.mode, PodName: info.podName, PodIP: info.podIP}
	conds := conditionsOf(obj)
	if c := findCondition(conds, "Ready"); c != nil {
		st.Ready, st.Reason, st.Message = c.Status == "True", c.Reason, c.Message
	}
	if c := findCondition(conds, "Suspended"); c != nil {
		st.Suspended = c.Status == "True"
	}
	return st
}

func (s *Sandbox) boundName() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandboxName == "" {
		return "", fmt.Errorf("%w: no Sandbox is bound (call Open)", ErrNotReady)
	}
	return s.sandboxName, nil
}

// Lifecycle annotations (ours, docs/lifecycle.md). A Sandbox without them behaves as upstream's.
const (
	// AutoResumeAnnotation "true" on a Sandbox, or on its SandboxTemplate (the Sandbox's own value wins), asks
	// a router running --sandbox-lifecycle to resume (or restore) it for a request. Both are needed.
	AutoResumeAnnotation = lifecyclePrefix + "auto-resume"
	// SuspendReasonAnnotation records who suspended a Sandbox last: Idle, Hibernate (the lifecycle
	// controller), Manual (Suspend, the CLI); SuspendedAtAnnotation when.
	SuspendReasonAnnotation = lifecyclePrefix + "suspend-reason"
	SuspendedAtAnnotation   = lifecyclePrefix + "suspended-at"
	// ResumeReasonAnnotation records who resumed a Sandbox last: Request (a lifecycle router), Manual
	// (Resume, the CLI), Other (the lifecycle controller, for a writer that recorded none);
	// ResumedAtAnnotation when.
	ResumeReasonAnnotation = lifecyclePrefix + "resume-reason"
	ResumedAtAnnotation    = lifecyclePrefix + "resumed-at"

	lifecyclePrefix = "lifecycle.agents.x-k8s.io/"
	// hibernateAnnotation "true" asks the lifecycle controller to hibernate the Sandbox; a resume cancels it.
	hibernateAnnotation = lifecyclePrefix + "hibernate"
	// templateRefAnnotation names the SandboxTemplate a Sandbox was made from (warm pools and claims set it).
	templateRefAnnotation = "agents.x-k8s.io/sandbox-template-ref"
)

// templatesGVR is read only for a suspended Sandbox's auto-resume setting (suspendedAdvice).
var templatesGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}

// operatingModePatch is the merge patch of spec.operatingMode with who and when (Manual), as the CLI and the
// Python SDK write it: the lifecycle controller and ModeChangedError read these records, and a resume
// cancels a pending hibernation (hibernate removed). Until December 6 this SDK wrote the mode alone: a
// suspend left an earlier suspend-reason: Idle in place, and a resume left a pending hibernate: "true", so
// the lifecycle controller suspended and archived the Sandbox again right after it was resumed.
func operatingModePatch(mode string, now time.Time) []byte {
	stamp := now.UTC().Format(time.RFC3339Nano)
	annotations := map[string]any{SuspendReasonAnnotation: "Manual", SuspendedAtAnnotation: stamp}
	if mode == "Running" {
		annotations = map[string]any{ResumeReasonAnnotation: "Manual", ResumedAtAnnotation: stamp, hibernateAnnotation: nil}
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": annotations},
		"spec":     map[string]any{"operatingMode": mode},
	})
	return patch
}

// setMode writes spec.operatingMode (operatingModePatch); the Sandbox as that write left it.
func (s *Sandbox) setMode(ctx context.Context, name, mode string) (*unstructured.Unstructured, error) {
	obj, err := s.k8s.sandboxes(s.opts.Namespace).Patch(ctx, name, types.MergePatchType,
		operatingModePatch(mode, time.Now()), metav1.PatchOptions{})
	if isNotFound(err) {
		return nil, fmt.Errorf("Sandbox %s: %w", name, ErrSandboxDeleted)
	}
	return obj, err
}

// waitMode waits (SandboxReadyTimeout) until reached: the controller confirms mode, written by ours (the
// Sandbox setMode returned), in a condition observed at ours' generation or later, so that a stale one is
// never taken for the answer (until December 6 any Suspended=True was). It ends at once, checked in this
// order, when the Sandbox will never get there: deleted or being deleted (ErrSandboxDeleted), expired (a
// *ConditionError SandboxExpired), or set to the other mode by a later write (*ModeChangedError); a later
// write that keeps the mode is waited through. Until December 6 each of these waited out the timeout and
// ended with ErrTimeout - among them a Suspend of an auto-resume Sandbox still in use, which a lifecycle
// router resumes within a second. The Python SDK's set_operating_mode.
func (s *Sandbox) waitMode(ctx context.Context, name, mode string, ours *unstructured.Unstructured,
	reached func(obj *unstructured.Unstructured, generation int64) bool) error {
	wctx, cancel := context.WithTimeoutCause(ctx, s.opts.SandboxReadyTimeout, errReadyTimeout)
	defer cancel()
	generation := ours.GetGeneration()
	var last lastSeen
	err := s.k8s.observe(wctx, sandboxesGVR, s.opts.Namespace, name, func(obj *unstructured.Unstructured) (bool, error) {
		last.set("Sandbox", obj)
		if reached(obj, generation) {
			return true, nil
		}
		if err := s.modeFinal(obj, generation, mode); err != nil {
			return false, err
		}
		return false, s.overtaken(obj, ours, mode)
	})
	if err != nil {
		return s.waitError(wctx, err, "Sandbox", name, &last)
	}
	return nil
}

// confirmed reports a condition typ that is True and was observed at generation or later.
func confirmed(obj *unstructured.Unstructured, typ string, generation int64) bool {
	c := findCondition(conditionsOf(obj), typ)
	return c != nil && c.Status == "True" && c.ObservedGeneration >= generation
}

// modeFinal is why the Sandbox will never be in mode, or nil: it is being deleted (ErrSandboxDeleted), or it
// has expired - its spec.shutdownTime passed, or its Ready condition says SandboxExpired for this generation
// (a *ConditionError SandboxExpired): its controller only tears it down.
func (s *Sandbox) modeFinal(obj *unstructured.Unstructured, generation int64, mode string) error {
	where := s.opts.Namespace + "/" + obj.GetName()
	if obj.GetDeletionTimestamp() != nil {
		return fmt.Errorf("Sandbox %s is being deleted: it will not be %s: %w", where, mode, ErrSandboxDeleted)
	}
	deadline, _, _ := unstructured.NestedString(obj.Object, "spec", "shutdownTime")
	at, perr := parseTime(deadline)
	passed := perr == nil && !time.Now().Before(at)
	ready := findCondition(conditionsOf(obj), "Ready")
	marked := ready != nil && ready.Reason == "SandboxExpired" && ready.ObservedGeneration >= generation
	if !passed && !marked {
		return nil
	}
	msg := fmt.Sprintf("it has expired (its shutdownTime %s passed): it will not be %s", deadline, mode)
	if ready != nil && ready.Reason == "SandboxExpired" && ready.Message != "" {
		msg += " (" + ready.Message + ")"
	}
	return &ConditionError{Kind: "Sandbox", Namespace: s.opts.Namespace, Name: obj.GetName(), Type: "Ready",
		Reason: "SandboxExpired", Message: msg}
}

// resumedBy and suspendedBy say who set spec.operatingMode, by the reason it recorded (docs/lifecycle.md).
var (
	resumedBy = map[string]string{
		"Request": "a lifecycle router resumed it for a request - it asks for auto-resume (" + AutoResumeAnnotation +
			") and is still in use: suspend it once nothing uses it",
		"Manual": "it was resumed by hand (`agent-sandbox resume`, `agent-sandbox lifecycle resume`, an SDK's Resume)",
		"Other":  "the lifecycle controller saw it set Running by a writer that recorded no reason (kubectl?)",
	}
	suspendedBy = map[string]string{
		"Idle":      "the lifecycle controller suspended it as idle (its idle-timeout passed without activity)",
		"Hibernate": "the lifecycle controller suspended it to hibernate it",
		"Manual":    "it was suspended by hand (`agent-sandbox suspend`, `agent-sandbox lifecycle suspend`, an SDK's Suspend)",
	}
)

// overtaken is a *ModeChangedError when a write after ours (a later generation) set spec.operatingMode to
// another mode than ours: the controller will never confirm ours. Who did it is what its reason annotation
// says, when that annotation changed after our write (a stale one, from an earlier resume, is not cited).
func (s *Sandbox) overtaken(obj, ours *unstructured.Unstructured, mode string) error {
	now, _, _ := unstructured.NestedString(obj.Object, "spec", "operatingMode")
	if now == "" {
		now = "Running"
	}
	if obj.GetGeneration() <= ours.GetGeneration() || now == mode {
		return nil
	}
	reasonKey, atKey, by := SuspendReasonAnnotation, SuspendedAtAnnotation, suspendedBy
	if now == "Running" {
		reasonKey, atKey, by = ResumeReasonAnnotation, ResumedAtAnnotation, resumedBy
	}
	annotations, before := obj.GetAnnotations(), ours.GetAnnotations()
	reason, recorded := annotations[reasonKey]
	if reason == before[reasonKey] && annotations[atKey] == before[atKey] {
		reason, recorded = "", false
	}
	e := &ModeChangedError{Namespace: s.opts.Namespace, Name: obj.GetName(), Want: mode, OperatingMode: now,
		ChangedBy: reason}
	e.Message = fmt.Sprintf("Sandbox %s/%s was set back to %s before it was %s", e.Namespace, e.Name, now, mode)
	if !recorded {
		e.Message += ", by a writer that recorded no " + strings.TrimPrefix(reasonKey, lifecyclePrefix) + " (kubectl?)"
		return e
	}
	e.Message += ": " + reasonKey + ": " + reason
	if at := annotations[atKey]; at != "" {
		e.Message += " (" + strings.TrimPrefix(atKey, lifecyclePrefix) + " " + at + ")"
	}
	if why := by[reason]; why != "" {
		e.Message += ": " + why
	}
	return e
}

// suspendedText says that a suspended Sandbox (obj) is suspended, and what to do about it.
func (s *Sandbox) suspendedText(ctx context.Context, obj *unstructured.Unstructured) string {
	return fmt.Sprintf("Sandbox %s/%s is suspended (spec.operatingMode: Suspended): %s", s.opts.Namespace,
		obj.GetName(), s.suspendedAdvice(ctx, obj))
}

// suspendedAdvice says what to do about a suspended Sandbox, by its auto-resume setting (the Sandbox's own,
// else its template's, as the router reads it): resume on request takes both the Sandbox's opt-in and a
// router running --sandbox-lifecycle, and the missing one is named. Until December 6 the advice was always
// "or run the router with --sandbox-lifecycle to resume it on request", also through a router that runs
// it, where the missing piece was the annotation. The Python SDK's _suspended_advice.
func (s *Sandbox) suspendedAdvice(ctx context.Context, obj *unstructured.Unstructured) string {
	const advice = "call Resume (or `agent-sandbox resume`)"
	source, value, found := s.autoResumeSetting(ctx, obj)
	if !found {
		template := "its SandboxTemplate"
		if ref := obj.GetAnnotations()[templateRefAnnotation]; ref != "" {
			template += " " + s.opts.Namespace + "/" + ref
		}
		return fmt.Sprintf(`%s, or, for resume on request, annotate the Sandbox or %s with %s: "true" (served by `+
			`a router running --sandbox-lifecycle)`, advice, template, AutoResumeAnnotation)
	}
	// The router's rule (lifecycle_policy): "true" or "false" in any case, nothing else - not even with a
	// space around it; any other value it reports as a problem, and resume on request is off. The value is
	// quoted as it is, so a stray space or newline shows.
	switch strings.ToLower(value) {
	case "true":
		// Both causes: the SDK cannot tell a router without the flag from one that could not send this
		// request again (its body streamed or above 64 KiB); until December 7 only the first was named.
		return fmt.Sprintf(`%s; it asks to be resumed on request (%s: %q on %s), but this request did not go `+
			`through a router running --sandbox-lifecycle, or it reached the Sandbox's pod as it was suspended `+
			`and that router could not send it again (it may have run there): calling again then resumes the `+
			`Sandbox`, advice, AutoResumeAnnotation, value, source)
	case "false":
		return fmt.Sprintf(`%s; resume on request is off: %s: %q on %s ("true" turns it on, served by a router `+
			`running --sandbox-lifecycle)`, advice, AutoResumeAnnotation, value, source)
	}
	return fmt.Sprintf(`%s; resume on request is off: %s: %q on %s is not a valid value (want "true" or "false"; `+
		`the router reads any other value as "false"): set it to "true" for resume on request, served by a router `+
		`running --sandbox-lifecycle`, advice, AutoResumeAnnotation, value, source)
}

// autoResumeSetting is the auto-resume annotation that applies, as the router reads it - the Sandbox's own,
// else its SandboxTemplate's (one GET, on this failure path only) - and where it is set. found is false when
// neither sets it or the template cannot be read: best effort, so a role without get on sandboxtemplates
// (or a deleted template) gives the general advice, never another error.
func (s *Sandbox) autoResumeSetting(ctx context.Context, obj *unstructured.Unstructured) (source, value string, found bool) {
	annotations := obj.GetAnnotations()
	if v, ok := annotations[AutoResumeAnnotation]; ok {
		return "the Sandbox", v, true
	}
	ref := annotations[templateRefAnnotation]
	if ref == "" {
		return "", "", false
	}
	tpl, err := s.k8s.Dynamic.Resource(templatesGVR).Namespace(s.opts.Namespace).Get(ctx, ref, getOpts)
	if err != nil {
		return "", "", false
	}
	v, ok := tpl.GetAnnotations()[AutoResumeAnnotation]
	return "its SandboxTemplate " + s.opts.Namespace + "/" + ref, v, ok
}

// Suspend sets the Sandbox's spec.operatingMode to Suspended (the controller deletes the Pod and keeps the
// Sandbox, its volumes and Service), waits (SandboxReadyTimeout) until the Suspended condition is True, and
// then closes the transport. The claim stays; Resume brings the sandbox back. Until the suspend is confirmed
// the handle stays connected: a suspend that does not happen (ErrModeChanged, ErrTimeout, ...) leaves the
// started Processes and calls in flight alone, as the Python SDK's suspend() does (their streams break when
// the Pod goes). A one-shot call in flight while the Pod goes ends as the runtime answers it then (a command
// killed by the Pod's SIGTERM: ExitCode -15, nil error - as for any Pod deleted under a call); one still
// running when the suspend is confirmed is cut with the transport: ErrNotReady wrapping ErrTransportClosed.
func (s *Sandbox) Suspend(ctx context.Context) (err error) {
	ctx, span := s.tracing.start(ctx, "suspend")
	defer func() { endSpan(span, err) }()
	name, err := s.boundName()
	if err != nil {
		return s.wrap(err)
	}
	ours, err := s.setMode(ctx, name, "Suspended")
	if err != nil {
		return s.wrap(fmt.Errorf("suspend: %w", err))
	}
	// Until December 6 the transport was closed here, before the suspend was confirmed: one set back to
	// Running (a lifecycle router's auto-resume) still ended every started Process - the runtime kills a
	// command whose stream ends.
	err = s.waitMode(ctx, name, "Suspended", ours, func(obj *unstructured.Unstructured, generation int64) bool {
		return confirmed(obj, "Suspended", generation)
	})
	if err != nil {
		return s.wrap(fmt.Errorf("suspend: %w", err))
	}
	s.disconnect(ctx, "the sandbox was suspended by this handle (Suspend): call Resume", 0)
	s.mu.Lock()
	s.info.podIP, s.info.podName = "", ""
	s.mu.Unlock()
	return nil
}

// claimExpiry reports whether a SandboxClaim has expired, as the claim controller reckons it: past the
// earliest of spec.lifecycle.shutdownTime and Finished + ttlSecondsAfterFinished (at: that time, zero when
// the claim never expires). A Ready=False/ClaimExpired condition is not read: it lags behind a
// shutdownTime moved later, and the controllers, the CLI, routers and the Python SDK do not read it either
// (until December 6 it counted here on its own).
func claimExpiry(claim *unstructured.Unstructured, now time.Time) (expired bool, at time.Time) {
	var deadlines []time.Time
	if text, _, _ := unstructured.NestedString(claim.Object, "spec", "lifecycle", "shutdownTime"); text != "" {
		if t, err := parseTime(text); err == nil {
			deadlines = append(deadlines, t)
		}
	}
	if ttl, found, _ := unstructured.NestedFieldNoCopy(claim.Object, "spec", "lifecycle", "ttlSecondsAfterFinished"); found {
		seconds, ok := ttl.(int64)
		if f, isFloat := ttl.(float64); isFloat {
			seconds, ok = int64(f), true
		}
		raw, _, _ := unstructured.NestedSlice(claim.Object, "status", "conditions")
		for _, r := range raw {
			c, _ := r.(map[string]any)
			if ok && c["type"] == "Finished" && c["status"] == "True" {
				text, _ := c["lastTransitionTime"].(string)
				if t, err := parseTime(text); err == nil && t.Unix() > 0 {
					deadlines = append(deadlines, t.Add(time.Duration(seconds)*time.Second))
				}
			}
		}
	}
	for _, d := range deadlines {
		if at.IsZero() || d.Before(at) {
			at = d
		}
	}
	return !at.IsZero() && !now.Before(at), at
}

// refuseUnderExpiredClaim is ours: the handle's claim has expired, so its Sandbox - live or hibernated - is
// deleted at the expiry (the claim controller, the lifecycle controller) and never resumed or restored. A
// *ConditionError (ClaimExpired, also ErrClaimFailed) that is also ErrSandboxDeleted. A claim that cannot
// be read says nothing (the resume goes on, as before). Until December 6 Resume set such a Sandbox Running
// and waited for it.
func (s *Sandbox) refuseUnderExpiredClaim(ctx context.Context, sandboxName string) error {
	name := s.ClaimName()
	if name == "" {
		return nil
	}
	claim, err := s.k8s.getClaim(ctx, s.opts.Namespace, name)
	if err != nil {
		return nil
	}
	expired, at := claimExpiry(claim, time.Now())
	if !expired {
		return nil
	}
	when := "it expired at " + at.UTC().Format(time.RFC3339)
	ce := &ConditionError{Kind: "SandboxClaim", Namespace: s.opts.Namespace, Name: name, Type: "Ready",
		Reason: reasonClaimExpired, Message: fmt.Sprintf(
			"%s: its Sandbox %s (live or hibernated) is deleted at the claim's expiry and never resumed or restored",
			when, sandboxName)}
	return fmt.Errorf("%w: %w", ce, ErrSandboxDeleted)
}

// hibernation reads the SandboxArchive of a Sandbox that was not found: archived is false when there is
// none (or it cannot be read: no lifecycle component, no grant, as the Python SDK takes it); expired is the
// *ConditionError SandboxExpired (also ErrSandboxDeleted) of one that is never restored: marked expired-at,
// or its archived shutdownTime passed.
func (s *Sandbox) hibernation(ctx context.Context, sandboxName string) (archived bool, expired error) {
	archive, err := s.k8s.Dynamic.Resource(archivesGVR).Namespace(s.opts.Namespace).Get(ctx, sandboxName, getOpts)
	if err != nil {
		return false, nil
	}
	mark := archive.GetAnnotations()[ExpiredAtAnnotation]
	if mark == "" {
		text, _, _ := unstructured.NestedString(archive.Object, "spec", "sandbox", "spec", "shutdownTime")
		if t, perr := parseTime(text); perr == nil && !time.Now().Before(t) {
			mark = "its shutdownTime " + text + " passed"
		}
	} else {
		mark = "its SandboxArchive is marked " + ExpiredAtAnnotation + "=" + mark
	}
	if mark == "" {
		return true, nil
	}
	ce := &ConditionError{Kind: "Sandbox", Namespace: s.opts.Namespace, Name: sandboxName, Type: "Ready",
		Reason: "SandboxExpired", Message: "hibernated, and expired (" + mark + "): it is never restored"}
	return true, fmt.Errorf("%w: %w", ce, ErrSandboxDeleted)
}

// hibernatedText says how a hibernated (restorable) Sandbox comes back: this SDK does not restore it.
func (s *Sandbox) hibernatedText(sandboxName string) string {
	return fmt.Sprintf("Sandbox %s/%s is hibernated (its SandboxArchive exists): this SDK does not restore it; "+
		"`agent-sandbox lifecycle resume %s` or a lifecycle router request does", s.opts.Namespace, sandboxName,
		sandboxName)
}

// whyGone names a Sandbox that is gone because it is hibernated (its SandboxArchive exists): expired while
// hibernated (marked expired-at, or its archived shutdownTime passed: never restored; a *ConditionError
// SandboxExpired), or restorable by the CLI or the Python SDK, not by this SDK. Both are ErrSandboxDeleted,
// as the missing Sandbox was before; nil when there is no archive (or it cannot be read).
func (s *Sandbox) whyGone(ctx context.Context, sandboxName string) error {
	archived, expired := s.hibernation(ctx, sandboxName)
	switch {
	case !archived:
		return nil
	case expired != nil:
		return expired
	}
	return fmt.Errorf("%s: %w", s.hibernatedText(sandboxName), ErrSandboxDeleted)
}

// Resume sets spec.operatingMode back to Running, waits until the Sandbox is Ready again (a new Pod, same
// volumes) and reconnects the transport to it. A connected handle whose Sandbox was Running and Ready all
// along (the write found it so, on the Pod the handle reaches) keeps its transport, and the Processes
// started on it. Refused at once, before any write, when the handle's claim
// has expired (*ConditionError ClaimExpired, also ErrSandboxDeleted); a hibernated Sandbox (deleted, its
// SandboxArchive kept) is named so, expired or not (ErrSandboxDeleted).
//
// One at a time, as Open: a Resume while an Open or another Resume of the handle is in progress fails with
// ErrAlreadyOpen at once (it writes nothing). A Close during a Resume ends it - it fails with ErrNotReady
// ("closed during Resume") and connects nothing - and waits for it; a Resume during a Close waits for the
// Close (or ctx) and then finds the handle closed. Until December 6 a Resume connected a handle closed
// meanwhile (its claim deleted), and two Resumes each connected it, one transport leaking.
func (s *Sandbox) Resume(ctx context.Context) (err error) {
	ctx, span := s.tracing.start(ctx, "resume")
	defer func() { endSpan(span, err) }()
	s.mu.Lock()
	if err := s.awaitClose(ctx); err != nil {
		s.mu.Unlock()
		return s.wrap(fmt.Errorf("resume: %w", err))
	}
	if s.opening != nil {
		err := s.refuseRun()
		s.mu.Unlock()
		return s.wrap(fmt.Errorf("resume: %w", err))
	}
	ctx, run := s.startRun(ctx, "Resume", errClosedDuringResume)
	s.mu.Unlock()
	defer s.endRun(run)
	err = s.resume(ctx, run)
	if err != nil && s.wasCut(run) {
		// what failed is only how the cut showed (a cancelled write or wait)
		err = fmt.Errorf("resume: %w: %w (the Resume ended with: %v)", ErrNotReady, errClosedDuringResume, err)
	}
	return s.wrap(err)
}

// resume is Resume's work, as the Resume in progress run; its errors are not wrapped yet.
func (s *Sandbox) resume(ctx context.Context, run *openRun) error {
	name, err := s.boundName()
	if err != nil {
		return err
	}
	if err := s.refuseUnderExpiredClaim(ctx, name); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	ours, err := s.setMode(ctx, name, "Running")
	if err != nil {
		if errors.Is(err, ErrSandboxDeleted) {
			if why := s.whyGone(ctx, name); why != nil {
				err = why
			}
		}
		return fmt.Errorf("resume: %w", err)
	}
	if s.keepsConnection(ours) {
		return nil
	}
	s.disconnect(ctx, "the handle's Resume did not complete: call Resume (or Open) again", 0)
	var info sandboxInfo
	err = s.waitMode(ctx, name, "Running", ours, func(obj *unstructured.Unstructured, generation int64) bool {
		if !confirmed(obj, "Ready", generation) {
			return false
		}
		info = readSandboxInfo(obj)
		return info.podIP != ""
	})
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	conn, err := s.connect(ctx, name, info)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if !s.publishConn(run, conn, func() { s.info = info }) {
		return run.cause // a Close cut this Resume: it connects nothing
	}
	return nil
}

// keepsConnection says whether Resume has nothing to reconnect: ours (the Sandbox as Resume's write left it)
// is Ready at its own generation - it was Running already - on the Pod (name and IP) the handle is connected
// to, and that connection is alive; the handle's Sandbox details are refreshed from ours then. Until
// December 6 Resume always closed the transport and connected again, which ended every started Process of
// a handle whose Sandbox was running all along (the Python SDK's resume() leaves them alone).
func (s *Sandbox) keepsConnection(ours *unstructured.Unstructured) bool {
	if !confirmed(ours, "Ready", ours.GetGeneration()) {
		return false
	}
	info := readSandboxInfo(ours)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil || s.conn.dead() != nil || info.podIP == "" || info.podIP != s.info.podIP ||
		info.podName != s.info.podName {
		return false
	}
	s.info = info
	return true
}
