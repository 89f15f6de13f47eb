"""HTTP plumbing shared by the legacy and sandboxd REST apps: JSON bodies, raw path tails, error shapes."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import BodyPartReader, HttpVersion11, MultipartReader, StreamReader, hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import BadHttpMethod, ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestPayloadError

from agent_sandbox.api.lifecycle import HEADER_NOT_STARTED

from . import byteranges
from .paths import InvalidPath
from .processes import ShuttingDown

__all__ = [
    "ANY_PATH",
    "ERROR_SHAPE",
    "MULTIPART_FRAMING",
    "BodyTimeout",
    "ErrorShape",
    "JsonErrorAppRunner",
    "Refusal",
    "body_timeout_middleware",
    "declared_too_large",
    "error_middleware",
    "find_part",
    "json_error_app",
    "json_response",
    "media_type",
    "multipart_reader",
    "part_chunks",
    "part_filename",
    "path_tail",
    "refusing_expect",
    "root_named",
    "send_open_file",
]

_CHUNK = 1 << 16

log = logging.getLogger(__name__)

# (status, message) -> response body
ErrorShape = Callable[[int, str], dict[str, Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: A route's path parameter matching any character, a newline too (aiohttp's patterns are not DOTALL).
ANY_PATH = "{path:(?s:.*)}"

#: The app's error shape, for the answers aiohttp gives before any middleware runs (JsonErrorAppRunner).
ERROR_SHAPE: web.AppKey[ErrorShape] = web.AppKey("error_shape")


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


class _OpenFileResponse(web.FileResponse):
    """aiohttp's FileResponse (Range, Last-Modified/ETag, conditional requests, HEAD, sendfile) on a file
    this handler already opened and checked, reached through `/proc/self/fd/N`.

    The handler sends it while the descriptor is open; aiohttp prepares a returned response again, which
    for FileResponse would reopen the path, by then a closed (or reused) descriptor number.
    """

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self.prepared:
            return None
        return await super().prepare(request)


async def send_open_file(
    request: web.Request, fd: int, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """Stream the open regular file `fd` (closed afterwards) as application/octet-stream."""
    all_headers = {"Content-Type": "application/octet-stream", **(headers or {})}
    try:
        st = os.fstat(fd)
        request = byteranges.stale_if_range(request, st) or request
        plan = byteranges.range_plan(request, st.st_size)
        if isinstance(plan, list):
            return await byteranges.send_ranges(request, fd, plan, all_headers)
        if plan is not None:
            request = plan
        resp = _OpenFileResponse(f"/proc/self/fd/{fd}", headers=all_headers)
        await resp.prepare(request)
        return resp
    finally:
        os.close(fd)


def path_tail(request: web.Request, prefix: str) -> str:
    """The percent-decoded rest of the raw path after the route's `prefix` (so `%2F` counts as a separator).

    aiohttp routes on the decoded path, so the raw one may spell the prefix with escapes (`/%66iles/`) or,
    in an absolute-form request target (`DELETE http://host/files/x`), start with more than the path. The
    prefix is matched segment by segment, each raw segment decoded, in the URL's path (never the request
    target). A mismatch once made the tail "" - the root: a recursive delete emptied the sandbox (until
    December 7); one now raises InvalidPath (400), never names a path the request did not.

    Raises InvalidPath when the escapes do not decode to UTF-8 or the path does not start with `prefix`.
    """
    raw = request.rel_url.raw_path
    want = prefix.split("/")[:-1]  # "/v1/files/" -> ["", "v1", "files"]: the segments before the tail
    segments = raw.split("/")
    try:
        if len(segments) <= len(want) or [unquote(s, errors="strict") for s in segments[: len(want)]] != want:
            raise InvalidPath(f"request path does not start with {prefix}")
        return unquote("/".join(segments[len(want) :]), errors="strict")
    except UnicodeDecodeError:
        raise InvalidPath("path is not valid UTF-8 after percent-decoding") from None


def root_named(request: web.Request, user_path: str, names_root: Callable[[str], bool]) -> bool:
    """Whether the request names the root itself, by `path_tail`'s reading of the raw path (`user_path`)
    and by aiohttp's own decoding of the route's `path` alike: a delete empties the root only then.

    The second reading guards the delete that cannot be undone against a path read wrong (a route prefix
    spelled with escapes once read as "", the root: until December 7), and a symlink that resolves to the
    root is not the root named.
    """
    return names_root(user_path) and names_root(request.match_info.get("path", ""))


#: What a multipart upload may carry besides its file's bytes (boundaries, part headers with a name of up to
#: PATH_MAX percent-encoded, a small field or two) before its declared length alone refuses it: the file part
#: is less than the whole body, by an amount the head does not say.
MULTIPART_FRAMING = 1 << 20

#: An answer given instead of reading a request's body (a 413), or None to read it.
Refusal = Callable[[web.Request], web.StreamResponse | None]


def declared_too_large(request: web.Request, limit: int, *, whole_body: bool = False) -> int | None:
    """The body's declared length when it alone shows that the uploaded file cannot fit in `limit` bytes,
    or, with `whole_body` (a limit on the body as read, `--max-json-body-bytes`), that the body cannot.

    Exact for a raw body (it is the file); a multipart body gets MULTIPART_FRAMING on top unless `whole_body`
    (then the framing counts as the rest: aiohttp's `client_max_size` counts every byte). A body with a
    Content-Encoding is judged only as it is decoded: its length on the wire bounds nothing of what it decodes
    to (gzip of random bytes is longer than they are). A chunked body has no length: judged as it is read.
    Until December 7 every upload was judged only as written: one declared far over the limit got its
    `100 Continue` and up to the limit (1 GiB by default) was streamed to disk before the 413.
    """
    length = request.content_length
    if length is None:
        return None
    if request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower() not in ("", "identity"):
        return None
    allowance = MULTIPART_FRAMING if not whole_body and media_type(request) == "multipart/form-data" else 0
    return length if length > limit + allowance else None


def refusing_expect(refuse: Refusal) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
    """A route's `Expect` handler: `refuse(request)`'s answer when it has one, in place of `100 Continue`, so
    the client never sends a body that would only be thrown away; otherwise aiohttp's own handling.

    aiohttp runs it before the app's middlewares, so the answer is complete as `refuse` builds it.
    """

    async def expect(request: web.Request) -> web.StreamResponse | None:
        if (answer := refuse(request)) is not None:
            return answer
        # aiohttp's default expect handler (aiohttp.web_urldispatcher, private there), as it is.
        if request.version == HttpVersion11:
            value = request.headers.get(hdrs.EXPECT, "")
            if value.lower() != "100-continue":
                raise web.HTTPExpectationFailed(text=f"Unknown Expect: {value}")
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the interim answer is no start of the response
        return None

    return expect


class BodyTimeout(Exception):
    """No byte of a request body arrived for the idle timeout while its handler waited for one (HTTP 408).

    No OSError (so no TimeoutError) and no ValueError: the handlers' own error answers must not take it.
    """

    def __init__(self, timeout: float) -> None:
        super().__init__(f"request body not received: nothing arrived for {timeout:g}s")


def body_timeout_middleware(timeout: float) -> Middleware:
    """Fail a request body that stops arriving: after `timeout` seconds (`--http-idle-timeout`) without a
    byte while the body is not complete, the handler's next (or pending) read raises BodyTimeout, which
    `error_middleware` answers 408 and which an upload's atomic write cleans up after (its temporary file).

    Until December 7 a body that stalled (Content-Length 100, 3 bytes, silence) held its handler forever:
    its `.sandboxd-tmp-*` file and descriptor stayed, and the request counted as in flight, so
    `GET /v1/activity` said idle 0 and the sandbox was never suspended. The limit is on silence only: a
    slow body that keeps arriving is read to its end.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if timeout <= 0 or not request.can_read_body:
            return await handler(request)
        watch = asyncio.create_task(_watch_body(request, timeout))
        try:
            return await handler(request)
        finally:
            watch.cancel()

    return middleware


async def _watch_body(request: web.Request, idle_limit: float) -> None:
    stream: StreamReader = request.content
    loop = asyncio.get_running_loop()
    step = min(1.0, idle_limit / 4)
    seen, since = stream.total_bytes, loop.time()
    while not stream.is_eof() and stream.exception() is None:
        await asyncio.sleep(step)
        transport = request.transport
        # Reading paused for backpressure (the handler is slow to take what came, a disk that stalls): the
        # silence is ours, not the client's.
        if stream.total_bytes != seen or (transport is not None and not transport.is_reading()):
            seen, since = stream.total_bytes, loop.time()
        elif loop.time() - since >= idle_limit and not stream.is_eof():
            stream.set_exception(BodyTimeout(idle_limit))
            return


def json_error_app(shape: ErrorShape, *, before: Sequence[Middleware] = (), **kwargs: Any) -> web.Application:
    """An aiohttp app whose every error is a JSON body of `shape`: its handlers' (`error_middleware`, after
    the `before` middlewares) and, run by `JsonErrorAppRunner`, what aiohttp's parser refuses (`ERROR_SHAPE`)."""
    app = web.Application(middlewares=[*before, error_middleware(shape)], **kwargs)
    app[ERROR_SHAPE] = shape
    return app


def error_middleware(shape: ErrorShape) -> Middleware:
    """Turn aiohttp's plain-text errors into the app's JSON error shape; log and 500 anything unexpected."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            message = exc.reason if exc.status in (404, 405) else (exc.text or exc.reason)
            if message and message.startswith(f"{exc.status}: "):
                message = message[len(f"{exc.status}: ") :]
            resp = json_response(shape(exc.status, message or exc.reason), exc.status)
            for name in ("Allow",):
                if name in exc.headers:
                    resp.headers[name] = exc.headers[name]
            return resp
        except RequestPayloadError as exc:
            # The body broke off as the handler read it: not what its Content-Encoding says (`gzip` that is no
            # gzip), a malformed chunk. The client's fault, found only now (an encoding aiohttp lacks, `br`, is
            # refused up front): a 400 naming it, not a 500 with two tracebacks (until December 6).
            text = _payload_error_text(exc)
            log.info("refused a request body from %s: %s", request.remote, text)
            resp = json_response(shape(400, text), 400)
            resp.force_close()  # the rest of the body cannot be read, so the connection cannot carry another
            # ...and aiohttp must not try to read it after this answer either: it would log the error again.
            request.content.feed_eof()
            return resp
        except BodyTimeout as exc:
            log.info("gave up on a request body from %s: %s", request.remote, exc)
            resp = json_response(shape(408, str(exc)), 408)
            resp.force_close()  # the rest of the body may still come: the connection cannot carry another
            # ...and aiohttp must not wait for it after this answer (its lingering read would raise the
            # error again): the body ends here, and bytes that come late are not read into it.
            if request.transport is not None:
                request.transport.pause_reading()
            request.content.feed_eof()
            return resp
        except ShuttingDown:
            # Nothing was run and this pod is going away: said so, explicitly (`HEADER_NOT_STARTED`), so a
            # lifecycle router sends the request whole to the pod that replaces this one. Until December 7 the
            # connection was closed unanswered instead, and a router could not tell that close from a runtime
            # killed while running the command: it sent both again, and such a command ran twice.
            resp = json_response(shape(503, "runtime is shutting down: the command was not started"), 503)
            resp.headers[HEADER_NOT_STARTED] = "shutting down"
            resp.headers[hdrs.RETRY_AFTER] = "1"
            resp.force_close()  # the pod is going away: this connection carries no other request
            return resp
        except (ConnectionResetError, TimeoutError):
            raise
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            return json_response(shape(500, "internal error"), 500)

    return middleware


class _JsonErrorHandler(web.RequestHandler):
    """aiohttp's connection protocol, answering what its parser refuses in the app's JSON error shape.

    A request aiohttp cannot parse (a line past the limit, a bad method, a malformed header) never reaches
    the app or its middleware: aiohttp answers it itself, in text/plain, and logs a traceback per request.
    """

    def __init__(self, manager: web.Server, *, error_shape: ErrorShape, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._error_shape = error_shape

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: too late for an answer, the connection is dropped
            raise ConnectionError(
                "Response is sent already, cannot send another response with the error message"
            )
        if status >= 500:
            log.error("error serving a request from %s", request.remote, exc_info=exc)
            text = HTTPStatus(status).phrase
        else:  # untrusted input, not our fault: one line, no traceback
            text = _parse_error_text(exc, message, status)
            log.info("refused an unparseable request from %s: %s", request.remote, text)
        resp = json_response(self._error_shape(status, text), status)
        resp.force_close()
        return resp


def _parse_error_text(exc: BaseException | None, message: str | None, status: int) -> str:
    if isinstance(exc, LineTooLong):  # its message repeats the line itself
        return f"request line or header field too long (limit: {exc.args[1]} bytes)"
    if isinstance(exc, BadHttpMethod):
        return "not an HTTP/1.x request (bad method)"
    if (text := _deflate_text(exc)) is not None:
        return text
    # aiohttp's messages point at the offending byte on a line of their own (`b'...'\n   ^`): one line here.
    text = " ".join((message or HTTPStatus(status).phrase).split()).removesuffix(" ^")
    return text if len(text) <= 300 else text[:300] + "..."


def _deflate_text(exc: BaseException | None) -> str | None:
    """aiohttp's whole text for a body that is no deflate is "deflate": said in full, as for gzip."""
    if isinstance(exc, ContentEncodingError) and exc.message == "deflate":
        return "Can not decode content-encoding: deflate"
    return None


def _payload_error_text(exc: RequestPayloadError) -> str:
    """One line saying what is wrong with a request body (aiohttp's cause, without its `400, message:`)."""
    cause = exc.__cause__
    if (deflate := _deflate_text(cause)) is not None:
        return deflate
    text = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
    text = " ".join(text.split()).removeprefix("400, message: ")
    return text if len(text) <= 300 else text[:300] + "..."


class _JsonErrorServer(web.Server):
    error_shape: ErrorShape

    def __call__(self) -> web.RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, error_shape=self.error_shape, **self._kwargs)


