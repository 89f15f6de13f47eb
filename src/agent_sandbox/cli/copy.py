"""`agent-sandbox cp`: files and directory trees between this machine and a sandbox, as `docker cp` copies.

One side is `CLAIM:PATH` (a path relative to the sandbox's root), the other a local path or `-` (standard
input as the source, standard output as the destination; a single file only). A directory is copied with
everything under it: to a destination that exists as a directory it goes inside it (`cp src dir` makes
`dir/src`), to one that does not exist it becomes it; a source ending in `/.` copies the directory's contents
instead. Symbolic links are not followed when uploading (they are reported and skipped: following one could
upload a file from outside the tree); the runtimes' file APIs list only files and directories. Empty
directories are created (uploads: one `mkdir -p` command in the sandbox, as the file APIs have no mkdir, with
the paths relative to the sandbox's root as the file APIs take them: `CLAIM:/a` is `a` under the root).
Files keep their permission bits, as `cp` without `-p` keeps them: the source's mode less the umask when
downloading (where the runtime lists modes: sandboxd and this project's legacy runtime, not upstream's), the
source's mode when uploading (one `chmod` command per file not 0644 on the legacy runtime). Directories
too, as GNU `cp -r` (they all came out 0755 until December 7): each gets its mode once everything under it
is in - downloading, one the copy makes (not one already there) is 0700 until then; uploading, one not 0755
(the runtime's) gets its source's by a `find ... -exec chmod` command per mode (`_chmod_commands`).
Names a sandbox lists are checked before anything is written locally: the sandbox is not trusted, and an
entry named `..` or `a/b` is refused - named on stderr, the rest copied, exit 1 - rather than written outside
the destination. The runtimes' listings follow symbolic links and do not mark them, so a link to an ancestor
(`d/up -> ..`) lists as a directory without end: a directory that lists exactly what one of its ancestors
lists, and below which that repeats down to `_MAX_DEPTH`, is taken for such a loop, named and not copied (a
look-alike that stops repeating - `mkdir -p x/x` - is copied; no tree goes deeper than `_MAX_DEPTH`). A local
name no file API can carry (a control character: a newline) is found while the tree is walked, before
anything is uploaded, named and skipped. A tree's files go 8 at a time (each costs a round trip through the
router; measured in `benchmarks/cp_tree.py`).
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import posixpath
import re
import shlex
import stat
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from agent_sandbox_sdk import Sandbox, SandboxClient, SandboxError, SandboxRequestError
from agent_sandbox_sdk._paths import reject_control_characters, sanitize_path
from agent_sandbox_sdk.models import FileEntry

from .output import claim_of

__all__ = ["STDIO", "copy", "split_remote"]

_PARALLEL = 8  # files in flight at once in a directory copy
#: Directory levels below a downloaded tree's top that are listed: a backstop for a symbolic link loop the
#: listing comparison cannot see (a directory changing while it is listed); deeper ones are named, not copied.
_MAX_DEPTH = 64

#: `cp`'s name for standard input (as the source) or standard output (as the destination), as `docker cp`.
STDIO = "-"


#: What a runtime writes when no mode is given: no need to ask for it.
_DEFAULT_MODE = 0o644
#: What a runtime makes a directory with (the file APIs' parents, `mkdir -p`, under the usual umask 022): an
#: uploaded directory of another mode is given it once its contents are in.
_RUNTIME_DIRECTORY_MODE = 0o755
#: A mode as a sandbox lists it ("0755"); anything else is ignored (the sandbox is not trusted).
_LISTED_MODE = re.compile(r"^0?[0-7]{3}$")


def _upload_mode(local: Path) -> int | None:
    """The permission bits to give an uploaded copy of `local` (None: the runtime's default will do)."""
    mode = stat.S_IMODE(local.stat().st_mode) & 0o777
    return None if mode == _DEFAULT_MODE else mode


def _keep_mode(entry: FileEntry | None, local: Path, umask: int) -> None:
    """Give a downloaded file its source's permission bits less the umask, as `cp` does (set-id bits never)."""
    if entry is not None and entry.mode is not None and _LISTED_MODE.match(entry.mode):
        os.chmod(local, int(entry.mode, 8) & 0o777 & ~umask)


def _umask() -> int:
    current = os.umask(0o022)
    os.umask(current)
    return current


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


@dataclass
class _Tally:
    files: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # listed, then not there to read
    refused: list[str] = field(default_factory=list)  # error lines: what was not copied, and why
    unset: list[str] = field(default_factory=list)  # error lines: a local directory whose mode was not set

    def summary(self) -> str:
        noun = "file" if self.files == 1 else "files"
        return f"{self.files} {noun}, {self.bytes} bytes"


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
        with local.open("rb") as fh:
            files.write(_api_path(path), fh, timeout=timeout, mode=_upload_mode(local))
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
    # The top is given its mode when the copy makes it: not the sandbox's root, and not a directory that
    # exists when only the contents go into it (`cp -r src/. dir` leaves `dir`'s mode as it is).
    top_is_new = bool(target) and not (contents_only and kind == "directory")
    tally = _upload_tree(sandbox, local, target, timeout, top_is_new)
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


def _upload_tree(
    sandbox: Sandbox, root: Path, target: str, timeout: float, top_is_new: bool = True
) -> _Tally:
    files, commands = sandbox.files, sandbox.commands
    assert files is not None
    tally, empty = _Tally(), []
    jobs: list[Callable[[], int]] = []
    modes: list[tuple[str, int]] = []  # (remote directory, its source's mode), parents first

    def upload(local: Path, remote: str) -> int:
        assert files is not None
        with local.open("rb") as fh:
            files.write(_api_path(remote), fh, timeout=timeout, mode=_upload_mode(local))
        return local.stat().st_size

    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(directory)
        rel = here.relative_to(root).as_posix()
        remote_dir = posixpath.normpath(posixpath.join(target, rel)) if target else rel
        remote_dir = "" if remote_dir == "." else remote_dir
        mode = stat.S_IMODE(here.stat().st_mode) & 0o777
        if remote_dir and mode != _RUNTIME_DIRECTORY_MODE and (top_is_new or here != root):
            modes.append((remote_dir, mode))
        dirnames.sort()  # walked in order: the same commands for the same tree
        for name in list(dirnames):
            if (here / name).is_symlink():
                dirnames.remove(name)
                tally.skipped.append(str(here / name))
            elif not _sendable(name):
                dirnames.remove(name)
                tally.refused.append(_unsendable(here / name))
        wrote = False
        for name in sorted(filenames):
            local = here / name
            if local.is_symlink() or not local.is_file():
                tally.skipped.append(str(local))
                continue
            if not _sendable(name):
                # Found here, before any upload: the SDK refuses the path when it is sent, and that stopped
                # the copy half-way with exit 2 (until December 6).
                tally.refused.append(_unsendable(local))
                continue
            remote = posixpath.join(remote_dir, name) if remote_dir else name
            jobs.append(functools.partial(upload, local, remote))
            wrote = True
        if not wrote and not dirnames and remote_dir:
            empty.append(remote_dir)
    # Root-relative, as the file API takes every path (the SDK's `sanitize_path`: `/a/b` is `a/b` under the
    # sandbox's root, `..` refused): a command takes `/a/b` literally, outside the root - on the dev runner,
    # on the host - and the tree's empty directories were missing where its files went (until December 6).
    # Commands start in the root (both runtimes' working directory, spec §2.1), so these name the same place;
    # checked before anything is written.
    empty = [sanitize_path(_api_path(directory)) for directory in empty]
    sizes = _run_all(jobs)
    tally.files, tally.bytes = len(sizes), sum(sizes)
    if empty:
        assert commands is not None
        # Quoted for a shell (sandboxd) and for the legacy runtime's shell-like split alike.
        result = commands.run(shlex.join(["mkdir", "-p", "--", *empty]), timeout=timeout)
        if result.exit_code != 0:
            raise SandboxError(f"creating empty directories failed: {result.stderr.strip()}")
    if modes:
        assert commands is not None
        for command in _chmod_commands([(sanitize_path(_api_path(d)), mode) for d, mode in modes]):
            result = commands.run(command, timeout=timeout)
            if result.exit_code != 0:
                raise SandboxError(f"setting directory modes failed: {result.stderr.strip()}")
    return tally


def _chmod_commands(modes: list[tuple[str, int]]) -> list[str]:
    """Commands that give each directory (root-relative, parents first) its mode, after everything is in it.

    One command per mode, except for directories the owner cannot search (no `u+x`): those go last, deepest
    first, as a change below one of them needs that search; their own contents are all written by then, so a
    directory without `u+w` (0500) is no obstacle. Run as `find DIR... -maxdepth 0 -type d -exec chmod`: `find`
    does not follow a symbolic link (`-P`, its default) and `-type d` passes over one, so a link the sandbox
    has where the tree has a directory (the files went through it) is left alone, not the directory it names
    chmodded. `./` before each path: `find` would take one starting with `-` for an expression.
    """
    searchable: dict[int, list[str]] = {}
    for directory, mode in modes:
        if mode & stat.S_IXUSR:
            searchable.setdefault(mode, []).append(directory)
    closed = sorted(
        ((d, m) for d, m in modes if not m & stat.S_IXUSR), key=lambda dm: dm[0].count("/"), reverse=True
    )
    last: list[tuple[int, list[str]]] = []  # consecutive ones of one mode share a command
    for directory, mode in closed:
        if last and last[-1][0] == mode:
            last[-1][1].append(directory)
        else:
            last.append((mode, [directory]))
    return [
        shlex.join(
            [
                "find",
                *(f"./{d}" for d in dirs),
                "-maxdepth",
                "0",
                "-type",
                "d",
                "-exec",
                "chmod",
                f"{mode:04o}",
                "--",
                "{}",
                "+",
            ]
        )
        for mode, dirs in [*searchable.items(), *last]
    ]


def _api_path(path: str) -> str:
    """`path` as the SDK's file calls take it: a top-level name of only spaces (` `) as `./ `.

    `sanitize_path` refuses a path of only whitespace, as upstream's SDK does (a caller's empty argument,
    9abf078), but here it is a file name from a listing or a local tree: `./ ` names the same file and is
    normalised to ` `. A copy to or from the sandbox's root stopped at such a name (ValueError).
    """
    return f"./{path}" if path and not path.strip() else path


def _sendable(name: str) -> bool:
    """Whether a file API can carry `name`: none takes a control character (a newline cannot be in a
    header or a legacy path; the SDK refuses it)."""
    try:
        reject_control_characters(name)
    except ValueError:
        return False
    return True


def _unsendable(local: Path) -> str:
    # repr: the name's newline would otherwise break the line that names it
    return f"{str(local)!r}: not copied: a name with a control character, which no sandbox file API takes"


def _run_all(jobs: list[Callable[[], int]]) -> list[int]:
    """Run transfers a few at a time (small files cost a round trip each, not bandwidth); the first failure
    stops those not started and is raised."""
    if len(jobs) <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=min(_PARALLEL, len(jobs))) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
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
            raise SandboxError(f"{claim}:{path}: no such file or directory") from err
        raise


