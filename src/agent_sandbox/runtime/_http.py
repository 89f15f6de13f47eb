"""HTTP plumbing shared by the legacy and sandboxd REST apps: JSON bodies, raw path tails, error shapes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.typedefs import Middleware

from .paths import InvalidPath

__all__ = ["ErrorShape", "error_middleware", "find_part", "json_response", "part_chunks", "path_tail"]

_CHUNK = 1 << 16

log = logging.getLogger(__name__)

# (status, message) -> response body
ErrorShape = Callable[[int, str], dict[str, Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def path_tail(request: web.Request, prefix: str) -> str:
    """The percent-decoded rest of the raw path after `prefix` (so `%2F` counts as a separator).

    Raises InvalidPath when the escapes do not decode to UTF-8.
    """
    raw = request.raw_path.split("?", 1)[0]
    tail = raw[len(prefix) :] if raw.startswith(prefix) else ""
    try:
        return unquote(tail, errors="strict")
    except UnicodeDecodeError:
        raise InvalidPath("path is not valid UTF-8 after percent-decoding") from None


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
        except (ConnectionResetError, TimeoutError):
            raise
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            return json_response(shape(500, "internal error"), 500)

    return middleware


async def find_part(reader: MultipartReader, name: str) -> BodyPartReader | None:
    """The first part called `name` (others are skipped); ValueError / AssertionError on a malformed body."""
    while True:
        part = await reader.next()
        if part is None:
            return None
        if isinstance(part, BodyPartReader) and part.name == name:
            return part
        await part.release()


async def part_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(_CHUNK):
        yield chunk
