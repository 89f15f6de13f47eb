"""sandboxd's REST API on :8080 (spec §2.2.1): files, health, metadata. Errors are `{"code", "message"}`."""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from . import files
from ._http import (
    ANY_PATH,
    body_timeout_middleware,
    declared_too_large,
    find_part,
    json_error_app,
    json_response,
    media_type,
    multipart_reader,
    part_chunks,
    path_tail,
    refusing_expect,
    root_named,
    send_open_file,
)
from .paths import InvalidPath, PathEscape
from .state import RuntimeState

__all__ = ["rest_app"]

_PREFIX = "/v1/files/"
_CHUNK = 1 << 16
# Go's strconv.ParseBool spellings
_BOOLS = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True}
_BOOLS |= {"0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False}
_CODES = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    408: "DEADLINE_EXCEEDED",  # a request body that stopped arriving (`--http-idle-timeout`)
    409: "CONFLICT",
    413: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {
        "code": _CODES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT"),
        "message": message,
    }


def _error(status: int, message: str) -> web.Response:
    return json_response(_error_body(status, message), status)


_NOT_FOUND = (404, "path does not exist within the sandbox")
_ESCAPE = (403, "path traversal outside sandbox root is forbidden")
_DENIED = (403, "permission denied")
#: A delete whose path reaches the root without naming it (a symlink to it): the root is emptied only when
#: the request names it ("", "/"), as spec §2.2.1 has it.
_ROOT_UNNAMED = "path resolves to the sandbox root without naming it; name the root itself to empty it"


def _os_failure(err: OSError) -> web.Response:
    """The sandboxd answer for an OS error of a file operation (confinement first: it is a PermissionError)."""
    if isinstance(err, PathEscape):
        return _error(*_ESCAPE)
    if isinstance(err, FileNotFoundError | NotADirectoryError):
        return _error(*_NOT_FOUND)
    if isinstance(err, files.NotEmpty):
        return _error(409, err.strerror or "directory is not empty; pass recursive=true to remove it")
    if isinstance(err, files.NotRegularFile):
        return _error(403, "not a regular file (a FIFO, socket or device is not read)")
    if isinstance(err, PermissionError):
        return _error(*_DENIED)
    if err.errno == errno.ENAMETOOLONG:
        return _error(400, "file name too long")
    if err.errno == errno.ELOOP:
        # The sandbox's own state (a link cycle), not the server's fault: a 500 until December 6.
        return _error(400, "too many levels of symbolic links")
    return _error(500, err.strerror or type(err).__name__)  # not str(err): it names the host's path


class _Rest:
    def __init__(self, state: RuntimeState) -> None:
        self.state = state

    def _target(self, request: web.Request) -> tuple[str, str]:
        user_path = path_tail(request, _PREFIX)
        return user_path, self.state.resolve_sandboxd(user_path)

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            user_path, target = self._target(request)
            st = os.stat(target)
            if stat.S_ISDIR(st.st_mode):
                return await self._listing(request, user_path, target)
            fd, _ = files.open_file(self.state.root, target)
        except InvalidPath as err:
            return _error(400, str(err))
        except OSError as err:
            return _os_failure(err)
        return await send_open_file(request, fd)

    async def _listing(self, request: web.Request, user_path: str, target: str) -> web.Response:
        entries = await files.list_directory(self.state.root, target)  # OSError: the caller's answer
        entries.sort(key=lambda e: e.name)
        path = user_path if user_path.startswith("/") else "/" + user_path
        return json_response({"path": path, "entries": [e.sandboxd() for e in entries]})

    def too_large(self, request: web.Request) -> web.Response | None:
        """413 before a byte of the body is read (and before `100 Continue`) when its declared length is over
        `--max-upload-bytes`; the connection closes after it (aiohttp reads and drops what still comes for a
        moment first, so the answer is not lost to a reset)."""
        limit = self.state.config.max_upload_bytes
        if (length := declared_too_large(request, limit)) is None:
            return None
        resp = _error(413, f"request body of {length} bytes exceeds the upload limit of {limit} bytes")
        resp.force_close()
        return resp

    async def put(self, request: web.Request) -> web.Response:
        if (refused := self.too_large(request)) is not None:
            return refused
        try:
            mode = files.parse_mode(request.query.get("mode"))
        except ValueError as err:
            return _error(400, str(err))
        try:
            _, target = self._target(request)
        except PathEscape:
            return _error(*_ESCAPE)
        except InvalidPath as err:
            return _error(400, str(err))
        if files.is_directory(target):
            return _error(400, "target path is a directory")
        try:
            chunks = await _body_chunks(request)
        except ValueError as err:
            return _error(400, str(err))
        try:
            await files.atomic_write(
                self.state.root, target, chunks, mode=mode, limit=self.state.config.max_upload_bytes
            )
        except PathEscape:
            return _error(*_ESCAPE)
        except files.TooLarge as err:
            return _error(413, str(err))
        except IsADirectoryError:
            return _error(400, "target path is a directory")
        except (NotADirectoryError, FileExistsError) as err:
            return _error(400, f"a parent of the target is not a directory: {err.strerror}")
        except ValueError as err:  # malformed multipart mid-stream
            return _error(400, str(err))
        except OSError as err:
            return _os_failure(err)
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.Response:
        try:
            user_path, target = self._target(request)
            os.lstat(target)
        except PathEscape:
            return _error(*_ESCAPE)
        except InvalidPath as err:
            return _error(400, str(err))
        except OSError as err:  # absent, a symlink loop, a name too long
            return _os_failure(err)
        recursive = False
        if request.query.get("recursive", ""):
            raw = request.query["recursive"]
            if raw not in _BOOLS:
                return _error(400, f"recursive {raw!r} must be a boolean")
            recursive = _BOOLS[raw]
        if target == self.state.root and not root_named(
            request, user_path, lambda p: self.state.names_root(p, sandboxd=True)
        ):
            return _error(400, _ROOT_UNNAMED)
        try:
            await files.delete(self.state.root, target, recursive=recursive)
        except OSError as err:
            return _os_failure(err)
        return web.Response(status=204)

    async def health(self, request: web.Request) -> web.Response:
        if self.state.draining:
            return _error(503, "sandboxd is shutting down")
        return json_response({"status": "ok", "uptime_seconds": int(time.monotonic() - self.state.started)})

    async def metadata(self, request: web.Request) -> web.Response:
        return json_response({"env": self.state.metadata()})

    async def activity(self, request: web.Request) -> web.Response:
        return json_response(self.state.activity.report(self.state.supervisor.running))


async def _body_chunks(request: web.Request) -> AsyncIterator[bytes]:
    """The raw body, or the `file` part of a multipart/form-data body (ValueError when it is missing)."""
    if media_type(request) != "multipart/form-data":
        return request.content.iter_chunked(_CHUNK)
    part = await find_part(await multipart_reader(request), "file")
    if part is None:
        raise ValueError('multipart body is missing the required "file" part')
    return part_chunks(part)


def rest_app(state: RuntimeState) -> web.Application:
    """The aiohttp application of sandboxd's REST API for one server."""
    h = _Rest(state)
    app = json_error_app(
        _error_body,
        before=[state.activity.middleware(), body_timeout_middleware(state.config.http_idle_timeout)],
    )
    # Any character, a newline too (`.*` stops at one: a file named so was a route miss, 404 `Not Found`, until
    # December 6); sandboxd serves every byte but NUL. The path itself is read raw (`path_tail`).
    app.router.add_get(_PREFIX + ANY_PATH, h.get)  # also HEAD
    app.router.add_put(_PREFIX + ANY_PATH, h.put, expect_handler=refusing_expect(h.too_large))
    app.router.add_delete(_PREFIX + ANY_PATH, h.delete)
    app.router.add_get("/v1/health", h.health)
    app.router.add_get("/v1/metadata", h.metadata)
    app.router.add_get("/v1/activity", h.activity)  # ours: docs/lifecycle.md
    return app