def _download_tree(
    sandbox: Sandbox, remote: str, local: Path, timeout: float, claim: str = "", top: FileEntry | None = None
) -> _Tally:
    """Every file under `remote` into `local`: the whole tree listed first, then its directories made, then
    its files read, so nothing is made locally for what is not copied; last, the directories made are given
    their listed modes (`top`: what the parent's listing says of `remote`; see `_make_directories`).

    A file or directory gone by the time it is read (a live sandbox's temporary files, a lock, a name that is
    not UTF-8 and so was listed with U+FFFD) is reported in `vanished` and the rest copied, as `cp -r` does;
    an unusable name, a symbolic link loop or a tree too deep is reported in `refused`, the rest copied.
    """
    files = sandbox.files
    assert files is not None
    tally = _Tally()
    plan = _Plan()
    _list_tree(sandbox, claim, remote, local, plan, timeout, tally, (), top)
    umask = _umask()
    made = _make_directories(plan.directories)

    def download(child: str, destination: Path, entry: FileEntry) -> int:
        assert files is not None
        try:
            written = files.read_to(_api_path(child), destination, timeout=timeout)
        except SandboxRequestError as err:
            # 404: gone since the listing (or, on the legacy runtime, not a regular file); sandboxd refuses a
            # FIFO or device as "not a regular file" - either way the rest is copied (until December 6 a FIFO
            # in the tree stopped the copy half-way with "Permission denied")
            if err.status_code != 404 and not (err.status_code == 403 and "not a regular file" in str(err)):
                raise
            tally.vanished.append(child)
            return -1
        _keep_mode(entry, destination, umask)
        return written

    try:
        sizes = [n for n in _run_all([functools.partial(download, *pair) for pair in plan.files]) if n >= 0]
    finally:
        # also when the copy stops half-way, as `cp -r` does: what was made is not left at 0700
        _keep_directory_modes(made, umask, tally)
    tally.files, tally.bytes = len(sizes), sum(sizes)
    return tally


