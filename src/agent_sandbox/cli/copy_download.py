"""`agent-sandbox cp`'s download of a sandbox's tree: listed whole first, every name checked (the sandbox is
not trusted) and a symbolic link loop told from a look-alike, then its directories made, its files read, and
the listed modes kept."""

from __future__ import annotations

import functools
import os
import posixpath
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from agent_sandbox_sdk import Sandbox, SandboxError, SandboxRequestError
from agent_sandbox_sdk.models import FileEntry

from .copy_transfers import _DIRECTORY_BITS, _FILE_BITS, _api_path, _run_all, _sendable, _Tally, _umask

#: Directory levels below a downloaded tree's top that are listed: a backstop for a symbolic link loop the
#: listing comparison cannot see (a directory changing while it is listed); deeper ones are named, not copied.
_MAX_DEPTH = 64

#: A mode as a sandbox lists it: `stat.S_IMODE` in four digits ("0755"; "2770" on a volume with an fsGroup,
#: where every directory is set-group-ID; "1777" sticky); anything else is ignored (the sandbox is not
#: trusted). Until December 7 only "0NNN" was taken: a private "2700" directory came out 0777 less the umask.
_LISTED_MODE = re.compile(r"^0?[0-7]{3,4}$")


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
