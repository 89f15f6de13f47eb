"""File operations behind both HTTP protocols, each confined to the server's root.

Paths come in already resolved by `paths.confine`; every descriptor opened here is checked again with
`paths.check_fd`, so a path component swapped for a symlink after resolution cannot lead outside. Writes
are atomic (temporary file in the target directory, fsync, rename over the target, which replaces a
symlink instead of writing through it). Blocking work that can take long (listing, deleting trees, fsync)
runs in a worker thread so one big directory does not stall every other sandbox served by this loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .paths import check_fd

__all__ = [
    "TEMP_PREFIX",
    "Entry",
    "NotEmpty",
    "TooLarge",
    "atomic_write",
    "delete",
    "delete_symlink",
    "existing_mode",
    "exists",
    "is_directory",
    "list_directory",
    "open_file",
]

TEMP_PREFIX = ".sandboxd-tmp-"


class NotEmpty(OSError):
    """A directory delete without recursive on a non-empty directory (HTTP 409)."""


class TooLarge(Exception):
    """A request body exceeded the server's limit (HTTP 413)."""


_MODE_RE = re.compile(r"^0[0-7]{3}$")
#: The mode of an uploaded file when the request names none.
DEFAULT_MODE = 0o644


def parse_mode(raw: str | None) -> int:
    """An upload's `mode` query parameter (`DEFAULT_MODE` when absent); `ValueError` naming the rule."""
    if raw is None:
        return DEFAULT_MODE
    if not _MODE_RE.match(raw):
        raise ValueError(f"mode {raw!r} must match ^0[0-7]{{3}}$")
    return int(raw, 8)


def existing_mode(path: str, default: int) -> int:
    """The permission bits (0NNN, as `parse_mode` takes them) of the regular file at `path`, else `default`.

    For a write that replaces a file the way writing it in place would: it keeps its mode. A symlink, a
    directory or anything else at `path` (or nothing) gets `default`.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return default
    return st.st_mode & 0o777 if stat.S_ISREG(st.st_mode) else default


@dataclass(frozen=True, slots=True)
class Entry:
    """One directory child, symlinks followed."""

    name: str
    size: int
    is_dir: bool
    mtime: float
    mode: int

    def legacy(self) -> dict[str, object]:
        return {
            "name": self.name,
            "size": self.size,
            "type": "directory" if self.is_dir else "file",
            "mod_time": self.mtime,
            # Not in upstream's listing (clients ignore it): what `agent-sandbox cp` needs to keep modes.
            "mode": f"{stat.S_IMODE(self.mode):04o}",
        }

    def sandboxd(self) -> dict[str, object]:
        modified = dt.datetime.fromtimestamp(int(self.mtime), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "name": self.name,
            "size": self.size,
            "type": "directory" if self.is_dir else "file",
            "modified_at": modified,
            "mode": f"{stat.S_IMODE(self.mode):04o}",
        }


def is_directory(path: str) -> bool:
    """A directory itself (not a symlink to one, which an atomic write would replace)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def exists(path: str) -> bool:
    return os.path.exists(path)


class NotRegularFile(PermissionError):
    """A FIFO, socket or device: never read (a FIFO would block the reader)."""


#: What opening something that is not a file can fail with: a Unix socket (ENXIO), a device without a driver
#: (ENXIO, ENODEV). Such a path is no file to read - NotRegularFile, as a FIFO (these were 500s until
#: December 6).
_NOT_OPENABLE = frozenset({errno.ENXIO, errno.ENODEV})


def open_file(root: str, path: str) -> tuple[int, os.stat_result]:
    """Open a regular file for reading; IsADirectoryError for a directory, FileNotFoundError if absent,
    NotRegularFile for a FIFO, socket or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        if err.errno in _NOT_OPENABLE:
            raise NotRegularFile(errno.EACCES, "not a regular file", path) from None
        raise
    try:
        check_fd(fd, root)
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EACCES, "not a regular file", path)
        os.set_blocking(fd, True)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def _text_name(name: str) -> str:
    """A name JSON can carry: bytes that are not UTF-8 (surrogate-escaped by `os`) become U+FFFD, as
    sandboxd's Go encoding/json writes them; one such file no longer makes its whole directory a 500."""
    try:
        name.encode()
    except UnicodeEncodeError:
        return os.fsencode(name).decode(errors="replace")
    return name


