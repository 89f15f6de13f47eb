"""Request and response bodies for the drivers (`_driver.py`): a response read up to a limit (`Body`), a
streamed body split into bounded lines (`Lines`), and an upload's chunks (`sync_body`, `async_body`)."""

from __future__ import annotations

import asyncio
import collections
import io
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


async def async_body(upload: Upload) -> AsyncIterator[bytes]:
    """`sync_body` without blocking the event loop: a caller's file object (a pipe, a socket, a network file
    system) is read on a worker thread, as upstream 1.0.8 does; until December 6 a pipe fed slowly stalled
    every other sandbox's calls on the loop for as long. In-memory bodies (`BytesIO`: bytes and str content
    over `STREAM_ABOVE`) never wait and are read inline."""
    if upload.prefix:
        yield upload.prefix
    inline = isinstance(upload.source, io.BytesIO)
    while True:
        if inline:
            chunk = _read_chunk(upload.source, upload.chunk_size)
        else:
            chunk = await asyncio.to_thread(_read_chunk, upload.source, upload.chunk_size)
        if not chunk:
            break
        yield chunk
    if upload.suffix:
        yield upload.suffix
