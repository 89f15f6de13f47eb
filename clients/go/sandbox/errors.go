package sandbox

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error the SDK returns wraps one of them (or is an [*HTTPError] /
// [*ConditionError]) and carries a "sandbox[<namespace>/<claim>]:" prefix; test with errors.Is / errors.As.
var (
	// ErrNotReady: the handle is not connected - never opened, Disconnect, Close, or suspended by this
	// handle's Suspend (the message says which: call Open, or Resume) -, its transport died (see
	// ErrPortForwardDied), or the Sandbox is suspended or not Ready (found when a call could not reach it).
	ErrNotReady = errors.New("sandbox is not ready")
	// ErrTimeout: the sandbox, the Gateway or a tunnel did not become ready in time; a call's deadline passed
	// (also context.DeadlineExceeded); an attempt got no response headers within its limit (the message
	// names it: PerAttemptTimeout, or WithCommandTimeout + 10 s).
	ErrTimeout = errors.New("operation timed out")
	// ErrClaimFailed: the SandboxClaim was rejected by the API server, or its Ready condition carries a
	// terminal reason (then the error is also a *ConditionError).
	ErrClaimFailed = errors.New("claim failed")
	// ErrTemplateNotFound: the claim's Ready condition has reason TemplateNotFound (also ErrClaimFailed).
	ErrTemplateNotFound = errors.New("sandbox template not found")
	// ErrWarmPoolNotFound: a claim condition has reason WarmPoolNotFound (also ErrClaimFailed).
	ErrWarmPoolNotFound = errors.New("sandbox warm pool not found")
	// ErrPortForwardDied: the port-forward tunnel dropped; returned wrapped in ErrNotReady.
	ErrPortForwardDied = errors.New("port-forward connection lost")
	// ErrTransportClosed (ours): the handle closed its transport while the call was in flight - Close or
	// Disconnect after letting calls finish for at most half of CleanupTimeout, or Suspend / Resume (which
	// close it at once); returned wrapped in ErrNotReady, with why. Until December 6 such a call failed on
	// sandboxd with gRPC's untyped "the client connection is closing" (and Close did not wait for it there),
	// and an HTTP call (router, gateway, pod IP, Service) was not cut at all.
	ErrTransportClosed = errors.New("the handle closed its transport during the call")
	// ErrAlreadyOpen: Open on a connected sandbox, or an Open or Resume while another Open or Resume of the
	// same handle is in progress (the message says so; that call creates or writes nothing - until December 6
	// two Opens both created a claim, and one leaked; two Resumes both connected, one transport leaked).
	ErrAlreadyOpen = errors.New("sandbox is already open; call Close or Disconnect first")
	// ErrOrphanedClaim: a claim could not be deleted or verified; call Close to retry the deletion (a failed
	// Client.CreateSandbox returns no handle: the Client keeps it, and DeleteAll retries).
	ErrOrphanedClaim = errors.New("orphaned claim; call Close to retry deletion")
	// ErrRetriesExhausted: every attempt of a call failed; wraps the last error.
	ErrRetriesExhausted = errors.New("retries exhausted")
	// ErrSandboxDeleted: the claim or the Sandbox disappeared.
	ErrSandboxDeleted = errors.New("sandbox was deleted")
	// ErrGatewayDeleted: the Gateway was deleted during address discovery.
	ErrGatewayDeleted = errors.New("gateway was deleted during address discovery")
	// ErrResponseTooLarge: a response body exceeded its limit.
	ErrResponseTooLarge = errors.New("response exceeded the size limit")
	// ErrUnsupportedByRuntime: the operation needs a runtime feature the selected runtime lacks.
	ErrUnsupportedByRuntime = errors.New("operation not supported by this runtime")
	// ErrNoService: in-cluster-service connectivity but the Sandbox has no status.serviceFQDN.
	ErrNoService = errors.New("sandbox has no service (status.serviceFQDN is empty)")
	// ErrInvalidArgument: an option, path or argument failed validation before anything was sent.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrConnection: no response at all - the router, gateway or sandbox could not be reached (connection
	// refused or reset, a name that does not resolve, a connection closed before the answer); wraps the
	// transport error (e.g. a *net.OpError). Retried like a 5xx; wrapped in ErrRetriesExhausted after the
	// last attempt. The Python SDK's SandboxConnectionError.
	ErrConnection = errors.New("no response: could not connect")
	// ErrProcessClosed: Recv, Wait or Events (and the stdin, signal and resize calls) on a Process that
	// Process.Close ended before its exit event; Recv keeps returning it, not io.EOF.
	ErrProcessClosed = errors.New("process was closed (Process.Close) before it exited")
	// ErrNotADirectory: List of a path that is a file or does not exist, on either runtime (the legacy
	// runtime answers both with 404 "Path is not a directory"; the *HTTPError of a 404 stays reachable).
	ErrNotADirectory = errors.New("path is not a directory")
	// ErrModeChanged: Suspend or Resume was undone before the controller confirmed it - another writer set
	// spec.operatingMode back after this handle's write (a lifecycle router resuming an auto-resume Sandbox
	// for a request, the idle suspend, kubectl, another client). The error is also a *ModeChangedError.
	ErrModeChanged = errors.New("operating mode changed by another writer")
)

// Claim Ready reasons the SDK treats as terminal (spec 0.2, Python SDK 1.0.8); any other reason keeps the
// wait going. WarmPoolNotFound is terminal on any condition type, the others only on Ready=False.
var terminalReasons = map[string]bool{
	"TemplateNotFound":          true,
	"InvalidMetadata":           true,
	"EnvVarsInjectionRejected":  true,
	"VolumeClaimTemplatesError": true,
	"ClaimExpired":              true,
	"SandboxExpired":            true,
	"InvalidConfiguration":      true,
	"PodFailed":                 true,
	"PodSucceeded":              true,
}

const reasonWarmPoolNotFound = "WarmPoolNotFound"

// ConditionError reports a terminal condition on the SandboxClaim (or, once bound, on the Sandbox): the
// object, the condition type and its reason and message. It matches ErrClaimFailed, and also
// ErrTemplateNotFound / ErrWarmPoolNotFound for those reasons.
type ConditionError struct {
	Kind      string // "SandboxClaim" or "Sandbox"
	Namespace string
	Name      string
	Type      string // condition type, usually "Ready"
	Reason    string
	Message   string
}

func (e *ConditionError) Error() string {
	msg := fmt.Sprintf("%s %s/%s: %s condition reason %s", e.Kind, e.Namespace, e.Name, e.Type, e.Reason)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Is makes errors.Is(err, ErrClaimFailed) true for every ConditionError, and the reason-specific
// sentinels true for their reasons.
func (e *ConditionError) Is(target error) bool {
	switch target {
	case ErrClaimFailed:
		return true
	case ErrTemplateNotFound:
		return e.Reason == "TemplateNotFound"
	case ErrWarmPoolNotFound:
		return e.Reason == reasonWarmPoolNotFound
	}
	return false
}

// ModeChangedError is ErrModeChanged with its details: Suspend or Resume of Sandbox Namespace/Name, which
// wanted Want ("Suspended" or "Running"), was overtaken by a later write (a later metadata.generation) that
// set spec.operatingMode to OperatingMode. ChangedBy is the reason that writer recorded when it recorded one
// after this handle's write (lifecycle.agents.x-k8s.io/resume-reason: Request, Manual, Other;
// lifecycle.agents.x-k8s.io/suspend-reason: Idle, Hibernate, Manual), else "". The Python SDK's
// SandboxModeChangedError.
type ModeChangedError struct {
	Namespace     string
	Name          string
	Want          string
	OperatingMode string
	ChangedBy     string
	Message       string
}

func (e *ModeChangedError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrModeChanged) true.
func (e *ModeChangedError) Is(target error) bool { return target == ErrModeChanged }

// maxErrorBody is how much of an error response HTTPError keeps; Error() shows at most half of it.
const maxErrorBody = 512

// HTTPError is a non-2xx answer from the router or the runtime that was not retried (or was the last of
// the retries, then wrapped in ErrRetriesExhausted).
type HTTPError struct {
	StatusCode int
	// Body is the start of the response body (at most 512 bytes); sandboxd's {"code","message"} errors are
	// rendered "CODE: message", the router's {"detail"} and the legacy runtime's {"message"} as the text.
	Body string
	// Operation names the SDK call and wire request, e.g. "read (GET download/a.txt)".
	Operation string
}

func (e *HTTPError) Error() string {
	body := e.Body
	if len(body) > 256 {
		body = body[:256] + "... [truncated]"
	}
	return fmt.Sprintf("%s returned status %d: %s", e.Operation, e.StatusCode, body)
}

// invalidf returns an ErrInvalidArgument with a message naming what was wrong.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// wrapErr prefixes err with the sandbox identity ("sandbox[ns/claim]: ..."), once.
func wrapErr(namespace, claim string, err error) error {
	if err == nil {
		return nil
	}
	prefix := fmt.Sprintf("sandbox[%s/%s]", namespace, claim)
	if strings.HasPrefix(err.Error(), "sandbox[") {
		return err
	}
	return fmt.Errorf("%s: %w", prefix, err)
}
