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
from agent_sandbox_sdk.sandbox import CommandExecutor

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
#: A mode as a sandbox lists it: `stat.S_IMODE` in four digits ("0755"; "2770" on a volume with an fsGroup,
#: where every directory is set-group-ID; "1777" sticky); anything else is ignored (the sandbox is not
#: trusted). Until December 7 only "0NNN" was taken: a private "2700" directory came out 0777 less the umask.
_LISTED_MODE = re.compile(r"^0?[0-7]{3,4}$")
#: The bits a copy keeps, as `cp -r` without `-p`: a file's permission bits, a directory's and its sticky bit
#: (mkdir keeps S_ISVTX); a set-user-ID or set-group-ID bit never.
_FILE_BITS = 0o777
_DIRECTORY_BITS = 0o1777
#: The longest command `cp` sends, in bytes. One `mkdir -p` for every empty directory and one `chmod` for
#: every directory of a mode failed for a large tree (a node_modules) once every file was sent (until December
#: 7): over the legacy runtime's 1 MiB request body (HTTP 413), and sandboxd runs a command as `/bin/sh -c
#: COMMAND`, where Linux takes at most 128 KiB in one argument (MAX_ARG_STRLEN; E2BIG from ~2,000
#: directories on). Half that leaves room, and fits 1 MiB however JSON escapes the names.
_MAX_COMMAND = 64 * 1024


def _upload_mode(mode: int, umask: int) -> int | None:
    """The permission bits to give an uploaded copy of a file of `mode` (`st_mode`): its own less the umask,
    as `cp` gives a file it makes (None: the runtime's default will do)."""
    bits = stat.S_IMODE(mode) & _FILE_BITS & ~umask
    return None if bits == _DEFAULT_MODE else bits


def _listed_mode(entry: FileEntry | None, keep: int) -> int | None:
    """The `keep` bits of the mode a listing gives (None: none given, or not a mode)."""
    if entry is None or entry.mode is None or not _LISTED_MODE.match(entry.mode):
        return None
    return int(entry.mode, 8) & keep


def _keep_mode(entry: FileEntry | None, local: Path, umask: int) -> None:
    """Give a downloaded file its source's permission bits less the umask, as `cp` does (set-id bits never)."""
    mode = _listed_mode(entry, _FILE_BITS)
    if mode is not None:
        os.chmod(local, mode & ~umask)


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


