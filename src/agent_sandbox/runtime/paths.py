"""Path confinement: every path a client names must resolve inside the server's root directory.

The rule is sandboxd's (spec §2.2) and, without the root-prefix strip, the legacy runtime's (§2.1): join the
user path to the symlink-resolved root, normalise, resolve symlinks of the existing part (a missing tail is
re-appended as is; a dangling link is followed to where it points), refuse anything outside the root.
Resolution happens before the file is opened, so a path swapped for a symlink in between could still point
out; `check_fd` closes that gap by checking where an opened descriptor really is (`/proc/self/fd`).
"""

from __future__ import annotations

import os
import posixpath

__all__ = [
    "InvalidPath",
    "PathEscape",
    "check_fd",
    "confine",
    "confine_lexically",
    "names_root",
    "real_root",
]


class PathEscape(PermissionError):
    """The path resolves outside the root (HTTP 403, gRPC PERMISSION_DENIED)."""


class InvalidPath(ValueError):
    """The path cannot name a file at all (NUL byte); HTTP 400."""


def real_root(root: str | os.PathLike[str]) -> str:
    """The absolute, symlink-resolved root, created (0755) if missing."""
    path = os.path.abspath(os.fspath(root))
    os.makedirs(path, mode=0o755, exist_ok=True)
    return os.path.realpath(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def confine(root: str, user_path: str, *, configured_root: str | None = None) -> str:
    """Resolve `user_path` against `root` (already `real_root`) or raise PathEscape / InvalidPath.

    An absolute user path is taken relative to the root. With `configured_root` (sandboxd), a user path that
    starts with the root as configured ("/workspace/a") has that prefix stripped first.
    """
    if "\x00" in user_path:
        raise InvalidPath("path contains a NUL byte")
    user_path = _strip_configured(user_path, configured_root)
    resolved = os.path.realpath(_joined(root, user_path))
    if not _inside(resolved, root):
        raise PathEscape(f"path {user_path!r} escapes the root")
    return resolved


def _strip_configured(user_path: str, configured_root: str | None) -> str:
    if configured_root:
        cleaned = posixpath.normpath(user_path) if user_path else ""
        prefix = posixpath.normpath(configured_root)
        if prefix != "/" and _inside(cleaned, prefix):
            return cleaned[len(prefix) :]
    return user_path


def names_root(root: str, user_path: str, *, configured_root: str | None = None) -> bool:
    """Whether `user_path` itself names the root ("", "/", ".", "a/..", the configured root for sandboxd),
    without following symlinks: what a delete of the whole root's contents requires (see `confine`)."""
    if "\x00" in user_path:
        return False
    try:
        return _joined(root, _strip_configured(user_path, configured_root)) == root
    except PathEscape:
        return False


def _joined(root: str, user_path: str) -> str:
    joined = posixpath.normpath(root + "/" + user_path)
    if not _inside(joined, root):
        raise PathEscape(f"path {user_path!r} escapes the root")
    return joined


def confine_lexically(root: str, user_path: str) -> str:
    """`user_path` joined to `root` and normalised, as `confine` does before it resolves symlinks (none are
    resolved here: a path naming a link names the link); PathEscape / InvalidPath as `confine`."""
    if "\x00" in user_path:
        raise InvalidPath("path contains a NUL byte")
    return _joined(root, user_path)


def check_fd(fd: int, root: str) -> None:
    """Raise PathEscape unless the open descriptor `fd` is the root or lies below it."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the resolution check is all we have
        return
    if not _inside(where, root):
        raise PathEscape("path escapes the root")
