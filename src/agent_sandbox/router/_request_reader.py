"""HTTP/1.1 request heads read off a client connection (`RequestReader`), with `httptools` (llhttp: strict
framing, so CL+TE smuggling, bare CR/LF and obs-fold are refused).

The parser's side of a connection: the request-level limits on heads and bodies (431, 413), refusals of what
cannot be forwarded faithfully (400, 501), and an upgrade offer that carries a body (declined). What is done
with a request once its head is read is `_server.ClientConnection`'s (`_received`).
"""

from __future__ import annotations

import logging

import httptools

from ._connection import Connection, Limits
from ._request import Request, RequestBody

__all__ = ["RequestReader"]

log = logging.getLogger("agent_sandbox.router.server")


class RequestReader(Connection):
    """Turns the bytes of a client connection into `Request`s (the `httptools` callbacks)."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self.upgrade_tail = b""
        self._parser = httptools.HttpRequestParser(self)
        self._priming = False
        """A fresh parser is being fed a stand-in request head (`_parse_body_after_head`): callbacks ignored."""
        self._body_skipped: Request | None = None
        """An upgrade offer with a body whose body the parser skipped (it hands over right after the head)."""
        self._current: Request | None = None
        self._head_bytes = 0
        self._in_head = False

    def _received(self, req: Request) -> None:
        """A request's head was read (its body may follow): serve it, or queue it (`ClientConnection`)."""
        raise NotImplementedError

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self._body_skipped is not None:
                self._parse_body_after_head(self._body_skipped, data[exc.args[0] :])
                return
            self.upgrade_tail += data[exc.args[0] :]
            if self.transport is not None:
                self.transport.pause_reading()
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _TooLarge):
                self.fail(431, "Request header fields too large.")
            elif isinstance(cause, _BodyTooLarge):
                self.fail(413, "Request body too large.")
            elif isinstance(cause, _Malformed):
                self.fail(400, "Malformed HTTP request.")
            elif isinstance(cause, _UnsupportedCoding):
                self.fail(501, "Unsupported transfer encoding.")
            elif not self._failed:
                log.error("request parser callback failed", exc_info=cause)
                self.fail(400, "Malformed HTTP request.")
        except httptools.HttpParserError:
            self.fail(400, "Malformed HTTP request.")

    def _parse_body_after_head(self, req: Request, rest: bytes) -> None:
        """An upgrade offer that carries a body (`curl --http2` POSTs, `Upgrade: h2c`): llhttp hands the
        connection over right after the head, so the body would be read as the new protocol and the request
        forwarded without it (the sandbox then waits for a body that never comes). The offer is declined
        instead, as a server may (RFC 9110 §7.8; `Upgrade` is hop-by-hop, so it is not forwarded): a fresh
        parser, primed with a stand-in head of the same framing, reads the body and what follows as HTTP/1.1.
        """
        self._body_skipped = None
        self._parser = httptools.HttpRequestParser(self)
        framing = (
            b"Transfer-Encoding: chunked"
            if req.chunked
            else b"Content-Length: %d" % (req.content_length or 0)
        )
        self._priming = True
        try:
            self._parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"\r\n\r\n")
        finally:
            self._priming = False
        if rest:
            self._feed(rest)

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        if self._priming:
            return
        self._current = Request()
        self._in_head = True
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        if self._priming:
            return
        req = self._current
        assert req is not None
        req.url += url
        if len(req.url) > self.limits.max_header_bytes:
            raise _TooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._priming:
            return
        req = self._current
        assert req is not None
        lname = name.lower()
        # Whitespace around a field value is not part of it (RFC 9110 §5.5; Go's textproto trims it): kept,
        # `Content-Length: 41 ` read as no length forwarded the head without its body, and the sandbox waited
        # 30 s for it (until December 6).
        value = value.strip(b" \t")
        req.headers.append((lname, name, value))
        if lname.startswith(b"x-sandbox-"):
            if lname in req.routing:
                req.duplicates.add(lname)
            else:
                req.routing[lname] = value
        elif lname == b"host":
            req.host = value
            req.host_lines += 1
        elif lname == b"authorization" and req.authorization is None:
            req.authorization = value  # the first, as upstream's Header.Get (the last won until December 6)
        elif lname == b"content-length":
            if not value.isdigit() or len(value) > 18:  # past 10^18 bytes: not a length anybody sends
                raise _Malformed
            req.content_length = int(value)
        elif lname == b"transfer-encoding":
            req.te_codings += tuple(t.strip().lower() for t in value.split(b",") if t.strip())
            req.chunked = req.te_codings[-1:] == (b"chunked",)
        elif lname == b"expect":
            req.expect_continue = value.lower() == b"100-continue"
        elif lname == b"connection":
            req.connection_tokens += tuple(t.strip().lower() for t in value.split(b",") if t.strip())

    def on_headers_complete(self) -> None:
        if self._priming:
            return
        req = self._current
        assert req is not None
        size = len(req.url) + sum(len(n) + len(v) + 4 for _, n, v in req.headers)
        if size > self.limits.max_header_bytes:
            raise _TooLarge
        self._in_head = False
        parser = self._parser
        req.method = parser.get_method().decode("ascii", "replace")
        req.version = parser.get_http_version()
        if req.version not in ("1.1", "1.0"):
            raise _Malformed  # HTTP/0.9 request lines (no version) carry no headers we could trust
        if req.host_lines > 1 or (req.version == "1.1" and not req.host_lines):
            raise _Malformed  # as Go's server: "missing required Host header", "too many Host headers"
        if req.te_codings and req.te_codings != (b"chunked",):
            # a coding before `chunked` (gzip, ...) would be dropped on the way: the sandbox would read
            # compressed bytes as the body (Go answers 501 too)
            raise _UnsupportedCoding
        req.keep_alive = parser.should_keep_alive()
        req.upgrade = parser.should_upgrade()
        if req.upgrade and (req.chunked or req.content_length):
            # The parser will skip this body (_parse_body_after_head): the offer is declined.
            req.upgrade = False
            self._body_skipped = req
        req.body = RequestBody(self, req.content_length if not req.chunked else None)
        self._received(req)

    def on_body(self, body: bytes) -> None:
        req = self._current
        if req is not None and req.body is not None:
            limit = self.limits.max_body_bytes
            if limit and req.body.received + len(body) > limit:
                raise _BodyTooLarge
            req.body.feed(body)

    def on_message_complete(self) -> None:
        req = self._current
        if req is not None and req is self._body_skipped:
            return  # the head only: its body follows the parser's hand-over
        if req is not None and req.body is not None:
            req.body.finish()
        self._current = None


class _TooLarge(Exception):
    pass


class _BodyTooLarge(Exception):
    pass


class _Malformed(Exception):
    pass


class _UnsupportedCoding(Exception):
    pass