class JsonErrorAppRunner(web.AppRunner):
    """An AppRunner whose connections answer unparseable requests in the app's `ERROR_SHAPE`, not text/plain."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # aiohttp has no hook for its protocol-level answers; the server it built makes our handler instead.
        server.__class__ = _JsonErrorServer
        assert isinstance(server, _JsonErrorServer)
        server.error_shape = self.app[ERROR_SHAPE]
        return server


# What aiohttp's multipart parser raises on a malformed body (bad boundary, header bytes, encodings).
_MALFORMED = (HttpProcessingError, AssertionError, LookupError, ValueError, UnicodeError)


def _malformed_text(err: BaseException) -> str:
    """`invalid multipart body: <what>` in one line, never an exception's repr: a KeyError's `str` is its key
    quoted (`'Content-Type'`), an HttpProcessingError's `400, message:\n  ...` (both until December 6)."""
    if isinstance(err, HttpProcessingError):
        text = err.message
    elif isinstance(err, LookupError):
        text = f"missing {err.args[0]}" if err.args and isinstance(err.args[0], str) else ""
    else:
        text = str(err)
    text = " ".join(text.split())
    if not text:
        return "invalid multipart body"
    return f"invalid multipart body: {text if len(text) <= 300 else text[:300] + '...'}"