def _list(root: str, path: str) -> list[Entry]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_fd(fd, root)
        entries: list[Entry] = []
        with os.scandir(fd) as it:
            for item in it:
                try:
                    st = item.stat(follow_symlinks=True)
                    if item.is_symlink():  # a link is listed only when its target stays inside the root
                        target = os.path.realpath(os.path.join(path, item.name))
                        if target != root and not target.startswith(root.rstrip("/") + "/"):
                            continue
                except OSError:  # dangling link, or the entry vanished meanwhile
                    continue
                entries.append(
                    Entry(
                        _text_name(item.name), st.st_size, stat.S_ISDIR(st.st_mode), st.st_mtime, st.st_mode
                    )
                )
        return entries
    finally:
        os.close(fd)


async def list_directory(root: str, path: str) -> list[Entry]:
    """Direct children of a directory (NotADirectoryError for a file, FileNotFoundError if absent)."""
    return await asyncio.to_thread(_list, root, path)


def _check_length(root: str, path: str) -> None:
    """ENAMETOOLONG before anything is created: past the path limit the parents were made down to the level
    the kernel refused (a 5,000-character upload left twenty directories behind)."""
    name_max = os.pathconf(root, "PC_NAME_MAX")
    if len(os.fsencode(path)) >= os.pathconf(root, "PC_PATH_MAX") or any(
        len(os.fsencode(part)) > name_max for part in path.split("/")
    ):
        raise OSError(errno.ENAMETOOLONG, "File name too long")


def _open_parent(root: str, path: str) -> int:
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_fd(fd, root)
    except BaseException:
        os.close(fd)
        raise
    return fd


async def atomic_write(root: str, path: str, chunks: AsyncIterator[bytes], *, mode: int, limit: int) -> int:
    """Stream `chunks` into `path` atomically with permission `mode`; returns the bytes written.

    Raises IsADirectoryError when the target is a directory, TooLarge past `limit` bytes (nothing is left
    behind on any failure), PathEscape / OSError as they come.
    """
    if is_directory(path):
        raise IsADirectoryError(errno.EISDIR, "target path is a directory", path)
    _check_length(root, path)
    dir_fd = await asyncio.to_thread(_open_parent, root, path)
    base = os.path.basename(path)
    tmp = f"{TEMP_PREFIX}{secrets.token_hex(6)}"
    fd = -1
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        os.fchmod(fd, mode)
        written = 0
        async for chunk in chunks:
            written += len(chunk)
            if written > limit:
                raise TooLarge(f"file exceeds the upload limit of {limit} bytes")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        await asyncio.to_thread(os.fsync, fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = ""
        return written
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.close(dir_fd)


def _delete(root: str, path: str, recursive: bool) -> None:
    st = os.lstat(path)  # FileNotFoundError when absent
    if path == root:
        if not recursive:
            raise NotEmpty(errno.ENOTEMPTY, "directory is not empty; pass recursive=true to remove it")
        with os.scandir(path) as it:
            children = [e.name for e in it]
        for name in children:
            _remove(os.path.join(path, name), recursive=True)
        return
    if stat.S_ISDIR(st.st_mode):
        parent = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            check_fd(parent, root)
        finally:
            os.close(parent)
    _remove(path, recursive=recursive)


def _remove(path: str, *, recursive: bool) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
    elif recursive:
        shutil.rmtree(path)  # never follows symlinks
    else:
        try:
            os.rmdir(path)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise NotEmpty(
                    err.errno, "directory is not empty; pass recursive=true to remove it"
                ) from None
            raise


def _delete_symlink(root: str, parent: str, name: str) -> bool:
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_fd(fd, root)  # the directory the link is removed from lies inside the root
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISLNK(st.st_mode):
            return False
        # Swapped for something else since: a file is unlinked (inside the root all the same), a directory
        # refused (EISDIR).
        os.unlink(name, dir_fd=fd)
        return True
    finally:
        os.close(fd)


async def delete_symlink(root: str, parent: str, name: str) -> bool:
    """Remove `name` in the directory `parent` (already confined) if it is a symlink - the link, never what it
    points at, as `rm` does; False, touching nothing, when `name` is no symlink or absent.

    Raises PathEscape when `parent` turns out to be outside the root, OSError as it comes.
    """
    return await asyncio.to_thread(_delete_symlink, root, parent, name)


async def delete(root: str, path: str, *, recursive: bool) -> None:
    """Remove a file, a symlink or a directory (the root itself: only its contents, only recursively)."""
    await asyncio.to_thread(_delete, root, path, recursive)
