"""Header rewriting both ways (router spec §1.5) and the request head sent to the sandbox.

Owns: the request headers never forwarded (hop-by-hop, RFC 9110 §7.6.1, the ones the router rewrites,
and credentials), the response headers never copied back (hop-by-hop), and the request line and headers
written upstream: origin-form target, `Host` of the sandbox, `X-Forwarded-For/-Host/-Proto`, the upgrade
or chunked framing, and the request span's trace context in place of the client's.

Does not own: the response head, which `_exchange.Exchange.response_head` assembles as it arrives (with
`DROP_RESPONSE_HEADERS`) because its framing depends on the response and the client's HTTP version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httptools

from ._request import Request, trailer_allowed
from ._resolve import Target
from ._server import ClientConnection
from ._tracing import TRACE_HEADERS, span_context

__all__ = ["DROP_REQUEST_HEADERS", "DROP_RESPONSE_HEADERS", "declared_trailers", "last_chunk", "request_head"]

# Request headers never forwarded: hop-by-hop (RFC 9110 §7.6.1), the ones we rewrite, and credentials.
DROP_REQUEST_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"authorization",
        b"expect",
        b"x-forwarded-for",
        b"x-forwarded-host",
        b"x-forwarded-proto",
    }
)
DROP_RESPONSE_HEADERS = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)


def declared_trailers(values: Iterable[bytes]) -> bytes:
    """The `Trailer` line announcing the declared trailer fields that are relayed (`trailer_allowed`), or
    nothing. `Trailer` is hop-by-hop for the router (as in Go's ReverseProxy, which announces again what it
    relays): the fields it drops are not announced."""
    names = [
        name.strip()
        for value in values
        for name in value.split(b",")
        if name.strip() and trailer_allowed(name.strip().lower())
    ]
    return b"Trailer: " + b", ".join(names) + b"\r\n" if names else b""


def last_chunk(trailers: list[tuple[bytes, bytes]]) -> bytes:
    """The end of a chunked body: the last chunk, the trailer fields (`trailer_allowed` ones only), a blank line."""
    if not trailers:
        return b"0\r\n\r\n"
    return b"".join([b"0\r\n", *(b"%b: %b\r\n" % field for field in trailers), b"\r\n"])


def request_head(conn: ClientConnection, req: Request, target: Target, span: Any, propagator: Any) -> bytes:
    """The request line and headers sent to the sandbox (router spec §1.5)."""
    url = req.url
    if url[:1] != b"/":
        parsed = httptools.parse_url(url)
        url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
    parts = [req.method.encode("ascii"), b" ", url, b" HTTP/1.1\r\nHost: ", target.authority, b"\r\n"]
    tokens = req.connection_tokens
    upgrade = req.upgrade
    tracing = span is not None and propagator is not None
    for lname, name, value in req.headers:
        if lname in DROP_REQUEST_HEADERS or (tokens and lname in tokens):
            continue
        if upgrade and lname == b"origin":
            continue
        if tracing and lname in TRACE_HEADERS:
            continue
        parts += (name, b": ", value, b"\r\n")
    parts += (b"X-Forwarded-For: ", conn.client_ip.encode("ascii"), b"\r\n")
    if req.host:
        parts += (b"X-Forwarded-Host: ", req.host, b"\r\n")
    parts.append(
        b"X-Forwarded-Proto: https\r\n" if conn.scheme == "https" else b"X-Forwarded-Proto: http\r\n"
    )
    if upgrade:
        for lname, _, value in req.headers:
            if lname == b"upgrade":
                parts += (b"Connection: Upgrade\r\nUpgrade: ", value, b"\r\n")
                break
    elif req.chunked:
        parts.append(b"Transfer-Encoding: chunked\r\n")
        parts.append(declared_trailers(v for lname, _, v in req.headers if lname == b"trailer"))
    if tracing:
        carrier: dict[str, str] = {}
        propagator.inject(carrier, context=span_context(span))
        for field, text in carrier.items():
            parts += (field.encode("latin-1"), b": ", text.encode("latin-1"), b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)