def _make_directories(
    directories: list[tuple[Path, FileEntry | None]],
) -> list[tuple[Path, FileEntry | None]]:
    """Make the tree's directories (parents first); those made here (not those already there), returned.

    Each is made 0700 (less the umask) and gets its own mode only once its files are in it
    (`_keep_directory_modes`), as GNU `cp -r` does: a 0500 directory could not be written into, and a 0700
    one's files are not open to others while the copy runs.
    """
    made = []
    for directory, entry in directories:
        if directory.is_dir():  # already there (or a link to one: written through, as `cp -r` writes)
            continue
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        made.append((directory, entry))
    return made


def _keep_directory_modes(made: list[tuple[Path, FileEntry | None]], umask: int, tally: _Tally) -> None:
    """Give each directory `made` its listed mode less the umask (set-id bits never), deepest first: a parent
    the owner cannot search (no `u+x`) would stop the change below it. One listed without a mode (upstream's
    runtime lists none) gets what `mkdir` gives. A directory replaced by a symbolic link meanwhile is left
    alone: `chmod` would change what it names."""
    for directory, entry in reversed(made):
        mode = 0o777
        if entry is not None and entry.mode is not None and _LISTED_MODE.match(entry.mode):
            mode = int(entry.mode, 8) & 0o777
        try:
            if stat.S_ISDIR(os.lstat(directory).st_mode):
                os.chmod(directory, mode & ~umask)
        except OSError as err:
            tally.unset.append(f"{directory}: its mode {mode & ~umask:04o} not set: {err.strerror or err}")