def _upload_tree(
    sandbox: Sandbox, root: Path, target: str, timeout: float, top_exists: bool | None = None
) -> _Tally:
    """Every file under `root` into `target` (root-relative; "" the sandbox's root), then its empty
    directories made, then its directories' modes set (`top_exists`: whether `target` is there - True, False:
    and so nothing under it either - or None: not known).

    Walked as `cp -r` walks, without following a symbolic link (reported, skipped); what cannot be read - an
    entry of a directory the user cannot search (0600), a directory that cannot be listed, a file that
    cannot be opened - is named in `refused` and the rest copied (until December 7 a PermissionError stopped
    the whole upload with a traceback, for everyone but root). A directory is made also when its contents
    could not be read, and given its mode, as `cp -r` makes it.
    """
    files, commands = sandbox.files, sandbox.commands
    assert files is not None
    tally = _Tally()
    umask = _umask()
    jobs: list[Callable[[], int]] = []
    directories: list[tuple[str, int]] = []  # (remote directory, the mode to give it), parents first
    filled: set[str] = set()  # remote directories a file went into (the file API made them)

    def upload(local: Path, remote: str, mode: int | None) -> int:
        assert files is not None
        try:
            # O_NOFOLLOW: a file replaced by a symbolic link since the walk is not followed out of the tree
            fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as err:
            tally.refused.append(f"{local}: not copied: {err.strerror or err}")
            return -1
        with open(fd, "rb") as fh:
            files.write(_api_path(remote), fh, timeout=timeout, mode=mode)
            size = os.fstat(fh.fileno()).st_size
        filled.add(posixpath.dirname(remote))
        return size

    pending = [(root, target, _directory_mode(root.stat().st_mode, umask))]
    while pending:  # depth first, parents before their contents, in name order: the same commands each time
        here, remote_dir, mode = pending.pop()
        directories.append((remote_dir, mode))
        try:
            with os.scandir(here) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as err:
            tally.refused.append(f"{here}: its contents not copied: {err.strerror or err}")
            continue
        below = []
        for entry in entries:
            local = here / entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as err:  # in a directory the user can read but not search (0600)
                tally.refused.append(f"{local}: not copied: {err.strerror or err}")
                continue
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                tally.skipped.append(str(local))  # a symbolic link, a FIFO, a socket, a device
                continue
            if not _sendable(entry.name):
                # Found here, before any upload: the SDK refuses the path when it is sent, and that stopped
                # the copy half-way with exit 2 (until December 6).
                tally.refused.append(_unsendable(local))
                continue
            remote = posixpath.join(remote_dir, entry.name) if remote_dir else entry.name
            if stat.S_ISDIR(st.st_mode):
                below.append((local, remote, _directory_mode(st.st_mode, umask)))
            else:
                jobs.append(functools.partial(upload, local, remote, _upload_mode(st.st_mode, umask)))
        pending.extend(reversed(below))
    # Root-relative, as the file API takes every path (the SDK's `sanitize_path`: `/a/b` is `a/b` under the
    # sandbox's root, `..` refused): a command takes `/a/b` literally, outside the root - on the dev runner,
    # on the host - and the tree's empty directories were missing where its files went (until December 6).
    # Commands start in the root (both runtimes' working directory, spec §2.1), so these name the same place;
    # checked before anything is written.
    checked = [(sanitize_path(_api_path(d)) if d else "", mode) for d, mode in directories]
    # As `cp -r`: a directory already there keeps its mode, only one the copy makes gets its source's (until
    # December 7 every one but the top was chmodded: `cp src/. CLAIM:dir` made the sandbox's `dir/shared`,
    # 0755 and used by others, 0700). What is there is asked before anything is written.
    modes = [(d, mode) for d, mode in checked if d and mode != _RUNTIME_DIRECTORY_MODE]
    if top_exists:
        modes = [(d, mode) for d, mode in modes if d != checked[0][0]]
    if modes and top_exists is not False:
        assert commands is not None
        there = _present(commands, [d for d, _ in modes], timeout)
        modes = [(d, mode) for d, mode in modes if d not in there]
    sizes = [n for n in _run_all(jobs) if n >= 0]
    tally.files, tally.bytes = len(sizes), sum(sizes)
    # Made by the file API: a directory a file went into, and those above it. Any other (empty; or whose
    # files could not be read) by `mkdir -p` - the file APIs have none - of those with no directory below.
    parents = {posixpath.dirname(d) for d, _ in directories[1:]}
    empty = [
        c
        for (d, _), (c, _) in zip(directories, checked, strict=True)
        if c and d not in filled and d not in parents
    ]
    for paths in _split(empty, _MAX_COMMAND - len(shlex.join(["mkdir", "-p", "--"]))):
        assert commands is not None
        # Quoted for a shell (sandboxd) and for the legacy runtime's shell-like split alike.
        result = commands.run(shlex.join(["mkdir", "-p", "--", *paths]), timeout=timeout)
        if result.exit_code != 0:
            raise SandboxError(f"creating empty directories failed: {result.stderr.strip()}")
    for command in _chmod_commands(modes):
        assert commands is not None
        result = commands.run(command, timeout=timeout)
        if result.exit_code != 0:
            raise SandboxError(f"setting directory modes failed: {result.stderr.strip()}")
    return tally


def _directory_mode(mode: int, umask: int) -> int:
    """The mode to give an uploaded copy of a directory of `mode` (`st_mode`), as GNU `cp -r` without `-p`
    makes one: its permission bits and sticky bit less the umask of this process (the one copying), a set-id
    bit never. A 1777 directory became 0777 (no sticky bit: anyone could remove anyone's files), and a tree
    of 0777 (WSL's /mnt/c, a FAT stick) world-writable in the sandbox, until December 7."""
    return stat.S_IMODE(mode) & _DIRECTORY_BITS & ~umask


#: Prints the index of each argument that names something (a directory, a file, a symbolic link, dangling
#: or not): a POSIX `sh` script, run as `sh -c SCRIPT sh PATH...` on both runtimes (the legacy one has no
#: shell); indices, so that no name has to come back through the output intact.
_PRESENT_SCRIPT = (
    'i=0; for p in "$@"; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$i"; fi; i=$((i + 1)); done'
)


