"""The SDK's exceptions: upstream's tree (spec §3.10) plus a few more specific leaves.

```
SandboxError (RuntimeError)
├── SandboxNotReadyError             sandbox address not known yet (no pod IP)
├── SandboxNoServiceError            in-cluster-service mode without status.serviceFQDN
│                                    (alias SandboxServiceUnavailableError)
├── SandboxNotFoundError             claim/sandbox missing, deleted, replaced, terminating
│   └── SandboxDeletedError          (ours; also a SandboxRequestError) a call found its Sandbox gone
├── SnapshotNotFoundError            (GKE snapshot extension; kept for import compatibility)
├── SandboxTemplateNotFoundError     claim reason TemplateNotFound
├── SandboxWarmPoolNotFoundError     claim reason WarmPoolNotFound
├── SandboxClaimFailedError          terminal claim reason (InvalidMetadata, PodFailed, ...)
├── SandboxPortForwardError          kubectl tunnel crashed / router Service missing
├── SandboxMetadataError             claim deleted while waiting; claim missing fields
├── SandboxModeChangedError          (ours) suspend()/resume() undone by another writer before it took effect
├── SandboxTimeoutError              (also TimeoutError) a wait ran out: names the last condition
└── SandboxRequestError              an HTTP/gRPC call failed; .status_code, .response
    ├── SandboxConnectionError       no response at all (status_code None)
    │   └── SandboxClientClosedError (ours) the client's own close() cut the call
    └── SandboxRequestTimeoutError   (also TimeoutError) no response within the call's timeout
```

Usage mistakes stay outside the tree: `ValueError` (validation), `NotImplementedError` (a runtime that
cannot do an operation), `ImportError` (missing `grpc` extra). Errors raised while waiting for a claim
carry the claim condition's `reason` and `condition_message` when there is one.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SandboxClaimFailedError",
    "SandboxClientClosedError",
    "SandboxConnectionError",
    "SandboxDeletedError",
    "SandboxError",
    "SandboxMetadataError",
    "SandboxModeChangedError",
    "SandboxNoServiceError",
    "SandboxNotFoundError",
    "SandboxNotReadyError",
    "SandboxPortForwardError",
    "SandboxRequestError",
    "SandboxRequestTimeoutError",
    "SandboxServiceUnavailableError",
    "SandboxTemplateNotFoundError",
    "SandboxTimeoutError",
    "SandboxWarmPoolNotFoundError",
    "SnapshotNotFoundError",
]


class SandboxError(RuntimeError):
    """Base class of every error the SDK raises about a sandbox (not about the caller's arguments).

    `reason` / `condition_message`: the SandboxClaim `Ready` condition that explains the error, if any.
    """

    def __init__(self, message: str, *, reason: str | None = None, condition_message: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.condition_message = condition_message


class SandboxNotReadyError(SandboxError):
    """The sandbox cannot be reached yet (no pod IP published)."""


class SandboxNoServiceError(SandboxError):
    """`in-cluster-service` mode, but the Sandbox has no `status.serviceFQDN`."""


#: Deprecated upstream alias of `SandboxNoServiceError`.
SandboxServiceUnavailableError = SandboxNoServiceError


class SandboxNotFoundError(SandboxError):
    """The claim or sandbox does not exist, was deleted, replaced, or is terminating."""


class SnapshotNotFoundError(SandboxError):
    """A requested snapshot does not exist (upstream's GKE extension; never raised here)."""


class SandboxTemplateNotFoundError(SandboxError):
    """The claim reports `TemplateNotFound`: the warm pool names a template that does not exist."""


class SandboxWarmPoolNotFoundError(SandboxError):
    """The claim reports `WarmPoolNotFound`: `spec.warmPoolRef.name` names no warm pool."""


class SandboxClaimFailedError(SandboxError):
    """The claim reports a terminal `Ready=False` reason; it will not become Ready without user action."""


class SandboxPortForwardError(SandboxError):
    """The `kubectl port-forward` tunnel crashed, or the router Service does not exist."""


class SandboxMetadataError(SandboxError):
    """The claim was deleted while waiting for it, or lacks a field the SDK needs."""


class SandboxModeChangedError(SandboxError):
    """Ours: `suspend()` / `resume()` was undone before the controller confirmed it: another writer set the
    Sandbox's `spec.operatingMode` back (a lifecycle router resuming an auto-resume Sandbox for a request, the
    lifecycle controller suspending an idle one, a person). Raised as soon as the change is seen; until
    December 6 the wait ran out its whole timeout (`SandboxTimeoutError` "... reason NotSuspended").

    Attributes:
        operating_mode: the mode the other writer set (`Running` or `Suspended`).
        changed_by: the reason it recorded (`lifecycle.agents.x-k8s.io/resume-reason` or `suspend-reason`:
            `Request`, `Idle`, `Manual`, ...), or None when it recorded none.
    """

    def __init__(self, message: str, *, operating_mode: str, changed_by: str | None = None) -> None:
        super().__init__(message)
        self.operating_mode = operating_mode
        self.changed_by = changed_by


class SandboxTimeoutError(SandboxError, TimeoutError):
    """A wait ran out of time. Also a `TimeoutError`, as upstream raises the builtin."""


class SandboxRequestError(SandboxError):
    """An HTTP (or gRPC) call to the sandbox, router or Kubernetes API failed.

    Attributes:
        status_code: the HTTP status, or None when no response arrived.
        response: the response (`agent_sandbox_sdk.HttpResponse`), or None.
        request_sent: False only when the request certainly never reached the server (connect failure),
            i.e. when repeating it is safe whatever the method.
    """

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        response: Any = None,
        *,
        reason: str | None = None,
        condition_message: str | None = None,
    ) -> None:
        super().__init__(message, reason=reason, condition_message=condition_message)
        self.status_code = status_code
        self.response = response
        self.request_sent = True


class SandboxConnectionError(SandboxRequestError):
    """No response: connection refused/reset, DNS failure, TLS failure."""


class SandboxClientClosedError(SandboxConnectionError):
    """Ours: the call was in flight when the client's own `close()` (or the end of its `with` block) ran:
    "...: the connection was closed while the call was in flight (client closed)".

    A `SandboxConnectionError` for callers, but never retried and never waited out: a Kubernetes watch (the
    wait of `create_sandbox`) reconnected after it and an idempotent call was sent again, so a create in
    flight across `close()` completed afterwards and its claim - created after the cleanup ran - was left
    behind (until December 7). Now such a create fails with this error and deletes the claim it made."""


class SandboxRequestTimeoutError(SandboxRequestError, TimeoutError):
    """No (complete) response within the call's timeout - also a router's 504 saying the request's own
    `X-Sandbox-Timeout` (the call's timeout) ran out; never retried."""


class SandboxDeletedError(SandboxNotFoundError, SandboxRequestError):
    """Ours: a call to the sandbox failed (a router's 502, no answer from the pod) and its Sandbox no longer
    exists - deleted, or its claim expired - "... - the Sandbox <ns>/<name> no longer exists (...)".

    Both a `SandboxNotFoundError` (the tree's "claim/sandbox missing, deleted"; `except SandboxNotFoundError:
    recreate()` sees it) and a `SandboxRequestError`, as the same failure was until December 7 and is in
    upstream's SDK (its callers catch that), with the call's `status_code`, `response` and `request_sent`."""
