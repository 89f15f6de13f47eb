"""HTTP/1.1 request heads read off a client connection (`RequestReader`), with `httptools` (llhttp: strict
framing, so CL+TE smuggling, bare CR/LF and obs-fold are refused).

The parser's side of a connection: the request-level limits on heads and bodies (431, 413), refusals of what
cannot be forwarded faithfully (400, 501, 417), an upgrade offer that carries a body (declined), and a chunked
body's trailer fields, kept apart from the head's. What is done with a request once its head is read is
`_server.ClientConnection`'s (`_received`), and so is when a refusal is sent (`_refuse`).
"""

from __future__ import annotations

import logging
import re

import httptools

from ._connection import Connection, Limits
from ._request import Request, RequestBody, trailer_allowed

__all__ = ["RequestReader"]

log = logging.getLogger("agent_sandbox.router.server")

_LINE_KEEP = 8192
"""Bytes of an unfinished line kept across reads for the request-line check (`_request_line_without_version`)."""
_UNFRAMED_SLACK = 64 * 1024
_VERSION_AT_END = re.compile(rb" [A-Za-z]+/[0-9]\.[0-9]\Z")


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
        self._expect: bytes | None = None
        """The current head's first `Expect` value (Go's `Header.get`)."""
        self._trailer_bytes = 0
        self._unframed = 0
        """Bytes of a chunked body read since its last payload byte: chunk-size lines and the trailer
        section, which httptools buffers field by field (bounded as a head: a field that never ends)."""
        self._line_tail = b""
        """The end of the input's last, unfinished line while a head is read (`_request_line_without_version`)."""
        self._line_cut = False
        """`_line_tail` lost the line's start (longer than `_LINE_KEEP`)."""

    def _received(self, req: Request) -> None:
        """A request's head was read (its body may follow): serve it, or queue it (`ClientConnection`)."""
        raise NotImplementedError

    def _refuse(self, status: int, detail: str) -> None:
        """What was read cannot be served: answer `status` and close (`ClientConnection` first answers the
        requests read before it)."""
        self.fail(status, detail)

    def _feed(self, data: bytes) -> None:
        req = self._current
        if req is not None and req.chunked and req.body is not None and not req.body.done:
            # The earlier reads' bytes only: this one may be mostly payload (`on_body` resets the count), and
            # counted before parsing, one read of up to 256 KiB over a small `--max-request-header-bytes` was
            # refused 431 mid-upload. What httptools buffers stays bounded: the limit plus one read.
            if self._unframed > self.limits.max_header_bytes + _UNFRAMED_SLACK:
                self._refuse(431, "Request header fields too large.")
                return
            self._unframed += len(data)
        try:
            self._parser.feed_data(data)
            if self._request_line_without_version(data):
                self._refuse(400, "Malformed HTTP request.")
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
                self._refuse(431, "Request header fields too large.")
            elif isinstance(cause, _BodyTooLarge):
                self._refuse(413, "Request body too large.")
            elif isinstance(cause, _Malformed):
                self._refuse(400, "Malformed HTTP request.")
            elif isinstance(cause, _UnsupportedCoding):
                self._refuse(501, "Unsupported transfer encoding.")
            elif isinstance(cause, _ExpectationFailed):
                self._refuse(417, "Unsupported Expect header: only 100-continue is supported.")
            elif not self._failed:
                log.error("request parser callback failed", exc_info=cause)
                self._refuse(400, "Malformed HTTP request.")
        except httptools.HttpParserError:
            self._refuse(400, "Malformed HTTP request.")

    def _request_line_without_version(self, data: bytes) -> bool:
        """A read that ends a request line without a version (HTTP/0.9: `GET /x` and a line end): refused at
        once, as Go's server does. llhttp takes such a line and then reads header lines, so the check in
        `on_headers_complete` saw it only once a blank line came: a client that sent the line alone got a 408
        after `--read-header-timeout` (until December 7). Only a line that ends a read with no header read
        yet is looked at: then it is the request line or the first header line (which httptools reports
        only when the next line starts), told apart by a space before any colon (field names have none)."""
        if not self._in_head:
            self._line_tail, self._line_cut = b"", False
            return False
        nl = data.rfind(b"\n")
        req = self._current
        if nl == len(data) - 1 and req is not None and not req.headers:
            start = data.rfind(b"\n", 0, nl)
            line = data[start + 1 : nl] if start >= 0 else self._line_tail + data[:nl]
            cut = self._line_cut and start < 0
            line = line.removesuffix(b"\r")
            space, colon = line.find(b" "), line.find(b":")
            if not cut and space >= 0 and not 0 <= colon < space and not _VERSION_AT_END.search(line):
                return True
        if nl >= 0:
            self._line_tail, self._line_cut = data[nl + 1 :][-_LINE_KEEP:], len(data) - nl - 1 > _LINE_KEEP
        else:
            tail = self._line_tail + data
            self._line_tail, self._line_cut = tail[-_LINE_KEEP:], self._line_cut or len(tail) > _LINE_KEEP
        return False

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
        self._expect = None
        self._trailer_bytes = 0

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
        if not self._in_head:
            self._on_trailer(req, lname, name, value)
            return
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
        elif lname == b"expect" and self._expect is None:
            self._expect = value
        elif lname == b"connection":
            req.connection_tokens += tuple(t.strip().lower() for t in value.split(b",") if t.strip())

    def _on_trailer(self, req: Request, lname: bytes, name: bytes, value: bytes) -> None:
        """A field of a chunked body's trailer section (httptools reports them as headers). Never part of the
        head: until December 7 a trailer read in the same packet as the head was taken for a header, so a
        trailing `X-Sandbox-Namespace`, `X-Sandbox-Pod-IP`, `Host` or `Authorization` changed where the
        request went or how it was checked (and one in a later packet was dropped). Relayed as a trailer
        (`_exchange`), as Go's ReverseProxy does, but for framing, hop-by-hop and the fields the router reads
        or writes itself (`trailer_allowed`); bounded as a head is (431)."""
        self._trailer_bytes += len(name) + len(value) + 4
        if self._trailer_bytes > self.limits.max_header_bytes:
            raise _TooLarge
        if trailer_allowed(lname):
            req.trailers.append((name, value))

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
        if self._expect is not None:
            tokens = {t.strip().lower() for t in self._expect.split(b",")}
            if b"100-continue" in tokens:
                req.expect_continue = req.version == "1.1"  # no 100 to an HTTP/1.0 client (RFC 9110 §10.1.1)
            elif self._expect:
                # As Go's server: an expectation the router cannot meet is refused at once (RFC 9110 §10.1.1).
                # Until December 7 it was dropped and the request forwarded: the client waited for the
                # expectation's answer, the sandbox for the body, until the sandbox's 408 after 60 s.
                raise _ExpectationFailed
        req.keep_alive = parser.should_keep_alive()
        req.upgrade = parser.should_upgrade()
        if req.upgrade and (req.chunked or req.content_length):
            # The parser will skip this body (_parse_body_after_head): the offer is declined.
            req.upgrade = False
            self._body_skipped = req
        req.body = RequestBody(self, req.content_length if not req.chunked else None)
        self._unframed = 0
        self._received(req)

    def on_body(self, body: bytes) -> None:
        self._unframed = 0
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


class _ExpectationFailed(Exception):
    pass
