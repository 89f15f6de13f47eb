"""`agent-sandbox cp`: files and directory trees between this machine and a sandbox, as `docker cp` copies.

One side is `CLAIM:PATH` (a path relative to the sandbox's root), the other a local path or `-` (standard
input as the source, standard output as the destination; a single file only). A directory is copied with
everything under it: to a destination that exists as a directory it goes inside it (`cp src dir` makes
`dir/src`), to one that does not exist it becomes it; a source ending in `/.` copies the directory's contents
instead. Symbolic links are not followed when uploading (they are reported and skipped: following one could
upload a file from outside the tree); the runtimes' file APIs list only files and directories. Empty
directories are created (uploads: by `mkdir -p` in the sandbox, as the file APIs have no mkdir, with
the paths relative to the sandbox's root as the file APIs take them: `CLAIM:/a` is `a` under the root).
Modes are kept as GNU `cp -r` without `-p` gives them to what it makes: the source's permission bits - a
directory's sticky bit too - less the umask of the process that copies (this one, both ways: uploading, a
0777 tree from WSL's /mnt/c or a FAT stick is not world-writable in the sandbox), and a set-user-ID or
set-group-ID bit of the source's never (a directory made under a local set-group-ID one keeps the bit mkdir
gives it, as `cp -r` leaves it). Downloading, the runtime lists them (sandboxd and this project's
legacy runtime; upstream's does not), in four digits ("2770" on a volume with an fsGroup). Files: the file
API's mode (one `chmod` command per file not 0644 on the legacy runtime). Directories (they all came out
0755 until December 7): each gets its mode once everything under it is in, and only one the copy makes -
one already there keeps its own, as `cp -r` leaves it; downloading, one made is 0700 until then; uploading,
those not 0755 (what the runtime makes) are looked for first (`_present`), and those not there get their
modes by `find ... -exec chmod` commands (`_chmod_commands`). No command `cp` runs in a sandbox is over
`_MAX_COMMAND` bytes: a tree of thousands of directories takes a few, not one over Linux's limit for one
argument. A local entry that cannot be read (in a directory the user cannot search, a file that cannot be
opened) is named on stderr and the rest copied, exit 1, as `cp -r`.
Names a sandbox lists are checked before anything is written locally: the sandbox is not trusted, and an
entry named `..` or `a/b` is refused - named on stderr, the rest copied, exit 1 - rather than written outside
the destination. The runtimes' listings follow symbolic links and do not mark them, so a link to an ancestor
(`d/up -> ..`) lists as a directory without end: a directory that lists exactly what one of its ancestors
lists, and below which that repeats down to `_MAX_DEPTH`, is taken for such a loop, named and not copied (a
look-alike that stops repeating - `mkdir -p x/x` - is copied; no tree goes deeper than `_MAX_DEPTH`). A local
name no file API can carry (a control character: a newline) is found while the tree is walked, before
anything is uploaded, named and skipped. A tree's files go 8 at a time (each costs a round trip through the
router; measured in `benchmarks/cp_tree.py`).
The upload of a tree is `copy_upload`'s, the download `copy_download`'s, what both share `copy_transfers`'.
"""

from __future__ import annotations

import argparse
import io
import posixpath
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from agent_sandbox_sdk import Sandbox, SandboxClient, SandboxNotFoundError, SandboxRequestError
from agent_sandbox_sdk.models import FileEntry

from .copy_download import _checked_name, _download_tree, _keep_mode
from .copy_transfers import _api_path, _umask
from .copy_upload import _upload_mode, _upload_tree
from .output import claim_of

__all__ = ["STDIO", "copy", "split_remote"]

#: `cp`'s name for standard input (as the source) or standard output (as the destination), as `docker cp`.
STDIO = "-"


def split_remote(spec: str) -> tuple[str, str] | None:
    """`claim:path` (or `sandboxclaim/NAME:path`, as `-o name` prints claims) -> (claim, path); a local path
    (no colon before any other slash) -> None."""
    head, sep, tail = spec.partition(":")
    if not sep or not head:
        return None
    if "/" in head:
        claim = claim_of(head)
        return None if claim is None else (claim, tail)
    return head, tail


class _CountingReader(io.RawIOBase):
    """Counts what is read through it (the size of an upload from standard input)."""

    def __init__(self, source: BinaryIO) -> None:
        self.source, self.count = source, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