def media_type(request: web.Request) -> str:
    """The request's media type, lower-cased, without parameters ("" when absent).

    Not `request.content_type`: aiohttp parses that with the stdlib email parser, which raises IndexError
    on some malformed values (`;0*`) - a 500 instead of the answer a bad header deserves.
    """
    return request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


async def multipart_reader(request: web.Request) -> MultipartReader:
    """The request's multipart reader (ValueError when it is not multipart or has no boundary)."""
    try:
        return await request.multipart()
    except _MALFORMED as err:
        raise ValueError(_malformed_text(err)) from None


async def find_part(reader: MultipartReader, name: str) -> BodyPartReader | None:
    """The first part called `name` (others are skipped); ValueError on a malformed body."""
    try:
        while True:
            part = await reader.next()
            if part is None:
                return None
            if isinstance(part, BodyPartReader) and part.name == name:
                part.filename  # noqa: B018 - parse Content-Disposition now, inside the error translation
                return part
            await part.release()
    except _MALFORMED as err:
        raise ValueError(_malformed_text(err)) from None


# A quoted `filename` parameter (group 1: between the quotes, escapes kept).
_QUOTED_FILENAME = re.compile(r';\s*filename\s*=\s*"((?:[^"\\]|\\.)*)"', re.IGNORECASE)


