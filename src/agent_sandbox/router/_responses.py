"""Raw HTTP/1.1 responses the router writes itself: JSON errors, `/healthz`, and response heads.

Owns: the byte layout of router-generated responses (`{"detail": ...}` bodies with `Content-Type:
application/json`, router spec §1.6), the status-line cache, and the once-a-second `Date` value.
Does not own which error applies (the proxy decides) or upstream responses (copied by `_exchange`).
"""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus

import orjson

__all__ = ["HEALTHZ_BODY", "date_header", "json_response", "status_line"]

HEALTHZ_BODY = b'{"status":"ok"}'

_STATUS_LINES: dict[int, bytes] = {}
_date_cache: tuple[int, bytes] = (0, b"")


def status_line(status: int) -> bytes:
    """`HTTP/1.1 <code> <standard reason>\\r\\n` (Go writes the standard reason, not upstream's)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "status code " + str(status)  # Go's text for codes it does not know
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")
    return line


def date_header() -> bytes:
    """`Date: <IMF-fixdate>\\r\\n`, recomputed at most once per second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, b"Date: " + formatdate(now, usegmt=True).encode("ascii") + b"\r\n")
    return _date_cache[1]


def json_response(
    status: int,
    payload: dict[str, str] | bytes,
    *,
    keep_alive: bool,
    head_only: bool = False,
    extra_headers: bytes = b"",
) -> bytes:
    """A complete response with a JSON body (`{"detail": text}` for errors).

    Args:
        payload: a dict to encode, or an already-encoded JSON body.
        keep_alive: False adds `Connection: close` (the connection is closed after writing).
        head_only: HEAD request: headers (with the body's length) but no body.
        extra_headers: raw header lines (each ending in CRLF) to add.
    """
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    head = (
        status_line(status)
        + b"Content-Type: application/json\r\n"
        + date_header()
        + b"Content-Length: "
        + str(len(body)).encode("ascii")
        + b"\r\n"
        + extra_headers
        + (b"" if keep_alive else b"Connection: close\r\n")
        + b"\r\n"
    )
    return head if head_only else head + body