def copy(client: SandboxClient, args: argparse.Namespace) -> int:
    """Run `cp` (`args.src`, `args.dst`, `args.namespace`, `args.timeout`)."""
    src, dst = split_remote(args.src), split_remote(args.dst)
    if (src is None) == (dst is None):
        raise ValueError("cp copies between a local path and CLAIM:PATH (exactly one side remote)")
    if dst is not None:
        return _upload(client, args, dst)
    assert src is not None
    return _download(client, args, src)


def _sandbox(client: SandboxClient, claim: str, namespace: str) -> Sandbox:
    sandbox = client.get_sandbox(claim, namespace)
    assert sandbox.files is not None
    return sandbox


def _contents_only(path: str) -> bool:
    """`dir/.` (or `.`): the directory's contents, not the directory itself."""
    trimmed = path.rstrip("/")
    return trimmed == "." or trimmed.endswith("/.")


def _upload(client: SandboxClient, args: argparse.Namespace, dst: tuple[str, str]) -> int:
    claim, path = dst
    timeout = args.timeout
    if args.src == STDIO:
        if not path or path.endswith("/"):
            raise ValueError("cp - CLAIM:PATH needs a file name after CLAIM: (standard input has none)")
        files = _sandbox(client, claim, args.namespace).files
        assert files is not None
        counted = _CountingReader(sys.stdin.buffer)
        with _directory_in_the_way(claim, path):
            files.write(_api_path(path), io.BufferedReader(counted), timeout=timeout)
        print(f"- -> {claim}:{path} ({counted.count} bytes)", file=sys.stderr)
        return 0
    local = Path(args.src)
    if not local.exists():
        raise ValueError(f"{local}: no such file or directory")
    sandbox = _sandbox(client, claim, args.namespace)
    files = sandbox.files
    assert files is not None
    if local.is_file():
        if not path or path.endswith("/") or _remote_type(sandbox, path, timeout) == "directory":
            path = posixpath.normpath(posixpath.join(path, local.name)) if path else local.name
        with local.open("rb") as fh, _directory_in_the_way(claim, path):
            files.write(
                _api_path(path), fh, timeout=timeout, mode=_upload_mode(local.stat().st_mode, _umask())
            )
        print(f"{local} -> {claim}:{path} ({local.stat().st_size} bytes)", file=sys.stderr)
        return 0
    if not local.is_dir():
        raise ValueError(f"{local}: not a file or directory")
    contents_only = _contents_only(args.src)
    kind: str | None = None
    if not path:
        target = "" if contents_only else local.resolve().name
    else:
        kind = _remote_type(sandbox, path.rstrip("/"), timeout)
        if kind == "file":
            raise ValueError(f"{claim}:{path}: not a directory")
        into = kind == "directory" and not contents_only
        target = posixpath.join(path.rstrip("/"), local.resolve().name) if into else path.rstrip("/")
        target = posixpath.normpath(target)
        # The root however spelled (`.`, `/`, `/.`, `/tmp/..`): "" (a `/` reached `mkdir` as a path that names
        # no file, refused; December 6).
        target = "" if target in (".", "/") else target
    # What is known of the top: there (the root; `dir` of `cp -r src/. dir`), not there (a destination that
    # does not exist becomes the copy - so nothing under it is there either), or to be looked for.
    top_exists: bool | None = None  # `dir/src` of `cp -r src dir`; `src` of `cp -r src CLAIM:`
    if not target or (contents_only and kind == "directory"):
        top_exists = True
    elif path and kind is None:
        top_exists = False
    tally = _upload_tree(sandbox, local, target, timeout, top_exists)
    for skipped in tally.skipped:
        print(
            f"warning: skipped {skipped} (symbolic links and special files are not copied)", file=sys.stderr
        )
    for line in tally.refused:
        print(f"error: {line}", file=sys.stderr)
    print(f"{local} -> {claim}:{target or '.'} ({tally.summary()})", file=sys.stderr)
    # A symbolic link is skipped by design (exit 0, as before); a file that could not be sent is a copy made
    # in part: 1, as a download's.
    return 1 if tally.refused else 0


