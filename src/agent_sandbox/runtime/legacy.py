"""The legacy runtime protocol on :8888 (spec §2.1, upstream `python-runtime`), plus our extensions.

Upstream endpoints keep their shapes and status codes: `GET /`, `POST /execute`, `POST /upload`,
`GET /download/{path}`, `GET /list/{path}`, `GET /exists/{path}`. Extensions (docs/runtime.md):
`POST /execute` also takes `env`, `cwd` and `timeout_seconds` and answers `timed_out` and `truncated`;
`POST /execute/stream` streams output as NDJSON (a blank line while the command is quiet, so idle timeouts
of the router and other proxies do not cut it); `DELETE /files/{path}` deletes.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import errno
import math
import posixpath
import shlex
from typing import Any
from urllib.parse import quote

import orjson
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
    part_filename,
    path_tail,
    refusing_expect,
    root_named,
    send_open_file,
)
from .execution import run_command
from .paths import InvalidPath, PathEscape, confine_lexically
from .processes import ShuttingDown, SpawnError, TooManyProcesses
from .state import RuntimeState

__all__ = ["legacy_app"]

_ACCESS_DENIED = {"message": "Access denied"}


def _legacy_error(status: int, message: str) -> dict[str, Any]:
    if status in (404, 405):  # the framework's own answers (FastAPI: {"detail": ...})
        return {"detail": message}
    return {"message": message}


class _KeptAlive:
    """Writes a streamed answer's lines, and a blank line whenever none was written for `every` seconds: a
    command quiet for minutes (a build, a test suite) would otherwise meet the idle timeout of the router
    (`--proxy-timeout`, 180 s) or of any proxy in between and die with its connection. NDJSON readers, ours
    included, skip blank lines."""

    def __init__(self, resp: web.StreamResponse, every: float) -> None:
        self._resp = resp
        self._every = every
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._task = asyncio.create_task(self._beat()) if every > 0 else None

    async def write(self, line: bytes) -> None:
        self._last = self._loop.time()
        await self._resp.write(line)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self._last + self._every - self._loop.time())
            if self._loop.time() - self._last >= self._every:
                await self.write(b"\n")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class _Invalid(Exception):
    """A request body that fails validation: 422 with a FastAPI-shaped `detail` list."""

    def __init__(self, kind: str, loc: list[str | int], msg: str, value: object = None) -> None:
        super().__init__(msg)
        self.detail = [{"type": kind, "loc": loc, "msg": msg, "input": value}]


def _unprocessable(err: _Invalid) -> web.Response:
    return json_response({"detail": err.detail}, 422)


# `/execute/stream`'s output chunks: `data` (UTF-8, invalid bytes replaced; the default) or, when the request
# says `"output_encoding": "base64"`, `data_base64` (the bytes exactly as the command wrote them).
OUTPUT_UTF8 = "utf-8"
OUTPUT_BASE64 = "base64"


class _StreamChunks:
    """The output lines of one `/execute/stream` answer, in the encoding its request asked for."""

    def __init__(self, encoding: str) -> None:
        self.raw = encoding == OUTPUT_BASE64
        self._decoders = {s: codecs.getincrementaldecoder("utf-8")("replace") for s in ("stdout", "stderr")}

    def line(self, stream: str, data: bytes) -> bytes | None:
        """The NDJSON line for `data` written to `stream` (None while a split character is incomplete)."""
        if self.raw:
            return _line({"type": stream, "data_base64": base64.b64encode(data).decode("ascii")})
        text = self._decoders[stream].decode(data)
        return _line({"type": stream, "data": text}) if text else None

    def tails(self) -> list[bytes]:
        """Lines for what is left undecoded at the end (text only; an incomplete character as U+FFFD)."""
        if self.raw:
            return []
        tails = ((s, d.decode(b"", final=True)) for s, d in self._decoders.items())
        return [_line({"type": s, "data": tail}) for s, tail in tails if tail]


class _ExecRequest:
    """A validated `/execute` body."""

    def __init__(self, body: object, state: RuntimeState) -> None:
        if not isinstance(body, dict):
            raise _Invalid("model_attributes_type", ["body"], "Input should be a valid dictionary", body)
        command = body.get("command")
        if "command" not in body:
            raise _Invalid("missing", ["body", "command"], "Field required", body)
        if not isinstance(command, str):
            raise _Invalid("string_type", ["body", "command"], "Input should be a valid string", command)
        self.command = command
        self.timeout = state.config.command_timeout
        raw_timeout = body.get("timeout_seconds")
        if raw_timeout is not None:
            if isinstance(raw_timeout, bool) or not isinstance(raw_timeout, int | float):
                raise _Invalid(
                    "float_type", ["body", "timeout_seconds"], "Input should be a valid number", raw_timeout
                )
            limit = state.config.max_command_timeout
            if not (math.isfinite(raw_timeout) and 0 < raw_timeout <= limit):
                msg = f"timeout_seconds must be > 0 and <= {limit:g}"
                raise _Invalid("value_error", ["body", "timeout_seconds"], msg, raw_timeout)
            self.timeout = float(raw_timeout)
        env = body.get("env")
        if env is not None and not (
            isinstance(env, dict)
            and all(isinstance(k, str) and k and "=" not in k and "\x00" not in k for k in env)
            and all(isinstance(v, str) and "\x00" not in v for v in env.values())
        ):
            msg = "env must map non-empty names without '=' to strings"
            raise _Invalid("value_error", ["body", "env"], msg, env)
        self.env: dict[str, str] | None = env
        encoding = body.get("output_encoding", OUTPUT_UTF8)
        if encoding not in (OUTPUT_UTF8, OUTPUT_BASE64):
            msg = f"output_encoding must be {OUTPUT_UTF8!r} or {OUTPUT_BASE64!r}"
            raise _Invalid("value_error", ["body", "output_encoding"], msg, encoding)
        self.output_encoding: str = encoding
        cwd = body.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise _Invalid("string_type", ["body", "cwd"], "Input should be a valid string", cwd)
        try:
            self.cwd = state.resolve(cwd) if cwd else state.root  # PathEscape propagates (403)
        except InvalidPath as err:
            raise _Invalid("value_error", ["body", "cwd"], str(err), cwd) from None

    def argv(self) -> list[str]:
        """POSIX shell-like split, no shell (ValueError on bad quoting, e.g. "No closing quotation")."""
        argv = shlex.split(self.command)
        if not argv:
            raise ValueError("empty command")
        return argv


def _failure(message: str) -> dict[str, Any]:
    return {
        "stdout": "",
        "stderr": f"Failed to execute command: {message}",
        "exit_code": 1,
        "timed_out": False,
        "truncated": False,
    }


class _Legacy:
    def __init__(self, state: RuntimeState) -> None:
        self.state = state

    async def _exec_request(self, request: web.Request) -> _ExecRequest:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise _Invalid(
                "json_invalid", ["body", err.pos], "JSON decode error", raw[:200].decode(errors="replace")
            ) from None
        return _ExecRequest(body, self.state)

    async def _exec_request_or_error(self, request: web.Request) -> _ExecRequest | web.Response:
        if (refused := self.json_too_large(request)) is not None:
            return refused
        try:
            return await self._exec_request(request)
        except _Invalid as err:
            return _unprocessable(err)
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)

    async def health(self, request: web.Request) -> web.Response:
        if self.state.draining:
            return json_response(
                {"status": "shutting down", "message": "Sandbox Runtime is shutting down."}, 503
            )
        return json_response({"status": "ok", "message": "Sandbox Runtime is active."})

    async def execute(self, request: web.Request) -> web.Response:
        req = await self._exec_request_or_error(request)
        if isinstance(req, web.Response):
            return req
        try:
            argv = req.argv()
            result = await run_command(
                self.state.supervisor,
                argv,
                cwd=req.cwd,
                env=req.env,
                time_limit=req.timeout,
                output_limit=self.state.config.max_output_bytes,
            )
        except ShuttingDown:
            raise  # a 503 saying it was not started (`error_middleware`)
        except TooManyProcesses as err:
            return json_response({"message": str(err)}, 429)
        except (ValueError, SpawnError) as err:
            return json_response(_failure(str(err)))
        if result.timed_out:
            body = _failure(f"Command {argv!r} timed out after {req.timeout:g} seconds")
            body["timed_out"] = True
            return json_response(body)
        return json_response(
            {
                "stdout": result.stdout.decode(errors="replace"),
                "stderr": result.stderr.decode(errors="replace"),
                "exit_code": result.exit_code,
                "timed_out": False,
                "truncated": result.truncated,
            }
        )

    async def execute_stream(self, request: web.Request) -> web.StreamResponse:
        req = await self._exec_request_or_error(request)
        if isinstance(req, web.Response):
            return req
        resp = web.StreamResponse(
            headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"}
        )
        sup = self.state.supervisor
        try:
            proc = await sup.spawn(req.argv(), cwd=req.cwd, env=req.env, stdin=False)
        except ShuttingDown:
            raise  # a 503 saying it was not started (`error_middleware`)
        except TooManyProcesses as err:
            return json_response({"message": str(err)}, 429)
        except (ValueError, SpawnError) as err:
            await resp.prepare(request)
            failure = _StreamChunks(req.output_encoding).line(
                "stderr", f"Failed to execute command: {err}".encode()
            )
            assert failure is not None  # whole UTF-8 text decodes at once
            await resp.write(failure)
            await resp.write(_line({"type": "exit", "exit_code": 1, "timed_out": False}))
            await resp.write_eof()
            return resp
        await resp.prepare(request)
        chunks = _StreamChunks(req.output_encoding)
        timed_out = False
        out = _KeptAlive(resp, self.state.config.stream_keepalive)
        try:
            await out.write(_line({"type": "start", "pid": proc.pid}))
            try:
                async with asyncio.timeout(req.timeout):
                    async for event in proc.events():
                        if (line := chunks.line(event.stream, event.data)) is not None:
                            await out.write(line)
                    code = await proc.wait()
            except TimeoutError:
                timed_out = True
                proc.kill_group()
                code = await proc.wait()
            await out.stop()
            for tail in chunks.tails():
                await resp.write(tail)
            await resp.write(_line({"type": "exit", "exit_code": code, "timed_out": timed_out}))
            await resp.write_eof()
        except BaseException:
            proc.kill_group()  # client went away or the server is stopping
            raise
        finally:
            # The process first: a client that went away fails a write, then aiohttp cancels the handler, and
            # that cancellation cut `out.stop()` short now and then - the output pumps, nobody reading them,
            # then waited for good (until December 6).
            await proc.close()
            await out.stop()
        return resp

    def json_too_large(self, request: web.Request) -> web.Response | None:
        """413 before a byte of a JSON body is read (and before `100 Continue`) when its declared length is over
        `--max-json-body-bytes`; the connection closes after it. A chunked body is read up to the limit and
        then refused by aiohttp (`client_max_size`). Until December 7 a declared one was too: it got its
        `100 Continue` and up to the limit was read before the 413."""
        limit = self.state.config.max_json_body_bytes
        if (length := declared_too_large(request, limit, whole_body=True)) is None:
            return None
        return _refused(f"request body of {length} bytes exceeds the limit of {limit} bytes")

    def too_large(self, request: web.Request) -> web.Response | None:
        """413 before a byte of a multipart body is read (and before `100 Continue`) when its declared length
        is over `--max-upload-bytes` and the framing's allowance (a body that is not multipart is the 422
        below, unread); the connection closes after it."""
        limit = self.state.config.max_upload_bytes
        if media_type(request) != "multipart/form-data":
            return None
        if (length := declared_too_large(request, limit)) is None:
            return None
        return _refused(
            f"File upload failed: request body of {length} bytes exceeds the upload limit of {limit} bytes"
        )

    async def upload(self, request: web.Request) -> web.Response:
        if (refused := self.too_large(request)) is not None:
            return refused
        raw_mode = request.query.get("mode")
        try:
            # Ours (upstream's runtime ignores it): `?mode=0NNN` as sandboxd's PUT takes it, so the SDKs' mode
            # is set as the file is written, with no moment at 0644 (they still chmod: upstream has no mode).
            mode = files.parse_mode(raw_mode)
        except ValueError as err:
            return json_response({"message": f"File upload failed: {err}"}, 400)
        if media_type(request) != "multipart/form-data":
            # FastAPI reads only a multipart/form-data body for `File(...)`; any other (or none) is an empty
            # form, so upstream answers the 422 of an absent part (until December 6 ours was a 400 naming a
            # KeyError, `invalid multipart body: 'Content-Type'`, when the header was missing).
            return _unprocessable(_Invalid("missing", ["body", "file"], "Field required"))
        try:
            part = await find_part(await multipart_reader(request), "file")
        except ValueError as err:
            return json_response({"message": str(err)}, 400)
        if part is None:
            return _unprocessable(_Invalid("missing", ["body", "file"], "Field required"))
        filename = part_filename(part)
        if filename is None:
            return _unprocessable(
                _Invalid("value_error", ["body", "file"], "Expected UploadFile, received: <class 'str'>")
            )
        try:
            target = self.state.resolve(filename)
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)
        except InvalidPath as err:
            return json_response({"message": f"File upload failed: {err}"}, 400)
        if raw_mode is None:
            # Upstream's runtime writes in place (`open(path, "wb")`): a file written again keeps its mode, so
            # a script made executable stays so. The write stays atomic; the new file takes the old one's
            # permission bits (until December 6 it came out 0644: `./run.sh` was `Permission denied`).
            mode = files.existing_mode(target, mode)
        try:
            await files.atomic_write(
                self.state.root,
                target,
                part_chunks(part),
                mode=mode,
                limit=self.state.config.max_upload_bytes,
            )
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)
        except files.TooLarge as err:
            return json_response({"message": f"File upload failed: {err}"}, 413)
        # Worded as sandboxd's PUT answers them, by `strerror`: `str(err)` names the host's path of the root
        # (until December 6 `[Errno 21] target path is a directory: '/var/lib/.../adir'`).
        except IsADirectoryError:
            return json_response({"message": "File upload failed: target path is a directory"}, 400)
        except (NotADirectoryError, FileExistsError) as err:
            message = f"File upload failed: a parent of the target is not a directory: {err.strerror}"
            return json_response({"message": message}, 400)
        except ValueError as err:  # malformed multipart mid-stream, worded by `part_chunks`
            return json_response({"message": str(err)}, 400)
        except OSError as err:
            # The client's name or the sandbox's links, not a server failure (500s until December 6).
            if err.errno == errno.ENAMETOOLONG:
                return json_response({"message": "File upload failed: file name too long"}, 400)
            if err.errno == errno.ELOOP:
                return json_response(
                    {"message": "File upload failed: too many levels of symbolic links"}, 400
                )
            return json_response({"message": f"File upload failed: {err.strerror}"}, 500)
        return json_response({"message": f"File '{filename}' uploaded successfully."})

    def _resolve(self, request: web.Request, prefix: str) -> tuple[str, str]:
        user_path = path_tail(request, prefix)
        return user_path, self.state.resolve(user_path)

    async def download(self, request: web.Request) -> web.StreamResponse:
        try:
            user_path, target = self._resolve(request, "/download/")
            fd, _ = files.open_file(self.state.root, target)
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)
        except InvalidPath as err:
            return json_response({"message": str(err)}, 400)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, files.NotRegularFile):
            return json_response({"message": "File not found"}, 404)  # upstream: not os.path.isfile
        except PermissionError:
            return json_response({"message": "Permission denied"}, 403)
        except OSError as err:
            if err.errno not in _NOT_THERE:
                raise
            return json_response({"message": "File not found"}, 404)
        return await send_open_file(request, fd, {"Content-Disposition": _attachment(user_path)})

    async def list(self, request: web.Request) -> web.Response:
        try:
            _, target = self._resolve(request, "/list/")
            entries = await files.list_directory(self.state.root, target)
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)
        except InvalidPath as err:
            return json_response({"message": str(err)}, 400)
        except (FileNotFoundError, NotADirectoryError):
            return json_response({"message": "Path is not a directory"}, 404)
        except OSError as err:
            if err.errno in _NOT_THERE:
                return json_response({"message": "Path is not a directory"}, 404)
            return json_response({"message": f"List files failed: {err.strerror}"}, 500)
        return json_response([e.legacy() for e in entries])

    async def exists(self, request: web.Request) -> web.Response:
        try:
            user_path, target = self._resolve(request, "/exists/")
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)
        except InvalidPath as err:
            return json_response({"message": str(err)}, 400)
        return json_response({"path": user_path, "exists": files.exists(target)})

    async def delete(self, request: web.Request) -> web.Response:
        recursive = request.query.get("recursive", "false").lower()
        if recursive not in ("true", "false", "1", "0"):
            return json_response({"message": f"recursive {recursive!r} must be a boolean"}, 400)
        try:
            user_path = path_tail(request, "/files/")
            if not await self._delete_symlink(user_path):
                target = self.state.resolve(user_path)
                if target == self.state.root and not root_named(
                    request, user_path, lambda p: self.state.names_root(p, sandboxd=False)
                ):
                    message = "path resolves to the sandbox root without naming it; name the root to empty it"
                    return json_response({"message": message}, 400)
                await files.delete(self.state.root, target, recursive=recursive in ("true", "1"))
        except PathEscape:
            return json_response(_ACCESS_DENIED, 403)
        except InvalidPath as err:
            return json_response({"message": str(err)}, 400)
        except (FileNotFoundError, NotADirectoryError):
            return json_response({"message": "File not found"}, 404)
        except files.NotEmpty as err:
            return json_response({"message": err.strerror}, 409)
        except PermissionError:
            return json_response({"message": "Permission denied"}, 403)
        except OSError as err:
            if err.errno in _NOT_THERE:
                return json_response({"message": "File not found"}, 404)
            return json_response({"message": f"Delete failed: {err.strerror}"}, 500)
        return json_response({"message": f"'{user_path}' deleted."})

    async def _delete_symlink(self, user_path: str) -> bool:
        """Remove the path's last component if it is a symlink (the link, as `rm` removes it), after confining
        the directory it is in; False when it is no symlink.

        Resolving the whole path, as every other route does, made a delete reach the link's target: a link to
        a directory with `recursive=true` took the tree it pointed at and stayed behind dangling, a link
        pointing out of the root could not be removed at all (403; both until December 6). Parents are still
        resolved and confined; the path is normalised first (`link/` and `link/.` name the link).
        """
        root = self.state.root
        # Normalised against the root, as `confine` does: a `..` that climbs above it is an escape (403), as on
        # every route. Normalised against "/" (until December 6), `../name` named `<root>/name` and removed
        # that link, and `../../etc/passwd` was a 404 for a missing `<root>/etc`.
        joined = confine_lexically(root, user_path)
        if joined == root:
            return False
        parent, name = posixpath.split(joined)
        return await files.delete_symlink(root, self.state.resolve(posixpath.relpath(parent, root)), name)


#: What upstream's `os.path.isfile`/`isdir` answer False for, besides a missing path: a symlink loop and a name
#: too long - 404s, not 500s (the legacy spec answers only 404 or 403 there). The 500s that remain name the
#: error without its path, which is the host's volume directory (until December 6 they named both).
_NOT_THERE = frozenset({errno.ELOOP, errno.ENAMETOOLONG})


def _refused(message: str) -> web.Response:
    """A 413 given instead of reading the body: the connection closes after it, as the body still due on it
    is never read."""
    resp = json_response({"message": message}, 413)
    resp.force_close()
    return resp


def _line(obj: object) -> bytes:
    return orjson.dumps(obj) + b"\n"


def _attachment(path: str) -> str:
    """Content-Disposition naming `path`: plain when it can be quoted as is, else RFC 5987's `filename*`
    (non-ASCII, a quote or backslash, a control character: a CR or LF in a header was a 500 until December 6)."""
    if path.isascii() and path.isprintable() and '"' not in path and "\\" not in path:
        return f'attachment; filename="{path}"'
    return f"attachment; filename*=utf-8''{quote(path, safe='')}"


def legacy_app(state: RuntimeState) -> web.Application:
    """The aiohttp application of the legacy protocol for one server."""
    h = _Legacy(state)
    app = json_error_app(
        _legacy_error,
        before=[state.activity.middleware(), body_timeout_middleware(state.config.http_idle_timeout)],
        client_max_size=state.config.max_json_body_bytes,
    )
    app.router.add_get("/", h.health)
    # The JSON routes refuse a body declared over --max-json-body-bytes in place of `100 Continue`, as /upload
    # one declared over --max-upload-bytes.
    app.router.add_post("/execute", h.execute, expect_handler=refusing_expect(h.json_too_large))
    app.router.add_post("/execute/stream", h.execute_stream, expect_handler=refusing_expect(h.json_too_large))
    app.router.add_post("/upload", h.upload, expect_handler=refusing_expect(h.too_large))
    # Any character, a newline too: upstream's Starlette (`{path:path}`, `.*`) misses a name with one (404), but
    # the same server uploads such a name, and sandboxd serves it; a file it wrote must be readable.
    app.router.add_get("/download/" + ANY_PATH, h.download)
    app.router.add_get("/list/" + ANY_PATH, h.list)
    app.router.add_get("/exists/" + ANY_PATH, h.exists)
    app.router.add_delete("/files/" + ANY_PATH, h.delete)
    return app
