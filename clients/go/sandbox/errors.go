package sandbox

import (
	"context"
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
	// refused, a name that does not resolve), or the connection was lost after the request was sent (reset,
	// closed before the answer, or a download's body cut off); the error is a *ConnectionError, whose
	// RequestSent tells the two apart, and wraps the transport error (e.g. a *net.OpError). Retried like a
	// 5xx; wrapped in ErrRetriesExhausted after the last attempt. The Python SDK's SandboxConnectionError.
	// Until December 7 its text was "no response: could not connect" also when the request had been sent
	// and the command had run.
	ErrConnection = errors.New("no response")
	// ErrMayHaveRun (ours): a request that is not idempotent (a POST: Run, Start, the legacy runtime's
	// Write) was sent and failed without an answer that says what happened - a router's (or gateway's) 502
	// while its Sandbox exists and is not suspended (a runtime that died mid-command gives it too), or a
	// connection lost after sending (*ConnectionError with RequestSent). The command may have started, or
	// the write been (partly) done: check before calling again. The Python SDK's "may have run" note
	// (request_sent); until December 7 such a 502 read "Could not connect to the backend sandbox" and
	// nothing told it from a request never sent.
	ErrMayHaveRun = errors.New("the request was sent and may have been carried out")
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

// ConnectionError is ErrConnection with what is known of the request: whether it was sent. The Python SDK's
// SandboxConnectionError with its request_sent.
type ConnectionError struct {
	// Method is the request's HTTP method: a POST that was sent also matches ErrMayHaveRun.
	Method string
	// RequestSent is false only when the request certainly never left this client (the dial, name lookup or
	// TLS handshake failed): repeating it is then safe whatever the method. True: the connection was lost
	// after (part of) the request was written, so the sandbox may have acted on it.
	RequestSent bool
	// Cut: the response had begun and its body was cut off (a Read's download).
	Cut bool
	// Err is the transport error.
	Err error
}

func (e *ConnectionError) Error() string {
	switch {
	case e.Cut:
		return fmt.Sprintf("the download was cut off (%v) - the sandbox went away, or a router or proxy in "+
			"between closed it", e.Err)
	case !e.RequestSent:
		return fmt.Sprintf("%s: could not connect: %v", ErrConnection, e.Err)
	case !idempotent(e.Method):
		return fmt.Sprintf("%s: the connection was lost after the request was sent (%v) - it may have run: the "+
			"command may have started, or the write been (partly) done; check before calling again",
			ErrConnection, e.Err)
	}
	return fmt.Sprintf("%s: the connection was lost after the request was sent: %v", ErrConnection, e.Err)
}

func (e *ConnectionError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrConnection) true, and ErrMayHaveRun for a sent request that is not idempotent.
func (e *ConnectionError) Is(target error) bool {
	switch target {
	case ErrConnection:
		return true
	case ErrMayHaveRun:
		return e.RequestSent && !e.Cut && !idempotent(e.Method)
	}
	return false
}

// idempotent methods may be sent again without changing what a first delivery did (the Python SDK's
// IDEMPOTENT).
func idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "PUT", "DELETE":
		return true
	}
	return false
}

// mayHaveRunError is a POST's 502 (an *HTTPError, reachable with errors.As) with the note that the sandbox
// may have acted on it; it matches ErrMayHaveRun.
type mayHaveRunError struct {
	err      error
	attempts int
}

func (e *mayHaveRunError) Error() string {
	sent := "it was not retried"
	if e.attempts > 1 {
		sent = fmt.Sprintf("it was sent %d times", e.attempts)
	}
	return e.err.Error() + " - the request reached the router (or gateway), which may have passed it to the " +
		"sandbox before the failure: the command may have started, or the write been (partly) done; " + sent +
		" - check before calling again"
}

func (e *mayHaveRunError) Unwrap() []error { return []error{e.err, ErrMayHaveRun} }

// invalidf returns an ErrInvalidArgument with a message naming what was wrong.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// wrapErr prefixes err with the sandbox identity ("sandbox[ns/claim]: ..."), once.
func wrapErr(namespace, claim string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrTimeout) {
		// a deadline met in a Kubernetes API call (a create, Suspend's patch, Resume's read, Status) is the
		// documented ErrTimeout too, as in the calls' waits: until December 7 it was context.DeadlineExceeded
		// alone there, so a caller testing ErrTimeout saw it or not by which phase the deadline hit
		err = fmt.Errorf("%w (%w)", err, ErrTimeout)
	}
	prefix := fmt.Sprintf("sandbox[%s/%s]", namespace, claim)
	if strings.HasPrefix(err.Error(), "sandbox[") {
		return err
	}
	return fmt.Errorf("%s: %w", prefix, err)
}
