"""httpx2's transport failures as the SDK's exceptions, saying where the request went and whether it was sent.

Both drivers raise these from their HTTP steps; `request_sent` is what a flow's rollback and retries go by.
"""

from __future__ import annotations

import httpx2

from ._steps import HttpRequest
from .exceptions import SandboxConnectionError, SandboxRequestError, SandboxRequestTimeoutError

__all__ = ["closed_client_error", "transport_error"]


def _absolute(url: str, err: httpx2.TransportError) -> str:
    """A Kubernetes API path with the server it was sent to: with several clusters (contexts, `$KUBECONFIG`),
    "connection refused" alone does not say which one (kubectl names it too)."""
    if url.startswith("/"):
        try:
            sent = err.request.url
        except RuntimeError:  # raised before a request was attached
            return url
        return f"{sent.scheme}://{sent.netloc.decode('ascii')}{url}"
    return url


def transport_error(
    request: HttpRequest, err: httpx2.TransportError, *, mid_body: bool = False
) -> SandboxRequestError:
    """httpx2 transport failures -> the SDK's tree; `request_sent` says whether a retry could repeat it.
    `mid_body`: the response head had arrived (a streamed body cut off)."""
    where = f"{request.method} {_absolute(request.url, err)}"
    if isinstance(err, httpx2.TimeoutException):
        sent = not isinstance(err, httpx2.ConnectTimeout | httpx2.PoolTimeout)
        out: SandboxRequestError = SandboxRequestTimeoutError(f"{where}: timed out ({type(err).__name__})")
    elif mid_body:
        sent = True
        out = SandboxConnectionError(
            f"{where}: the response was cut off ({type(err).__name__}: {err}) - the sandbox went away, or a "
            "router or proxy in between closed it (a router's --proxy-timeout is the longest silence it allows)"
        )
    else:
        sent = not isinstance(err, httpx2.ConnectError)
        out = SandboxConnectionError(f"{where}: no response ({type(err).__name__}: {err})")
    out.request_sent = sent
    return out


def closed_client_error(request: HttpRequest, err: RuntimeError) -> SandboxConnectionError:
    """httpx2's "Cannot send a request, as the client has been closed.": another thread's (or task's) `close()`
    closed the pooled client between this call's lookup of it and its send. A `SandboxConnectionError` (nothing
    was sent), which the flow's `CloseWatch` reports as the client-closed error; it was a bare RuntimeError
    until December 7."""
    out = SandboxConnectionError(f"{request.method} {request.url}: not sent: {err}")
    out.request_sent = False
    return out