def part_filename(part: BodyPartReader) -> str | None:
    """The part's file name as upstream's runtime (python-multipart) reads it.

    In a quoted name only `\\` and `\"` are escapes, any other backslash is itself: `requests` (upstream's
    SDK) sends `back\\slash.txt` as it is, which aiohttp's quoted-pair unescaping made `backslash.txt`.
    `filename*` (RFC 5987) is left to aiohttp.
    """
    header = part.headers.get(hdrs.CONTENT_DISPOSITION, "")
    if "filename*" not in header.lower() and (found := _QUOTED_FILENAME.search(header)):
        return found.group(1).replace("\\\\", "\\").replace('\\"', '"')
    return part.filename


async def part_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    """The part's bytes (ValueError on a malformed body, and on a body that ends before the part's boundary).

    aiohttp hands out what arrived and ends the part quietly when the body stops short of its boundary: a
    truncated upload was stored, replacing the file, and reported a success (until December 6). The error
    comes after the last chunk, before the caller's atomic write commits, which then keeps the old file.
    """
    try:
        while chunk := await part.read_chunk(_CHUNK):
            yield chunk
    except _MALFORMED as err:
        raise ValueError(_malformed_text(err)) from None
    if not part.at_eof():
        raise ValueError("invalid multipart body: it ends before the part's closing boundary")