@dataclass
class _Plan:
    """What a download makes locally, in order: directories (parents first), then files."""

    #: each with what its parent's listing says of it (None: the top when it is the root, or not listed)
    directories: list[tuple[Path, FileEntry | None]] = field(default_factory=list)
    files: list[tuple[str, Path, FileEntry]] = field(default_factory=list)
    #: Listings read ahead while a suspected loop was checked, each taken once by the walk (`_entries`).
    listed: dict[str, list[FileEntry]] = field(default_factory=dict)


#: What a listing says of a directory, to compare with its ancestors' (see `_list_tree`).
_Listing = tuple[tuple[str, str, int, str, str | None], ...]


def _listing(entries: list[FileEntry]) -> _Listing:
    return tuple(sorted((e.name, e.type, e.size, e.modified.isoformat(), e.mode) for e in entries))


def _entries(sandbox: Sandbox, remote: str, plan: _Plan, timeout: float) -> list[FileEntry]:
    files = sandbox.files
    assert files is not None
    if remote in plan.listed:
        return plan.listed.pop(remote)
    return files.list(remote, timeout=timeout)


def _list_tree(
    sandbox: Sandbox,
    claim: str,
    remote: str,
    local: Path,
    plan: _Plan,
    timeout: float,
    tally: _Tally,
    ancestors: tuple[tuple[str, _Listing], ...],
    listed: FileEntry | None = None,
) -> None:
    """Add `remote` and what is under it to `plan` (`ancestors`: the directories above it, with their
    listings, nearest last; `listed`: what its parent's listing says of it).

    The runtimes' listings follow symbolic links and do not mark them (spec: "symlinks followed"), so a link
    to an ancestor (`d/up -> ..`) is a directory at every level: recursing into it ended in RecursionError,
    with ~1000 empty local directories made and no file copied (until December 6). A directory that lists
    exactly what an ancestor lists - every name, type, size, mode and modification time - may be that
    ancestor again, or a real directory that looks the same (`mkdir -p x/x` in one clock tick, a tar or a
    reproducible build's one time: `out` and `out/x` both list `x`). Only a loop goes on repeating, so the
    path from the ancestor is followed again and again from there (`_repeats`): a loop is reported and not
    copied, a look-alike is copied (ef087c0 skipped it, files and all). `_MAX_DEPTH` is a backstop for a loop
    whose directories change while they are listed.
    """
    if len(ancestors) >= _MAX_DEPTH:
        tally.refused.append(f"{remote}: not copied: more than {_MAX_DEPTH} directory levels deep")
        return
    try:
        entries = _entries(sandbox, remote, plan, timeout)
    except SandboxRequestError as err:
        if err.status_code != 404:
            raise
        tally.vanished.append(remote)
        return
    listing = _listing(entries)
    for at, (path, seen) in enumerate(ancestors):
        cycle = (*ancestors[at + 1 :], (remote, listing))
        if seen == listing and _repeats(sandbox, remote, len(ancestors), cycle, path, plan, timeout):
            tally.refused.append(
                f"{remote}: not copied: it lists what {claim}:{path} lists (a symbolic link loop)"
            )
            return
    plan.directories.append((local, listed))
    ancestors = (*ancestors, (remote, listing))
    for entry in entries:
        reason = _unusable(entry.name)
        if reason is not None:
            tally.refused.append(
                f"{remote}: not copied: the sandbox listed the name {entry.name!r} ({reason})"
            )
            continue
        child = entry.name if remote in ("", ".") else posixpath.join(remote, entry.name)
        if entry.type == "directory":
            _list_tree(sandbox, claim, child, local / entry.name, plan, timeout, tally, ancestors, entry)
        else:
            plan.files.append((child, local / entry.name, entry))


