"""Requests for several byte ranges of a file: one `206 multipart/byteranges` answer, as sandboxd's Go server
(`http.ServeContent`) gives.

aiohttp's FileResponse, which serves everything else (single ranges, conditional requests, HEAD, sendfile),
answers `416 Range Not Satisfiable` to any request with more than one range - wrong by RFC 9110 §15.5.17 when
the ranges overlap the file (a server may ignore `Range` and send the whole file, but 416 says none of them
can be served). Go's rules, followed here: ranges are parsed as `http.parseRange` does; ranges that begin past
the end are dropped (416 only when none is left, left to aiohttp); when the ranges add up to more than the
file the whole file is sent instead (Go's guard against many overlapping ranges). A multi-range request that
also carries a precondition (`If-*`) is served whole by aiohttp with its `Range` dropped, which the RFC
allows and keeps the precondition logic in one place.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from dataclasses import dataclass
from email.utils import formatdate

from aiohttp import hdrs, web
from multidict import CIMultiDict

__all__ = ["ByteRange", "file_etag", "multi_range_plan", "send_ranges", "stale_if_range"]

_CHUNK = 1 << 16
_DIGITS = re.compile(
    r"[0-9]+"
)  # ASCII only: str.isdigit() takes other scripts' digits, Go's ParseInt does not
_PRECONDITIONS = (
    hdrs.IF_MATCH,
    hdrs.IF_NONE_MATCH,
    hdrs.IF_MODIFIED_SINCE,
    hdrs.IF_UNMODIFIED_SINCE,
    hdrs.IF_RANGE,
)


@dataclass(frozen=True, slots=True)
class ByteRange:
    start: int
    length: int


class _Invalid(ValueError):
    pass


def _parse(header: str, size: int) -> list[ByteRange]:
    """Go's `parseRange`: the satisfiable ranges (those that begin past the end dropped); `_Invalid` for a
    malformed header."""
    if not header.startswith("bytes="):
        raise _Invalid(header)
    ranges: list[ByteRange] = []
    for spec in header[len("bytes=") :].split(","):
        spec = spec.strip(" \t")
        if not spec:
            continue
        first, sep, last = spec.partition("-")
        if not sep:
            raise _Invalid(spec)
        first, last = first.strip(" \t"), last.strip(" \t")
        if not first:
            if not _DIGITS.fullmatch(last):
                raise _Invalid(spec)
            start = size - min(int(last), size)
            if start < size:
                ranges.append(ByteRange(start, size - start))
            continue
        if not _DIGITS.fullmatch(first):
            raise _Invalid(spec)
        start = int(first)
        if start >= size:
            continue  # no overlap
        if not last:
            ranges.append(ByteRange(start, size - start))
            continue
        if not _DIGITS.fullmatch(last) or int(last) < start:
            raise _Invalid(spec)
        ranges.append(ByteRange(start, min(int(last), size - 1) - start + 1))
    return ranges


def file_etag(st: os.stat_result) -> str:
    """The strong entity tag of a file's current content, as aiohttp's FileResponse writes it."""
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}"'


def stale_if_range(request: web.Request, st: os.stat_result) -> web.Request | None:
    """A copy of `request` without its `Range` when its `If-Range` entity tag does not name the file's
    current content, else None.

    RFC 9110 §13.1.5: a range is served only if the validator matches; a weak tag never does. aiohttp's
    FileResponse understands only the date form and served the range whatever the tag said: a client resuming
    a download of a file replaced meanwhile got the new file's tail after the old file's head, a file that
    never existed (until December 6). The date form is left to aiohttp, which compares it correctly.
    """
    value = request.headers.get(hdrs.IF_RANGE)
    if value is None or hdrs.RANGE not in request.headers:
        return None
    value = value.strip(" \t")
    if not value.startswith(('"', "W/")) or value == file_etag(st):
        return None
    headers = CIMultiDict(request.headers)
    del headers[hdrs.RANGE]
    del headers[hdrs.IF_RANGE]
    return request.clone(headers=headers)


def multi_range_plan(request: web.Request, size: int) -> list[ByteRange] | web.Request | None:
    """How to answer `request` for a file of `size` bytes when it asks for several ranges: the ranges for a
    multipart answer, or a copy of the request for aiohttp to serve (its `Range` reduced to the one range
    that overlaps, or dropped to send the whole file); None when aiohttp's own handling is right (no `Range`,
    one range, a header it refuses, or no range that overlaps: its 416)."""
    header = request.headers.get(hdrs.RANGE)
    if header is None or "," not in header or request.method not in ("GET", "HEAD"):
        return None
    try:
        ranges = _parse(header, size)
    except _Invalid:
        return None
    if not ranges:
        return None
    headers = CIMultiDict(request.headers)
    if len(ranges) == 1:
        only = ranges[0]
        headers[hdrs.RANGE] = f"bytes={only.start}-{only.start + only.length - 1}"
        return request.clone(headers=headers)
    if sum(r.length for r in ranges) <= size and not any(name in headers for name in _PRECONDITIONS):
        return ranges
    del headers[hdrs.RANGE]
    return request.clone(headers=headers)


async def send_ranges(
    request: web.Request, fd: int, ranges: list[ByteRange], headers: dict[str, str]
) -> web.StreamResponse:
    """`206 multipart/byteranges` with each range of the open file `fd` as a part (Go's layout: a part's
    headers are `Content-Range` and `Content-Type`), streamed; `Content-Length` is exact."""
    st = os.fstat(fd)
    size = st.st_size
    boundary = secrets.token_hex(16)
    content_type = headers.get(hdrs.CONTENT_TYPE, "application/octet-stream")
    heads = [
        (
            ("" if i == 0 else "\r\n")
            + f"--{boundary}\r\nContent-Range: bytes {r.start}-{r.start + r.length - 1}/{size}\r\n"
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode()
        for i, r in enumerate(ranges)
    ]
    tail = f"\r\n--{boundary}--\r\n".encode()
    length = sum(len(h) for h in heads) + sum(r.length for r in ranges) + len(tail)
    resp = web.StreamResponse(
        status=206,
        headers={
            **{k: v for k, v in headers.items() if k.lower() != "content-type"},
            hdrs.CONTENT_TYPE: f"multipart/byteranges; boundary={boundary}",
            hdrs.CONTENT_LENGTH: str(length),
            hdrs.ACCEPT_RANGES: "bytes",
            hdrs.LAST_MODIFIED: formatdate(st.st_mtime, usegmt=True),
            hdrs.ETAG: file_etag(st),
        },
    )
    await resp.prepare(request)
    if request.method == "HEAD":
        return resp
    loop = asyncio.get_running_loop()
    for head, r in zip(heads, ranges, strict=True):
        await resp.write(head)
        offset, left = r.start, r.length
        while left > 0:
            data = await loop.run_in_executor(None, os.pread, fd, min(_CHUNK, left), offset)
            if not data:  # the file shrank meanwhile: the declared length cannot be met
                raise ConnectionResetError("file changed while it was sent")
            await resp.write(data)
            offset += len(data)
            left -= len(data)
    await resp.write(tail)
    await resp.write_eof()
    return resp