@contextmanager
def _directory_in_the_way(claim: str, path: str) -> Iterator[None]:
    """An upload onto a directory in the sandbox (`cp f1 CLAIM:dd` with a directory dd/f1, `cp - CLAIM:dd`): said
    as a download into a local directory says it (`CLAIM:PATH: is a directory`, exit 2), not as the runtime's
    `HTTP 400: File upload failed: target path is a directory` (exit 1, until December 7)."""
    try:
        yield
    except SandboxRequestError as err:
        if err.status_code == 400 and "is a directory" in str(err):
            raise ValueError(f"{claim}:{path}: is a directory") from err
        raise


def _remote_type(sandbox: Sandbox, path: str, timeout: float) -> str | None:
    """ "file", "directory", or None when nothing is at `path` (read from its parent's listing)."""
    if _is_root(path):
        return "directory"
    entry = _remote_entry(sandbox, path, timeout)
    return entry.type if entry is not None else None


def _is_root(path: str) -> bool:
    return posixpath.split(posixpath.normpath(path))[1] in ("", ".")


def _remote_entry(sandbox: Sandbox, path: str, timeout: float) -> FileEntry | None:
    """What the parent's listing says of `path` (not the root: no listing names it); None: nothing there.

    Only a 404 (no such parent, or not a directory) means nothing there; any other failure is raised. Until
    December 6 every failure did: a router that timed out made `cp` wait out its `--timeout` twice (the listing,
    then the transfer), and a transient one could send `cp file sb:dir` to `dir` itself instead of into it.
    """
    files = sandbox.files
    assert files is not None
    parent, name = posixpath.split(posixpath.normpath(path))
    try:
        entries = files.list(parent, timeout=timeout)
    except SandboxRequestError as err:
        if err.status_code != 404:
            raise
        return None  # no such parent
    return next((e for e in entries if e.name == name), None)


def _download(client: SandboxClient, args: argparse.Namespace, src: tuple[str, str]) -> int:
    claim, path = src
    if not path:
        raise ValueError("cp needs a path after CLAIM: (. for the sandbox's whole root)")
    timeout = args.timeout
    sandbox = _sandbox(client, claim, args.namespace)
    files = sandbox.files
    assert files is not None
    root = _is_root(path)
    entry = None if root else _remote_entry(sandbox, path, timeout)
    kind = "directory" if root else entry.type if entry is not None else None
    if args.dst == STDIO:
        if kind == "directory":
            raise ValueError(f"{claim}:{path}: a directory cannot be written to standard output")
        written = _read_to(sandbox, claim, path, sys.stdout.buffer, timeout)
        sys.stdout.buffer.flush()
        print(f"{claim}:{path} -> - ({written} bytes)", file=sys.stderr)
        return 0
    target = Path(args.dst)
    if kind != "directory":
        if target.is_dir():
            target = target / posixpath.basename(posixpath.normpath(path))
        written = _read_to(sandbox, claim, path, target, timeout)
        _keep_mode(entry, target, _umask())
        print(f"{claim}:{path} -> {target} ({written} bytes)", file=sys.stderr)
        return 0
    if target.is_dir() and not _contents_only(path):
        name = posixpath.basename(posixpath.normpath(path))
        target = target / _checked_name(name or claim, path)
    elif target.exists() and not target.is_dir():
        raise ValueError(f"{target}: not a directory")
    tally = _download_tree(sandbox, posixpath.normpath(path), target, timeout, claim, entry)
    for line in tally.refused:
        print(f"error: {claim}:{line}", file=sys.stderr)
    for line in tally.unset:
        print(f"error: {line}", file=sys.stderr)
    for gone in tally.vanished:
        print(
            f"error: {claim}:{gone}: no such file or directory (removed after it was listed, its name is not"
            " UTF-8, or it is not a regular file: a FIFO, a socket, a device)",
            file=sys.stderr,
        )
    print(f"{claim}:{path} -> {target} ({tally.summary()})", file=sys.stderr)
    return 1 if tally.vanished or tally.refused or tally.unset else 0


def _read_to(sandbox: Sandbox, claim: str, path: str, destination: Path | BinaryIO, timeout: float) -> int:
    """One file down; a missing one said as the local side says it, not as the runtime's HTTP 404."""
    files = sandbox.files
    assert files is not None
    try:
        return files.read_to(_api_path(path), destination, timeout=timeout)
    except SandboxRequestError as err:
        if err.status_code == 404:
            # Not found: exit 3, as the exit codes say of a 404 (until December 7 a plain error, exit 1).
            raise SandboxNotFoundError(f"{claim}:{path}: no such file or directory") from err
        raise
