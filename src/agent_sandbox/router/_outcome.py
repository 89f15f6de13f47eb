"""What one proxied request ended as, and the replies the router writes itself to settle it.

Owns: the per-request `Outcome` record (status, namespace, Sandbox, bytes out, keep-alive, upgraded; read
by metrics, the access log and the connection's keep-alive decision), the router-generated replies on the
proxy port (JSON `{"detail": ...}` errors, router spec §1.6, and `/healthz`) with the keep-alive rule that
goes with them, and the detail texts of the 502/504 a failed dial or exchange answers with.

Does not own: the byte layout of those replies (`_responses`) or which error applies (`_proxy` and
`_exchange` decide). A failure after the response head was sent cannot be replied to: the caller closes
the client connection instead.
"""

from __future__ import annotations

from ._request import Request
from ._responses import HEALTHZ_BODY, json_response
from ._routing import Route
from ._server import ClientConnection

__all__ = ["Outcome", "connect_error", "healthz", "not_started_error", "reply", "timeout_error"]


def connect_error(route: Route) -> str:
    return f"Could not connect to the backend sandbox: {route.sandbox_id}"


def not_started_error(route: Route) -> str:
    """Ours: a draining runtime answered that it did not start the request (`X-Sandbox-Not-Started`), and no
    pod replaced it in time to send the request to (or its Sandbox does not resume on request)."""
    return f"The backend sandbox's runtime is shutting down and did not start the request: {route.sandbox_id}"


def timeout_error(route: Route, waited_for: str, seconds: float, proxy_timeout: float, knob: str) -> str:
    """The legacy router's 504 text, then which limit ran out: without it a command still running and a
    sandbox that is gone read alike. `knob` is the router flag that set `seconds` when the request did not
    say (`X-Sandbox-Timeout`)."""
    asked = route.timeout
    if asked is None:
        source = f"the router's {knob}; a client may ask for up to {proxy_timeout:g} s with X-Sandbox-Timeout"
        if knob == "--proxy-timeout":
            source = "the router's --proxy-timeout"
    elif asked > proxy_timeout:
        source = f"X-Sandbox-Timeout {asked:g} s, capped by the router's --proxy-timeout"
    else:
        source = "X-Sandbox-Timeout"
    return f"Timed out waiting for the backend sandbox: {route.sandbox_id} ({waited_for} {seconds:g} s: {source})"


class Outcome:
    """What one request ended as (read by metrics, access log and keep-alive)."""

    __slots__ = ("allowed", "bytes_out", "keep_alive", "namespace", "sandbox_id", "status", "upgraded")

    def __init__(self) -> None:
        self.allowed: bool | None = None
        """The authorization verdict, counted with the request (its namespace label known by then)."""
        self.status = 0
        self.namespace = ""
        self.sandbox_id = ""
        self.bytes_out = 0
        self.keep_alive = True
        self.upgraded = False


def reply(
    conn: ClientConnection,
    out: Outcome,
    status: int,
    detail: str,
    req: Request,
    extra: bytes = b"",
) -> None:
    """Answer `req` with a router-generated JSON error (`extra`: raw header lines, each ending in CRLF)."""
    body_left = req.body is not None and not req.body.done
    keep = out.keep_alive and not body_left and not req.upgrade and not conn.draining
    data = json_response(
        status, {"detail": detail}, keep_alive=keep, head_only=req.method == "HEAD", extra_headers=extra
    )
    conn.response_started = True
    conn.write(data)
    out.status = status
    out.keep_alive = keep
    # The body's length only, as upstream's access log counts (headers were counted until December 6).
    out.bytes_out += len(data) - data.index(b"\r\n\r\n") - 4


def healthz(conn: ClientConnection, req: Request, out: Outcome) -> None:
    """Answer `/healthz` on the proxy port."""
    keep = out.keep_alive and not conn.draining and (req.body is None or req.body.done)
    conn.response_started = True
    conn.write(json_response(200, HEALTHZ_BODY, keep_alive=keep, head_only=req.method == "HEAD"))
    out.keep_alive = keep
    # Probes are not counted or logged (router spec §1.14); status stays 0.