def _repeats(
    sandbox: Sandbox,
    remote: str,
    depth: int,
    cycle: tuple[tuple[str, _Listing], ...],
    origin: str,
    plan: _Plan,
    timeout: float,
) -> bool:
    """Whether `remote`, which lists what its ancestor `origin` lists, is `origin` again: the directories on
    the way from `origin` to `remote` (`cycle`, the listings below `origin`, `remote`'s last) are listed again
    below `remote` (`depth` levels below the download's top), round after round, down to `_MAX_DEPTH` (where
    the walk would stop anyway).

    A symbolic link loop repeats without end; a look-alike stops repeating (the chain ends, a directory lists
    something else). At most `_MAX_DEPTH` listings, kept in `plan.listed` for the walk that follows.
    """
    files = sandbox.files
    assert files is not None
    # the names from `origin` down to `remote` (`origin` may be the top as given: "", ".", "/", "/a")
    names = (remote if origin in ("", ".") else remote[len(origin.rstrip("/")) + 1 :]).split("/")
    assert len(names) == len(cycle)
    here = remote
    step = 0
    while depth + step + 1 < _MAX_DEPTH:
        here = posixpath.join(here, names[step % len(names)])
        if here not in plan.listed:
            try:
                plan.listed[here] = files.list(here, timeout=timeout)
            except SandboxRequestError as err:
                if err.status_code != 404:
                    raise
                return False
        if _listing(plan.listed[here]) != cycle[step % len(cycle)][1]:
            return False
        step += 1
    return True


def _unusable(name: str) -> str | None:
    """Why a name from the sandbox's listing cannot be copied (None: it is one plain path component).

    Refused: what would be written outside the destination or is no name (`..`, `a/b`, `.`, empty, NUL),
    and a control character (no file API can carry it back to read the file). A backslash is an ordinary
    character of a Linux file name (it was refused, failing the whole copy, until December 6).
    """
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        return "not one path component"
    if not _sendable(name):
        return "a control character, which no sandbox file API takes"
    return None


def _checked_name(name: str, where: str) -> str:
    """A name from the sandbox's listing, refused unless it is one plain path component."""
    if _unusable(name) is not None:
        raise SandboxError(
            f"the sandbox listed an unusable name {name!r} in {where!r}; nothing written for it"
        )
    return name
