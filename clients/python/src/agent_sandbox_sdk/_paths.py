"""Sandbox file paths: the client-side sanitizer and the two runtimes' URL encodings (spec §3.5).

Pure functions. The runtime confines every path to its root anyway; the sanitizer exists so that an
obviously unsafe path fails before any request, with a `ValueError` naming it.
"""

from __future__ import annotations

import posixpath
from urllib.parse import quote

__all__ = ["legacy_path", "reject_control_characters", "sandboxd_path", "sanitize_path"]


def sanitize_path(path: str) -> str:
    """Normalized relative form of `path`; `ValueError` for control characters, an empty or whitespace-only
    path, one naming no file (`.`, `/`, `a/..`) or one that escapes the root.

    `a//b/./c` -> `a/b/c`, `/etc/x` -> `etc/x` (paths are relative to the runtime root), `a/../b` -> `b`.
    The checks and their order are upstream 1.0.8's `_safe_upload_path` (spec §3.5): normalize first, then
    refuse a `..` segment that is left (`../x`, `a/../../x`); the messages keep its key words
    (`cannot be empty`, `ASCII control characters`, `does not name a file`, `escapes the sandbox root`).
    """
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, got {type(path).__name__}")
    # before normalizing: normpath keeps a NUL, which would cut the name short at the runtime's syscall
    reject_control_characters(path)
    if not path.strip():
        raise ValueError(f"path cannot be empty (got {path!r})")
    normalized = posixpath.normpath(path).lstrip("/")
    if normalized in ("", "."):
        raise ValueError(f"path {path!r} does not name a file")
    if ".." in normalized.split("/"):
        raise ValueError(
            f"path {path!r} escapes the sandbox root: a '..' segment is left after normalizing it"
        )
    return normalized


def reject_control_characters(path: str) -> None:
    """`ValueError` naming `path` when it holds an ASCII control character (below 0x20, or 0x7F)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise ValueError(f"path {path!r} contains ASCII control characters")


def legacy_path(path: str) -> str:
    """The legacy runtime's path tail: the whole path percent-encoded with `/` as `%2F` (`a/b` -> `a%2Fb`).

    `""` and `"."` mean the root and encode as the empty tail (what upstream's HTTP library sends after
    removing the dot segment). `".."` alone encodes as `%2E%2E`: sent as `..`, the HTTP library resolved the
    dot segment and the request went to `/` - `read("..")` returned the runtime's health answer as the file's
    content (until December 6); the runtime now sees the path and refuses it (403).
    """
    if path in ("", "."):
        return ""
    if path == "..":
        return "%2E%2E"
    return quote(path, safe="")


def sandboxd_path(path: str) -> str:
    """sandboxd's `{path}` segment: each `/`-separated part percent-encoded, joined by `%2F`.

    A part `.` becomes `%2E` and `..` becomes `%2E%2E`, so no HTTP library treats them as dot segments.
    """
    parts = []
    for part in path.split("/"):
        if part == ".":
            parts.append("%2E")
        elif part == "..":
            parts.append("%2E%2E")
        else:
            parts.append(quote(part, safe=""))
    return "%2F".join(parts)
