"""Request and response bodies for the drivers (`_driver.py`): a response read up to a limit (`Body`), a
streamed body split into bounded lines (`Lines`), and an upload's chunks (`sync_body`, `async_body`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import IO

import httpx2

from ._steps import HttpRequest, HttpResponse, StreamHandle, Upload
from .exceptions import SandboxRequestError

__all__ = ["MAX_LINE_BYTES", "Body", "Lines", "async_body", "sync_body"]

#: Longest line `ReadLine` returns. A streamed line is one output chunk of a command or one watch event
#: (kilobytes); a sandbox that never ends a line must not make the client buffer without bound.
MAX_LINE_BYTES = 16 << 20


class Body:
    """A response body read up to a limit (`HttpRequest.max_response_bytes`)."""

    __slots__ = ("_data", "_limit", "over")

    def __init__(self, limit: int | None) -> None:
        self._data = bytearray()
        self._limit = limit
        self.over = False

    def add(self, chunk: bytes) -> bool:
        """Keep `chunk`; False once past the limit (stop reading)."""
        self._data += chunk
        if self._limit is not None and len(self._data) > self._limit:
            del self._data[self._limit :]
            self.over = True
            return False
        return True

    def response(self, resp: httpx2.Response, request: HttpRequest) -> HttpResponse:
        return HttpResponse(
            resp.status_code, dict(resp.headers), bytes(self._data), request.method, request.url, self.over
        )


class Lines:
    """Splits a streamed body into lines (`\n`, a trailing `\r` dropped), each at most `MAX_LINE_BYTES`."""

    __slots__ = ("_buf", "lines")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.lines: collections.deque[str] = collections.deque()

    def feed(self, chunk: bytes | None, handle: StreamHandle) -> None:
        """Add a chunk (None: the body ended; what is left is the last line)."""
        if chunk is None:
            if self._buf:
                self.lines.append(self._buf.rstrip(b"\r").decode("utf-8", "replace"))
                self._buf.clear()
            return
        self._buf += chunk
        while (end := self._buf.find(b"\n")) >= 0:
            self.lines.append(self._buf[:end].rstrip(b"\r").decode("utf-8", "replace"))
            del self._buf[: end + 1]
        if len(self._buf) > MAX_LINE_BYTES:
            raise SandboxRequestError(
                f"{handle.method} {handle.url}: a streamed line longer than {MAX_LINE_BYTES} bytes"
            )


def sync_body(upload: Upload) -> Iterator[bytes]:
    if upload.prefix:
        yield upload.prefix
    while chunk := upload.source.read(upload.chunk_size):
        yield bytes(chunk)
    if upload.suffix:
        yield upload.suffix


def _read_chunk(source: IO[bytes], size: int) -> bytes:
    return bytes(source.read(size) or b"")


class _ThreadReader:
    """Reads a blocking source on a daemon thread of its own, one chunk per `read()`.

    Not the loop's default executor (`asyncio.to_thread`): a read abandoned by a cancelled upload (a pipe
    nobody writes to) holds its thread until the source yields, and `asyncio.run` waits for every executor
    thread as it returns (Python 3.11: without a timeout), as does the interpreter at exit - the process hung.
    This thread is waited for by neither; an abandoned read goes on in the background until the source
    yields or the process exits, and its chunk is dropped.
    """

    def __init__(self, source: IO[bytes], size: int) -> None:
        self._source = source
        self._size = size
        self._loop = asyncio.get_running_loop()
        # One future per chunk asked for; None: no more reads (the upload ended or was abandoned).
        self._asks: queue.SimpleQueue[asyncio.Future[bytes] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def read(self) -> bytes:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="agent-sandbox-upload-read", daemon=True)
            self._thread.start()
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._asks.put(future)
        return await future

    def close(self) -> None:
        self._asks.put(None)

    def _run(self) -> None:
        while (future := self._asks.get()) is not None:
            try:
                chunk = _read_chunk(self._source, self._size)
            except Exception as exc:  # the caller's file object failed: raised by the upload
                self._deliver(future, None, exc)
                return
            self._deliver(future, chunk, None)
            if not chunk:
                return

    def _deliver(self, future: asyncio.Future[bytes], chunk: bytes | None, exc: Exception | None) -> None:
        def settle() -> None:
            if future.done():  # the upload was cancelled while the read blocked
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(chunk or b"")

        # The loop is closed when the read outlived the `asyncio.run` of the upload that asked for it.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(settle)


async def async_body(upload: Upload) -> AsyncIterator[bytes]:
    """`sync_body` without blocking the event loop: a caller's file object (a pipe, a socket, a network file
    system) is read on a thread, as upstream 1.0.8 does; until December 6 a pipe fed slowly stalled every
    other sandbox's calls on the loop for as long. The thread is the upload's own daemon thread
    (`_ThreadReader`), so that a cancelled upload blocked in a read never holds up `asyncio.run`'s return or
    the process's exit. In-memory bodies (`BytesIO`: bytes and str content over `STREAM_ABOVE`) never wait
    and are read inline."""
    if upload.prefix:
        yield upload.prefix
    if isinstance(upload.source, io.BytesIO):
        while chunk := _read_chunk(upload.source, upload.chunk_size):
            yield chunk
    else:
        reader = _ThreadReader(upload.source, upload.chunk_size)
        try:
            while chunk := await reader.read():
                yield chunk
        finally:
            reader.close()
    if upload.suffix:
        yield upload.suffix
