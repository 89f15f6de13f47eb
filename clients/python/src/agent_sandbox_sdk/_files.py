"""File flows for both runtimes (spec §3.5, §2.1, §2.2.1). Paths are relative to the runtime root.

| op | legacy runtime | sandboxd REST |
|---|---|---|
| write | `POST /upload` multipart part `file`, filename = path | `PUT /v1/files/<enc>` raw body |
| read / read_to | `GET /download/<enc>` | `GET /v1/files/<enc>` |
| list | `GET /list/<enc>` -> array | `GET /v1/files/<enc>` -> `{"entries": [...]}` |
| exists | `GET /exists/<enc>` -> `{"exists"}` | `HEAD /v1/files/<enc>` -> 200 / 404 |
| delete | `DELETE /files/<enc>[?recursive=true]` (this project's runtime) | `DELETE /v1/files/<enc>[?recursive=true]` |

Bodies of file objects are streamed in 64 KiB chunks (never read whole); `read_to` streams to its
destination and stops at `max_bytes`.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shlex
import shutil
from collections.abc import Mapping
from typing import IO, Any

from . import _commands
from ._calls import MAX_LIST_RESPONSE, call, malformed_answer, open_stream
from ._connection import Connection
from ._paths import legacy_path, sandboxd_path, sanitize_path
from ._steps import Flow, ReadChunk, Trace, Upload
from .exceptions import SandboxError, SandboxRequestError
from .models import FileEntry

__all__ = ["Content", "delete_path", "exists", "list_dir", "read", "read_to", "write"]

#: What `write` accepts.
Content = bytes | bytearray | memoryview | str | IO[bytes]

#: In-memory content larger than this is streamed from the caller's buffer, its length known: joining the
#: multipart framing around it, and the HTTP stack's own join of a body passed whole, each copied it.
STREAM_ABOVE = 1 << 20


def _files_path(conn: Connection, path: str, legacy_prefix: str) -> str:
    if conn.runtime == "legacy":
        return f"/{legacy_prefix}/{legacy_path(path)}"
    return f"/v1/files/{sandboxd_path(path)}"


def _refuse_line_breaks(filename: str) -> None:
    """`ValueError` for CR or LF in a legacy upload's name (reached only with `allow_unsafe_paths=True`).

    The name travels in the multipart part's `Content-Disposition` header, where CR/LF cannot appear even
    escaped. Sent as `%0D`/`%0A` (what requests, and so upstream's SDK, does), they are not decoded by the
    legacy runtime: the file was silently written as `new%0Aline.txt` (until December 6). sandboxd takes the
    name percent-encoded in the URL, so such names are written there as given.
    """
    if "\r" in filename or "\n" in filename:
        raise ValueError(
            f"path {filename!r} contains a line break (CR or LF), which a legacy runtime upload cannot carry "
            "in its file name (sandboxd can)"
        )


def _multipart_framing(filename: str) -> tuple[bytes, bytes, str]:
    _refuse_line_breaks(filename)
    boundary = secrets.token_hex(16)
    # A quoted-string with backslash escapes, as Go's mime/multipart writes it and both runtimes' parsers
    # (aiohttp; python-multipart under upstream's FastAPI) read it. The HTML5 form encoding (`"` as %22, what
    # requests sends) was stored as a file literally named `%22`, which the same name then could not read.
    quoted = filename.replace("\\", "\\\\").replace('"', '\\"')
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head, f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _check_mode(mode: object) -> None:
    """`ValueError` unless `mode` is None or permission bits (0 to 0o777)."""
    if mode is not None and (isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777):
        raise ValueError(f"mode must be permission bits from 0 to 0o777 (e.g. 0o755), got {mode!r}")


def write(
    conn: Connection,
    path: str,
    content: Content,
    *,
    timeout: float,
    allow_unsafe_paths: bool,
    mode: int | None = None,
) -> Flow[None]:
    """Create or replace the file at `path` (parents created), with permission `mode` if given (else the
    runtime's 0644). Span `write`.

    sandboxd sets the mode as it writes, and so does this project's legacy runtime; upstream's legacy upload has
    no mode, so on the legacy runtime a `chmod` command follows (one more round trip; the image needs `chmod`)."""
    _check_mode(mode)
    attributes: dict[str, str | int] = {"sandbox.file.path": path}
    if isinstance(content, str | bytes | bytearray | memoryview):
        attributes["sandbox.file.size"] = len(
            content.encode("utf-8") if isinstance(content, str) else content
        )
    yield Trace("write", attributes)
    if not allow_unsafe_paths:
        path = sanitize_path(path)
    elif not path:
        raise ValueError("path cannot be empty")
    if conn.runtime == "legacy":
        _refuse_line_breaks(path)  # before the content is looked at or anything is sent
    data: bytes | None = None
    source: IO[bytes] | None = None
    if isinstance(content, str):
        data = content.encode("utf-8")
    elif isinstance(content, bytes | bytearray | memoryview):
        data = bytes(content)
    elif isinstance(content, io.TextIOBase):
        # it would fail mid-upload with "string argument without an encoding" (until December 6)
        raise TypeError("content is a text-mode file: open it in binary mode (open(path, 'rb'))")
    elif hasattr(content, "read"):
        source = content
    else:
        raise TypeError(f"content must be bytes, str or a binary file object, not {type(content).__name__}")
    length: int | None = None  # of a streamed in-memory body: sent as Content-Length, not chunked
    chunk = 64 * 1024
    if data is not None and len(data) > STREAM_ABOVE:
        source, length, data, chunk = io.BytesIO(data), len(data), None, 1 << 20  # BytesIO shares `data`
    # sandboxd's `?mode=`; this project's legacy runtime takes it too, upstream's ignores it (hence the chmod)
    params = {"mode": f"{mode:04o}"} if mode is not None else None
    if conn.runtime == "legacy":
        head, tail, ctype = _multipart_framing(path)
        headers = {"Content-Type": ctype}
        if data is not None:
            body = head + data + tail
            yield from call(
                conn, "POST", "/upload", timeout=timeout, headers=headers, content=body, params=params
            )
        else:
            assert source is not None
            if length is not None:
                headers["Content-Length"] = str(len(head) + length + len(tail))
            upload = Upload(source, head, tail, chunk_size=chunk)
            yield from call(
                conn, "POST", "/upload", timeout=timeout, headers=headers, upload=upload, params=params
            )
        if mode is not None:
            yield from _chmod_legacy(conn, path, mode, timeout)
        return
    headers = {"Content-Type": "application/octet-stream"}
    url = _files_path(conn, path, "")
    if data is not None:
        yield from call(conn, "PUT", url, timeout=timeout, headers=headers, content=data, params=params)
    else:
        assert source is not None
        if length is not None:
            headers["Content-Length"] = str(length)
        upload = Upload(source, chunk_size=chunk)
        yield from call(conn, "PUT", url, timeout=timeout, headers=headers, upload=upload, params=params)


def _chmod_legacy(conn: Connection, path: str, mode: int, timeout: float) -> Flow[None]:
    # Commands run in the runtime's root, which upload paths are relative to; `sanitize_path` refuses a
    # path (allowed by allow_unsafe_paths) that a command would resolve elsewhere.
    command = shlex.join(["chmod", f"{mode:04o}", "--", sanitize_path(path)])
    body = _commands.legacy_body(command, None, None, None)
    result = yield from _commands.run_legacy(conn, body, timeout, extended=False)
    if result.exit_code != 0:
        raise SandboxError(
            f"{path}: written, but setting its mode {mode:04o} failed: {result.stderr.strip()}"
        )


def read(conn: Connection, path: str, *, timeout: float, allow_unsafe_paths: bool) -> Flow[bytes]:
    """The whole file. Span `read`."""
    yield Trace("read", {"sandbox.file.path": path})
    if not allow_unsafe_paths:
        path = sanitize_path(path)
    resp = yield from call(conn, "GET", _files_path(conn, path, "download"), timeout=timeout)
    _refuse_listing(conn, path, resp.headers)
    yield Trace(None, {"sandbox.file.size": len(resp.content)})
    return resp.content


def _sandboxd_sent(conn: Connection, headers: Mapping[str, str], content_type: str) -> bool:
    # Ours: sandboxd serves a file (always application/octet-stream) and a directory's JSON listing
    # (application/json) at the same URL; upstream's SDK takes either for what it asked for.
    return conn.runtime != "legacy" and headers.get("content-type", "").startswith(content_type)


def _refuse_listing(conn: Connection, path: str, headers: Mapping[str, str]) -> None:
    if _sandboxd_sent(conn, headers, "application/json"):
        raise SandboxError(f"{path}: is a directory, not a file (files.list lists it)")


def read_to(
    conn: Connection,
    path: str,
    destination: str | os.PathLike[str] | IO[bytes],
    *,
    timeout: float,
    allow_unsafe_paths: bool,
    max_bytes: int | None,
) -> Flow[int]:
    """Stream the file into `destination` (a path, or a writable binary file); bytes written.

    A path is written next to itself and renamed over it only once the whole file arrived, so a failed or
    refused download (over `max_bytes` -> `SandboxError`, a broken connection) leaves whatever was there
    before as it was; a file object keeps what was written. Span `read_to`.
    """
    yield Trace("read_to", {"sandbox.file.path": path})
    if not allow_unsafe_paths:
        path = sanitize_path(path)
    if max_bytes is not None and max_bytes < 0:
        raise ValueError("max_bytes must be >= 0")
    handle = yield from open_stream(conn, "GET", _files_path(conn, path, "download"), timeout=timeout)
    _refuse_listing(conn, path, handle.headers)
    length = handle.headers.get("content-length")
    if max_bytes is not None and length is not None and length.isdigit() and int(length) > max_bytes:
        raise SandboxError(f"{path}: {length} bytes exceed max_bytes={max_bytes}")
    partial: _PartialFile | None = None
    if isinstance(destination, str | os.PathLike):
        partial = _PartialFile(os.fspath(destination))
        sink: IO[bytes] = partial.file
    else:
        sink = destination
    written = 0
    try:
        while (chunk := (yield ReadChunk(handle))) is not None:
            written += len(chunk)
            if max_bytes is not None and written > max_bytes:
                raise SandboxError(f"{path}: more than max_bytes={max_bytes} bytes")
            sink.write(chunk)
        if partial is not None:
            partial.commit()
    finally:
        if partial is not None:
            partial.discard()
    yield Trace(None, {"sandbox.file.size": written})
    return written


class _PartialFile:
    """A download's file beside its destination (`.<name>.<random>.part`), renamed over it by `commit`.

    A symlink destination is followed (its target is replaced); an existing file's mode is kept, a new
    one gets the umask's. `discard` removes the partial file unless committed.
    """

    def __init__(self, destination: str) -> None:
        self.destination = os.path.realpath(destination)
        if os.path.isdir(self.destination):
            raise IsADirectoryError(f"{destination}: is a directory")
        directory, name = os.path.split(self.destination)
        self.path = os.path.join(directory, f".{name}.{secrets.token_hex(4)}.part")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as err:  # name the destination the caller gave, not the partial file's name
            raise type(err)(err.errno, err.strerror, destination) from None
        self.file: IO[bytes] = os.fdopen(fd, "wb")
        self.committed = False

    def commit(self) -> None:
        self.file.close()
        if os.path.exists(self.destination):
            shutil.copymode(self.destination, self.path)
        os.replace(self.path, self.destination)
        self.committed = True

    def discard(self) -> None:
        self.file.close()
        if not self.committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _entries(conn: Connection, body: Any) -> list[FileEntry]:
    if conn.runtime == "legacy":
        if not isinstance(body, list):
            raise SandboxError(f"/list answered {type(body).__name__}, expected an array")
        return [FileEntry.from_legacy(e) for e in body]
    if not isinstance(body, dict) or not isinstance(body.get("entries"), list):
        raise SandboxError("sandboxd listing is not an object with 'entries' (is the path a file?)")
    return [FileEntry.from_sandboxd(e) for e in body["entries"] if e.get("type") in ("file", "directory")]


def list_dir(conn: Connection, path: str, *, timeout: float) -> Flow[list[FileEntry]]:
    """Direct children of the directory `path` (`""` or `"."` = the root). Span `list`."""
    yield Trace("list", {"sandbox.file.path": path})
    try:
        resp = yield from call(
            conn,
            "GET",
            _files_path(conn, path, "list"),
            timeout=timeout,
            max_response_bytes=MAX_LIST_RESPONSE,
        )
    except SandboxRequestError as err:
        if not getattr(err.response, "over_limit", False):
            raise
        raise SandboxRequestError(
            f"{err} - the listing of {path!r} is over this SDK's {MAX_LIST_RESPONSE >> 20} MiB limit for one "
            "directory: list its subdirectories, or run a command in the sandbox (`ls DIR | wc -l`, "
            "`find DIR -maxdepth 1 | head`)",
            err.status_code,
            err.response,
        ) from None
    if _sandboxd_sent(conn, resp.headers, "application/octet-stream"):
        raise SandboxError(f"{path}: is a file, not a directory")
    with malformed_answer(f"directory listing of {path!r}", resp):
        entries = _entries(conn, resp.json())
    yield Trace(None, {"sandbox.file.count": len(entries)})
    return entries


def exists(conn: Connection, path: str, *, timeout: float) -> Flow[bool]:
    """Whether a file or directory exists at `path`. Span `exists`.

    The path is sent as given (encoded), as upstream 1.0.8 sends it: a name with control characters, which
    `list` shows and `delete` takes, gets the runtime's answer, not a `ValueError` (until December 6).
    """
    yield Trace("exists", {"sandbox.file.path": path})
    if conn.runtime == "legacy":
        resp = yield from call(
            conn,
            "GET",
            _files_path(conn, path, "exists"),
            timeout=timeout,
            max_response_bytes=MAX_LIST_RESPONSE,
        )
        with malformed_answer("/exists", resp):
            body = resp.json()
        if not isinstance(body, dict) or not isinstance(body.get("exists"), bool):
            raise SandboxRequestError(f"/exists answered {resp.text[:200]!r}", resp.status_code, resp)
        found = bool(body["exists"])
    else:
        resp = yield from call(conn, "HEAD", _files_path(conn, path, ""), timeout=timeout, allow=(404,))
        found = resp.status_code != 404
    yield Trace(None, {"sandbox.file.exists": found})
    return found


def delete_path(conn: Connection, path: str, *, recursive: bool, timeout: float) -> Flow[None]:
    """Remove a file, or a directory (non-empty ones only with `recursive=True`). Span `delete`."""
    yield Trace("delete", {"sandbox.file.path": path})
    if not path:
        raise ValueError(
            "path must not be empty (delete the root's entries one by one, or pass '.' with recursive)"
        )
    params = {"recursive": "true"} if recursive else None
    yield from call(conn, "DELETE", _files_path(conn, path, "files"), timeout=timeout, params=params)
