"""Sandbox file paths: the client-side sanitizer and the two runtimes' URL encodings (spec §3.5).

Pure functions. The runtime confines every path to its root anyway; the sanitizer exists so that an
obviously unsafe path fails before any request, with a `ValueError` naming it.
"""

from __future__ import annotations

import posixpath
from urllib.parse import quote

__all__ = ["legacy_path", "reject_control_characters", "sandboxd_path", "sanitize_path"]


def sanitize_path(path: str) -> str:
    """Normalized relative form of `path`; `ValueError` for empty, control characters, `.`-only or `..`.

    `a//b/./c` -> `a/b/c`, `/etc/x` -> `etc/x` (paths are relative to the runtime root).
    """
    if not isinstance(path, str):
        raise TypeError(f"path must be a str, got {type(path).__name__}")
    if not path:
        raise ValueError("path must not be empty")
    reject_control_characters(path)
    if ".." in path.split("/"):
        raise ValueError(f"path {path!r} contains a '..' segment")
    normalized = posixpath.normpath(path).lstrip("/")
    if normalized in ("", "."):
        raise ValueError(f"path {path!r} does not name a file")
    return normalized


def reject_control_characters(path: str) -> None:
    """`ValueError` naming `path` when it holds a control character (no runtime has such a file name to give)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise ValueError(f"path {path!r} contains control characters")


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
