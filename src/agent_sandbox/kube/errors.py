"""The error hierarchy of the Kubernetes runtime, and the one place HTTP statuses become exceptions.

```
KubeError
├── ApiError(status, reason, message, details)       the API server answered with a failure Status
│   ├── BadRequest          400
│   ├── Unauthorized        401
│   ├── Forbidden           403
│   ├── NotFound            404
│   ├── Conflict            409 (optimistic-concurrency conflict)
│   │   └── AlreadyExists   409 with reason AlreadyExists
│   ├── Gone                410 (watch/list resourceVersion too old: relist)
│   ├── Invalid             422
│   ├── TooManyRequests     429
│   └── ServerError         5xx
├── TransportError                                       no (complete) answer from the server
│   └── Timeout
└── NotLeader                                            write refused locally: leadership not current
```

`AlreadyExists` derives from `Conflict` because both are HTTP 409 and many callers treat them alike; a
caller that cares tests `AlreadyExists` first. Usage mistakes (an unknown patch type, a namespaced kind
without a namespace) are `ValueError`/`TypeError`, deliberately outside `KubeError`, so a broad
`except KubeError` never hides a bug in the caller.

`error_from_status()` is the single mapping function; transports chain the original exception with
`raise ... from exc`. `is_namespace_terminating()` tells the one 403 that is not a permission problem.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

__all__ = [
    "NAMESPACE_TERMINATING_CAUSE",
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "NotFound",
    "NotLeader",
    "ServerError",
    "Timeout",
    "TooManyRequests",
    "TransportError",
    "Unauthorized",
    "error_from_status",
    "error_text",
    "ignore_already_exists",
    "ignore_not_found",
    "is_namespace_terminating",
    "may_have_applied",
]


class KubeError(Exception):
    """Root of every error raised by `agent_sandbox.kube`."""


class ApiError(KubeError):
    """The API server answered with a failure `meta/v1 Status`.

    Attributes:
        status: HTTP status code (the Status `code`).
        reason: machine-readable Status reason (`NotFound`, `AlreadyExists`, `Conflict`, ...), "" if absent.
        message: human-readable message from the server.
        details: the Status `details` object (name, group, kind, causes, retryAfterSeconds), {} if absent.
        retry_after: seconds from a `Retry-After` header or `details.retryAfterSeconds`, else None.
    """

    def __init__(
        self,
        status: int,
        reason: str = "",
        message: str = "",
        details: dict[str, Any] | None = None,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.details: dict[str, Any] = details or {}
        self.retry_after = retry_after


class BadRequest(ApiError):
    """HTTP 400: malformed request (bad selector, bad patch body, ...)."""


class Unauthorized(ApiError):
    """HTTP 401: credentials missing, expired or rejected."""


class Forbidden(ApiError):
    """HTTP 403: authenticated but not allowed (RBAC), or namespace terminating."""


class NotFound(ApiError):
    """HTTP 404: the object (or the namespace, or the resource type) does not exist."""


class Conflict(ApiError):
    """HTTP 409: the write lost an optimistic-concurrency race (stale resourceVersion / precondition)."""


class AlreadyExists(Conflict):
    """HTTP 409 with reason AlreadyExists: a create hit an existing name."""


class Gone(ApiError):
    """HTTP 410 (reason Expired/Gone): the requested resourceVersion was compacted; relist."""


class Invalid(ApiError):
    """HTTP 422: the object failed validation; `details['causes']` lists the fields."""


class TooManyRequests(ApiError):
    """HTTP 429: throttled by API Priority and Fairness or the server's inflight limit."""


class ServerError(ApiError):
    """HTTP 5xx: the server failed (internal error, timeout, unavailable)."""


class TransportError(KubeError):
    """The request did not get a complete HTTP answer (connection refused/reset, TLS failure, ...)."""


class Timeout(TransportError):
    """The request or stream read timed out on the client side."""


class NotLeader(KubeError):
    """A write was refused before it was sent: this process cannot prove it still holds the leader Lease.

    Raised by the manager's write gate (`ApiClient.set_write_gate`) once the last successful renewal is
    older than the renew deadline, or after leadership was lost or released, so a deposed leader (a
    frozen process resuming, a partitioned one) never writes after its successor may have started.
    """