def _present(commands: CommandExecutor, directories: list[str], timeout: float) -> set[str]:
    """Which of `directories` (root-relative) the sandbox has: one command per `_MAX_COMMAND` bytes of paths
    (not one round trip per directory), its output a few bytes per one there."""
    head = ["sh", "-c", _PRESENT_SCRIPT, "sh"]
    there: set[str] = set()
    for paths in _split([f"./{d}" for d in directories], _MAX_COMMAND - len(shlex.join(head))):
        result = commands.run(shlex.join([*head, *paths]), timeout=timeout)
        if result.exit_code != 0:
            raise SandboxError(f"looking for directories already there failed: {result.stderr.strip()}")
        for line in result.stdout.split():
            # the sandbox is not trusted: an index it did not get is ignored
            if line.isdigit() and int(line) < len(paths):
                there.add(paths[int(line)][2:])
    return there


def _split(paths: list[str], room: int) -> list[list[str]]:
    """`paths` (in order) in as few runs as fit: each quoted for a shell, a space before each, at most `room`
    bytes (at least one path a run)."""
    runs: list[list[str]] = []
    size = room
    for path in paths:
        length = 1 + len(shlex.quote(path).encode("utf-8", "surrogateescape"))
        if size + length > room:
            runs.append([])
            size = 0
        runs[-1].append(path)
        size += length
    return runs


def _chmod_commands(modes: list[tuple[str, int]]) -> list[str]:
    """Commands that give each directory (root-relative, parents first) its mode, after everything is in it.

    One command per mode (more for more than `_MAX_COMMAND` bytes of paths), except for directories the
    owner cannot search (no `u+x`): those go last, deepest first, as a change below one of them needs that
    search - across commands too; their own contents are all written by then, so a directory without `u+w`
    (0500) is no obstacle. Run as `find DIR... -maxdepth 0 -type d -exec chmod`: `find` does not follow a
    symbolic link (`-P`, its default) and `-type d` passes over one, so a link the sandbox has where the tree
    has a directory (the files went through it) is left alone, not the directory it names chmodded. `./`
    before each path: `find` would take one starting with `-` for an expression.
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
    commands = []
    for mode, dirs in [*searchable.items(), *last]:
        tail = ["-maxdepth", "0", "-type", "d", "-exec", "chmod", f"{mode:04o}", "--", "{}", "+"]
        room = _MAX_COMMAND - len(shlex.join(["find", *tail]))
        commands += [shlex.join(["find", *run, *tail]) for run in _split([f"./{d}" for d in dirs], room)]
    return commands


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
    made: list[tuple[Path, FileEntry | None]] = []

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
        _make_directories(plan.directories, made)
        sizes = [n for n in _run_all([functools.partial(download, *pair) for pair in plan.files]) if n >= 0]
    finally:
        # also when the copy stops half-way, as `cp -r` does: what was made is not left at 0700 - stopped
        # while the directories were made too (a local file where the tree has a directory; until December 7
        # those made until then stayed 0700)
        _keep_directory_modes(made, umask, tally)
    tally.files, tally.bytes = len(sizes), sum(sizes)
    return tally


def _make_directories(
    directories: list[tuple[Path, FileEntry | None]], made: list[tuple[Path, FileEntry | None]]
) -> None:
    """Make the tree's directories (parents first); each made here (not one already there) is added to
    `made` as it is made, so that a failure half-way leaves what was made known.

    Each is made 0700 (less the umask) and gets its own mode only once its files are in it
    (`_keep_directory_modes`), as GNU `cp -r` does: a 0500 directory could not be written into, and a 0700
    one's files are not open to others while the copy runs.
    """
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


def _keep_directory_modes(made: list[tuple[Path, FileEntry | None]], umask: int, tally: _Tally) -> None:
    """Give each directory `made` its listed mode less the umask, deepest first: a parent the owner cannot
    search (no `u+x`) would stop the change below it. As `cp -r` makes a directory: the sticky bit kept, a
    set-id bit of the source's never - but the set-group-ID bit `mkdir` gave it under a local set-group-ID
    parent (a shared group's directory) kept, as `mkdir` keeps it. One listed without a mode (upstream's
    runtime lists none) gets what `mkdir` gives. A directory replaced by a symbolic link meanwhile is left
    alone: `chmod` would change what it names."""
    for directory, entry in reversed(made):
        listed = _listed_mode(entry, _DIRECTORY_BITS)
        mode = (0o777 if listed is None else listed) & ~umask
        try:
            now = os.lstat(directory).st_mode
            if stat.S_ISDIR(now):
                os.chmod(directory, mode | (now & stat.S_ISGID))
        except OSError as err:
            tally.unset.append(f"{directory}: its mode {mode:04o} not set: {err.strerror or err}")


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
