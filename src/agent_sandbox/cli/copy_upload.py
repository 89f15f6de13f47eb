"""`agent-sandbox cp`'s upload of a local tree into a sandbox: walked as `cp -r` walks it (symbolic links
and what cannot be read or sent named, not copied), its files sent, then its empty directories made and its
directories' modes set by commands run in the sandbox - asked first which are there already, none of the
commands longer than `_MAX_COMMAND` bytes."""

from __future__ import annotations

import functools
import os
import posixpath
import shlex
import stat
from collections.abc import Callable
from pathlib import Path

from agent_sandbox_sdk import Sandbox, SandboxError
from agent_sandbox_sdk._paths import sanitize_path
from agent_sandbox_sdk.sandbox import CommandExecutor

from .copy_transfers import _DIRECTORY_BITS, _FILE_BITS, _api_path, _run_all, _sendable, _Tally, _umask

#: What a runtime writes when no mode is given: no need to ask for it.
_DEFAULT_MODE = 0o644
#: What a runtime makes a directory with (the file APIs' parents, `mkdir -p`, under the usual umask 022): an
#: uploaded directory of another mode is given it once its contents are in.
_RUNTIME_DIRECTORY_MODE = 0o755

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


def _unsendable(local: Path) -> str:
    # repr: the name's newline would otherwise break the line that names it
    return f"{str(local)!r}: not copied: a name with a control character, which no sandbox file API takes"