def may_have_applied(exc: BaseException) -> bool:
    """Whether a failed write may still have been applied: its answer was lost, not a refusal.

    A timeout, a connection dropped after the request was sent, or a 5xx (the server failed, perhaps
    after committing) are ambiguous; a connection that was never made and every 4xx are not.
    """
    if isinstance(exc, TransportError):
        return not isinstance(exc.__cause__, aiohttp.ClientConnectorError)
    return isinstance(exc, ServerError)


NAMESPACE_TERMINATING_CAUSE = "NamespaceTerminating"
"""The Status cause of a create refused in a namespace being deleted (Go's `v1.NamespaceTerminatingCause`).

On the wire it is `details.causes[].reason`: Go's `StatusCause.Type` field serialises as `reason`."""


def is_namespace_terminating(exc: BaseException | None) -> bool:
    """Whether `exc` is a create refused because its namespace is being deleted.

    The NamespaceLifecycle admission plugin answers 403 Forbidden with a `NamespaceTerminating` cause
    ("unable to create new content in namespace <ns> because it is being terminated"). There is nothing
    to do about it: everything in the namespace is about to go. Kubernetes' ReplicaSet and Job controllers
    check it with `apierrors.HasStatusCause(err, v1.NamespaceTerminatingCause)` and treat the create as
    nothing to do: no error, no FailedCreate Event. Every other 403 (RBAC) is a real failure and stays one.
    """
    if not isinstance(exc, ApiError):
        return False
    causes = exc.details.get("causes")
    return isinstance(causes, list) and any(
        isinstance(cause, dict) and cause.get("reason") == NAMESPACE_TERMINATING_CAUSE for cause in causes
    )


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_from_status(
    http_status: int, body: bytes | dict[str, Any] | None = None, *, retry_after: float | None = None
) -> ApiError:
    """Map an HTTP failure (status code + raw or decoded body) to the most specific `ApiError`.

    Args:
        http_status: the HTTP status code (or a watch ERROR Status `code`).
        body: the response body; a `meta/v1 Status` when the server produced it, anything otherwise.
        retry_after: value of a `Retry-After` header, if any.

    Returns:
        The exception instance (not raised), so callers can `raise error_from_status(...) from exc`.
    """
    status_obj: dict[str, Any] = {}
    if isinstance(body, dict):
        status_obj = body
    elif body:
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            status_obj = decoded
        else:
            status_obj = {"message": body[:512].decode("utf-8", "replace")}
    code = int(status_obj.get("code") or http_status)
    reason = str(status_obj.get("reason") or "")
    message = str(status_obj.get("message") or "")
    details = status_obj.get("details") or {}
    if retry_after is None and isinstance(details, dict) and details.get("retryAfterSeconds"):
        retry_after = float(details["retryAfterSeconds"])
    if code == 409 and reason == "AlreadyExists":
        cls: type[ApiError] = AlreadyExists
    elif code == 500 and reason == "Expired":
        # Some list paths report an expired continue token as 500 reason Expired; treat as Gone.
        cls = Gone
    elif code >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(code, ApiError)
    return cls(code, reason, message, details if isinstance(details, dict) else {}, retry_after=retry_after)


def ignore_not_found(err: BaseException | None) -> BaseException | None:
    """Return None for a `NotFound` (or None), else the error unchanged (controller-runtime's IgnoreNotFound)."""
    return None if err is None or isinstance(err, NotFound) else err


def ignore_already_exists(err: BaseException | None) -> BaseException | None:
    """Return None for an `AlreadyExists` (or None), else the error unchanged."""
    return None if err is None or isinstance(err, AlreadyExists) else err


def error_text(exc: BaseException) -> str:
    """The server's message for API errors (what Go's StatusError prints), else the error itself: the text of
    a condition message or Event note about a failed write."""
    if isinstance(exc, ApiError) and exc.message:
        return exc.message
    return str(exc)
