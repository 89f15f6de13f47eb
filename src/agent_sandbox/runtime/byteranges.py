"""`Range` requests answered as sandboxd's Go server (`http.ServeContent`) answers them.

aiohttp's FileResponse serves the file (single ranges, conditional requests, HEAD, sendfile) but decides
ranges its own way: 416 to any request with more than one range (wrong by RFC 9110 §15.5.17 when the ranges
overlap the file), 416 to any range on an empty file (Go ignores one starting at 0: a 200), a 206 of the whole file for
`bytes=-0` (an empty suffix, unsatisfiable), and digits of any length (Go refuses a number past int64: 416).
So every `Range` is parsed here as Go's `http.parseRange` does (`range_plan`) and aiohttp is handed a
`Range` it answers as Go would: the one range that overlaps, written out; none, to send the whole file; or
one that starts at the end of the file, for its 416 with `Content-Range: bytes */<size>` - its own, so
preconditions (`If-*`) are still weighed first, as Go weighs them. Several ranges that overlap are one
`206 multipart/byteranges` answer (`send_ranges`); when they add up to more than the file the whole file is
sent instead (Go's guard against many overlapping ranges). A multi-range request that also carries a
precondition is served whole by aiohttp with its `Range` dropped, which the RFC allows and keeps the
precondition logic in one place.

Deliberate differences: an empty suffix (`bytes=-0`) is dropped as unsatisfiable, as RFC 9110 §14.1.2
has it; Go keeps it as a zero-length range and answers a 206 with the invalid `Content-Range: bytes 5-4/5`
(golang/go#81262). Any well-formed range of an empty file is ignored (200), where Go answers a suffix one
(`bytes=-5`) with a 206 `Content-Range: bytes 0--1/0`. A malformed `Range` is 416 with `Content-Range:
bytes */<size>` (aiohttp's), where Go's 416 carries none.
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

__all__ = ["ByteRange", "file_etag", "range_plan", "send_ranges", "stale_if_range"]

_CHUNK = 1 << 16
# What Go's strconv.ParseInt(s, 10, 64) takes and is not negative: ASCII digits only (str.isdigit() takes
# other scripts' digits) after an optional `+`, at most int64's largest.
_DIGITS = re.compile(r"\+?[0-9]+")
_INT64_MAX = (1 << 63) - 1
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


def _int(text: str) -> int:
    """A non-negative number as Go's ParseInt reads it (`_Invalid` otherwise, past int64 too)."""
    if not _DIGITS.fullmatch(text) or (value := int(text)) > _INT64_MAX:
        raise _Invalid(text)
    return value


def _parse(header: str, size: int) -> tuple[list[ByteRange], bool]:
    """Go's `parseRange`: the satisfiable ranges (those that begin past the end dropped), and whether one was
    dropped so ("no overlap": a 416 when none is left; an empty list alone, `bytes=` or `bytes=,`, is the whole
    file, as Go serves it); `_Invalid` for a malformed header."""
    if not header.startswith("bytes="):
        raise _Invalid(header)
    ranges: list[ByteRange] = []
    no_overlap = False
    for spec in header[len("bytes=") :].split(","):
        spec = spec.strip(" \t")
        if not spec:
            continue
        first, sep, last = spec.partition("-")
        if not sep:
            raise _Invalid(spec)
        first, last = first.strip(" \t"), last.strip(" \t")
        if not first:
            start = size - min(_int(last), size)
            if start < size:  # an empty suffix (`-0`) selects nothing: dropped (RFC 9110; Go keeps it)
                ranges.append(ByteRange(start, size - start))
            else:
                no_overlap = True
            continue
        start = _int(first)
        if start >= size:
            no_overlap = True
            continue
        if not last:
            ranges.append(ByteRange(start, size - start))
            continue
        end = _int(last)
        if end < start:
            raise _Invalid(spec)
        ranges.append(ByteRange(start, min(end, size - 1) - start + 1))
    return ranges, no_overlap


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


def range_plan(request: web.Request, size: int) -> list[ByteRange] | web.Request | None:
    """How to answer `request` for a file of `size` bytes as Go's ServeContent would: the ranges for a
    multipart answer, or a copy of the request for aiohttp to serve with its `Range` rewritten (the one range
    that overlaps; none, for the whole file; one starting at the end, for aiohttp's 416); None when the
    request has no `Range` aiohttp reads (no header, not GET or HEAD)."""
    header = request.headers.get(hdrs.RANGE)
    if header is None or request.method not in ("GET", "HEAD"):
        return None
    headers = CIMultiDict(request.headers)
    try:
        ranges, no_overlap = _parse(header, size)
    except _Invalid:  # Go: 416 "invalid range", an empty file too
        headers[hdrs.RANGE] = f"bytes={size}-"
        return request.clone(headers=headers)
    if not ranges:
        # Ours on an empty file: any well-formed range is ignored, a 200 (Go ignores those starting at 0 - for
        # clients that always send one - but answers a suffix with a malformed 206 `bytes 0--1/0`). No range
        # at all (`bytes=`): the whole file, as Go.
        if size == 0 or not no_overlap:
            del headers[hdrs.RANGE]
        else:  # none overlaps: 416 with the file's length
            headers[hdrs.RANGE] = f"bytes={size}-"
        return request.clone(headers=headers)
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
