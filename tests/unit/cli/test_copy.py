"""`cp`'s handling of what a sandbox lists: the sandbox is untrusted, so a listed name is one path component."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import posixpath
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.cli.copy import copy
from agent_sandbox.cli.copy_download import _checked_name, _download_tree
from agent_sandbox.cli.copy_upload import _chmod_commands
from agent_sandbox_sdk import (
    SandboxConnectionError,
    SandboxError,
    SandboxRequestError,
    SandboxRequestTimeoutError,
)
from agent_sandbox_sdk._paths import sanitize_path
from agent_sandbox_sdk.models import FileEntry

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _usual_umask() -> Iterator[None]:
    """Umask 022 (restored after): the modes of what a test makes, and so what `cp` asks for, depend on it
    (under 002 a tree's directories are 0775, given their mode by a command)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "nul\0", "new\nline"])
def test_unusable_names_are_refused(name: str) -> None:
    with pytest.raises(SandboxError, match="unusable name"):
        _checked_name(name, "dir")


@pytest.mark.parametrize("name", ["a", ".hidden", "with space", "ü", "a..b", "a\\b", "\\"])
def test_plain_names_pass(name: str) -> None:
    assert _checked_name(name, "dir") == name


class _ListingFiles:
    """A sandbox's file API that lists `entries` for every directory (one that lies about its tree)."""

    def __init__(self, entries: list[FileEntry]) -> None:
        self.entries = entries
        self.read: list[tuple[str, Path]] = []

    def list(self, path: str, timeout: float) -> list[FileEntry]:
        return self.entries

    def read_to(self, path: str, destination: Path, timeout: float) -> int:
        self.read.append((path, destination))
        destination.write_bytes(b"x")
        return 1


def _entry(name: str, kind: str = "file") -> FileEntry:
    return FileEntry(name=name, size=1, type=kind, modified=datetime.now(UTC))


def test_a_listing_that_climbs_out_writes_nothing_outside(tmp_path: Path) -> None:
    """`..` is named and not copied; the rest is (until December 6 one such name failed the whole copy)."""
    files = _ListingFiles([_entry("ok.txt"), _entry("..", "directory"), _entry("a/b")])
    sandbox: Any = type("S", (), {"files": files})()
    target = tmp_path / "dest"
    tally = _download_tree(sandbox, "work", target, 10, "sb")
    assert tally.refused == [
        "work: not copied: the sandbox listed the name '..' (not one path component)",
        "work: not copied: the sandbox listed the name 'a/b' (not one path component)",
    ]
    assert files.read == [("work/ok.txt", target / "ok.txt")]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["dest", "dest/ok.txt"]


def test_a_directory_that_lists_what_an_ancestor_lists_is_a_loop_not_copied(tmp_path: Path) -> None:
    """Listings follow symbolic links: `d/up -> ..` lists as a directory at every level. It recursed until
    RecursionError, with ~1000 local directories made and no file copied (until December 6)."""
    listings = {
        "proj": [_entry("top"), _entry("d", "directory")],
        "proj/d": [_entry("in"), _entry("up", "directory")],
    }

    class Looping(_ListingFiles):
        listed: list[str]

        def list(self, path: str, timeout: float) -> list[FileEntry]:
            self.listed.append(path)
            # proj/d/up is proj again, proj/d/up/d is proj/d again, ...
            while path not in listings:
                path = path.replace("/d/up", "", 1)
            return listings[path]

    files = Looping([])
    files.listed = []
    sandbox: Any = type("S", (), {"files": files})()
    tally = _download_tree(sandbox, "proj", tmp_path / "down", 10, "sb")
    assert tally.refused == ["proj/d/up: not copied: it lists what sb:proj lists (a symbolic link loop)"]
    # proj/d/up is taken for proj again as proj/d, proj/d/up, ... keep repeating below it, to the depth limit
    below = ["proj/d/up"]
    for step in range(61):  # to depth 63 below proj: the walk would stop at 64
        below.append(posixpath.join(below[-1], ("d", "up")[step % 2]))
    assert files.listed == ["proj", "proj/d", *below]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "down", "down/d", "down/d/in", "down/top",
    ]  # fmt: skip


def test_a_tree_deeper_than_the_limit_is_named_not_followed(tmp_path: Path) -> None:
    """A backstop for a loop the comparison misses (its directories changing as they are listed)."""

    class Deepening(_ListingFiles):
        def list(self, path: str, timeout: float) -> list[FileEntry]:
            # a different listing at every level: never the same as an ancestor's
            return [_entry(f"f{path.count('/')}"), _entry("x", "directory")]

    sandbox: Any = type("S", (), {"files": Deepening([])})()
    tally = _download_tree(sandbox, "top", tmp_path / "down", 10, "sb")
    assert tally.refused == ["top" + "/x" * 64 + ": not copied: more than 64 directory levels deep"]
    assert tally.files == 64


class _FailingListing:
    """A sandbox's file API whose listing fails with `error` (a router that timed out, answered 5xx, refused)."""

    def __init__(self, error: SandboxError) -> None:
        self.error = error
        self.listed: list[str] = []
        self.written: list[str] = []
        self.read: list[str] = []

    def list(self, path: str, timeout: float) -> list[FileEntry]:
        self.listed.append(path)
        raise self.error

    def write(self, path: str, content: object, timeout: float, mode: int | None = None) -> None:
        self.written.append(path)

    def read_to(self, path: str, destination: object, timeout: float) -> int:
        self.read.append(path)
        return 0


def _args(src: str, dst: str) -> Any:
    return argparse.Namespace(src=src, dst=dst, namespace="ns", timeout=10.0)


def _client(files: _FailingListing) -> Any:
    sandbox = type("S", (), {"files": files, "commands": None})()
    return type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()


FAILURES = [
    SandboxRequestTimeoutError("GET /list/: timed out (ReadTimeout)"),
    SandboxConnectionError("GET /list/: no response (ConnectError)"),
    SandboxRequestError("router unavailable", 503),
    SandboxRequestError("forbidden", 403),
]


@pytest.mark.parametrize("error", FAILURES, ids=["timeout", "connection", "503", "403"])
def test_a_listing_that_fails_stops_an_upload_rather_than_guessing_the_name(
    error: SandboxError, tmp_path: Path
) -> None:
    """`cp file sb:dir` looks at what `dir` is first; a listing that failed was taken for "nothing there" (so
    the file could be written as `dir` itself, not into it), after the listing had spent the whole timeout
    that the upload then spent again (until December 6)."""
    local = tmp_path / "a.txt"
    local.write_text("x")
    files = _FailingListing(error)
    with pytest.raises(type(error)):
        copy(_client(files), _args(str(local), "sb:existing"))
    assert (files.listed, files.written) == ([""], [])


@pytest.mark.parametrize("error", FAILURES, ids=["timeout", "connection", "503", "403"])
def test_a_listing_that_fails_stops_a_download_at_once(error: SandboxError, tmp_path: Path) -> None:
    files = _FailingListing(error)
    with pytest.raises(type(error)):
        copy(_client(files), _args("sb:dir/a.txt", str(tmp_path)))
    assert (files.listed, files.read) == (["dir"], [])


def test_a_parent_that_is_not_there_is_nothing_there(tmp_path: Path) -> None:
    """A 404 for the parent's listing: nothing at the path (the upload creates it under that name)."""
    local = tmp_path / "a.txt"
    local.write_text("x")
    files = _FailingListing(SandboxRequestError("Path is not a directory", 404))
    assert copy(_client(files), _args(str(local), "sb:new/name.txt")) == 0
    assert (files.listed, files.written) == (["new"], ["new/name.txt"])


class _TreeSandbox:
    """A sandbox whose file API records writes (nothing at any path yet) and whose commands record what runs."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.ran: list[str] = []
        self.files = self
        self.commands = self

    def list(self, path: str, timeout: float) -> list[FileEntry]:
        raise SandboxRequestError("Path is not a directory", 404)

    def write(self, path: str, content: object, timeout: float, mode: int | None = None) -> None:
        self.written.append(path)

    def run(self, command: str, timeout: float, **kw: object) -> Any:
        self.ran.append(command)
        return type("R", (), {"exit_code": 0, "stdout": "", "stderr": ""})()  # nothing there


@pytest.mark.parametrize(
    ("destination", "under_the_root"),
    [("/abs/d3", "abs/d3"), ("//abs//d3/", "abs/d3"), ("rel/d3", "rel/d3"), ("/", "tree"), ("/.", "tree")],
)
def test_empty_directories_go_where_the_files_go(
    destination: str, under_the_root: str, tmp_path: Path
) -> None:
    """The file API takes `/abs/d3/f` as `abs/d3/f` under the sandbox's root; the empty directories were made
    by `mkdir -p -- /abs/d3/...`, which a command takes literally: outside the root (on the dev runner, on
    the host), and the copy's empty directories were missing from the tree its files went to (December 6)."""
    tree = tmp_path / "tree"
    (tree / "sub" / "empty").mkdir(parents=True)
    (tree / "blank").mkdir()
    (tree / "sub" / "f.txt").write_text("x")
    sandbox = _TreeSandbox()
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()
    assert copy(client, _args(str(tree), f"sb:{destination}")) == 0
    prefix = f"{under_the_root}/" if under_the_root else ""
    (written,) = sandbox.written
    assert sanitize_path(written) == f"{prefix}sub/f.txt"  # where the file API puts it
    assert sandbox.ran == [f"mkdir -p -- {prefix}blank {prefix}sub/empty"]  # in name order


def test_empty_directories_never_climb_out_of_the_root(tmp_path: Path) -> None:
    """The mkdir's paths are checked as the file API's are: `..` is refused before anything is written (the
    SDK's listing of the destination refuses it first today; this fake's does not)."""
    tree = tmp_path / "tree"
    (tree / "e").mkdir(parents=True)
    sandbox = _TreeSandbox()
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()
    with pytest.raises(ValueError, match=r"'\.\.'"):
        copy(client, _args(str(tree), "sb:../x"))
    assert sandbox.ran == []


@pytest.mark.parametrize("root", ["/", "/.", "/tmp/..", "."])
def test_an_empty_directorys_contents_to_the_root_however_spelled(root: str, tmp_path: Path) -> None:
    """`cp EMPTY/. sb:/` : the root spelled `/` reached the mkdir's path check as a path naming no file and
    the copy exited 2 (a review of the root-relative mkdir, December 6); nothing is to be made."""
    tree = tmp_path / "tree"
    tree.mkdir()
    sandbox = _TreeSandbox()
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()
    assert copy(client, _args(f"{tree}/.", f"sb:{root}")) == 0
    assert sandbox.written == []


class _TreeListing(_ListingFiles):
    """A sandbox's file API over a fixed tree: `listings` maps each directory to its entries."""

    def __init__(self, listings: dict[str, list[FileEntry]]) -> None:
        super().__init__([])
        self.listings = listings
        self.listed: list[str] = []

    def list(self, path: str, timeout: float) -> list[FileEntry]:
        self.listed.append(path)
        if path not in self.listings:
            raise SandboxRequestError("not a directory", status_code=404)
        return self.listings[path]


_STAMP = datetime(2026, 12, 6, tzinfo=UTC)


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_nested_directories_of_one_name_that_list_alike_are_no_loop(depth: int, tmp_path: Path) -> None:
    """`mkdir -p x/x/...` (or a tar, a reproducible build: one modification time for every directory) makes
    directories that list exactly as their parent until the last: `out` lists `x`, `out/x` lists `x`, with
    the same size, mode and time. Each was taken for a symbolic link loop of the one above it, and the whole
    chain - with the files at its end - was not copied, exit 1 (ef087c0). A loop is one only when it goes on
    repeating."""
    same = FileEntry(name="x", size=4096, type="directory", modified=_STAMP, mode="0755")
    chain = ["out", *("out" + "/x" * level for level in range(1, depth))]
    listings = {path: [same] for path in chain}
    listings["out" + "/x" * depth] = [FileEntry(name="f", size=1, type="file", modified=_STAMP)]
    files = _TreeListing(listings)
    sandbox: Any = type("S", (), {"files": files})()
    tally = _download_tree(sandbox, "out", tmp_path / "down", 10, "sb")
    assert tally.refused == []
    assert files.read == [("out" + "/x" * depth + "/f", tmp_path / "down" / Path(*["x"] * depth) / "f")]
    assert tally.files == 1
    assert sorted(files.listed) == sorted(listings)  # each listed once: what the check read, the walk reuses


def test_a_loop_below_the_sandboxs_root_spelled_slash_is_found(tmp_path: Path) -> None:
    """The top as `/`: its children are `/d`, `/d/up`; the names between it and a loop are found alike."""
    top = [FileEntry(name="d", size=4096, type="directory", modified=_STAMP)]
    d = [FileEntry(name="up", size=4096, type="directory", modified=_STAMP), _entry("in")]

    class Looping(_TreeListing):
        def list(self, path: str, timeout: float) -> list[FileEntry]:
            self.listed.append(path)
            return top if path == "/" or path.endswith("/up") else d  # /d/up is / again

    files = Looping({})
    sandbox: Any = type("S", (), {"files": files})()
    tally = _download_tree(sandbox, "/", tmp_path / "down", 10, "sb")
    assert tally.refused == ["/d/up: not copied: it lists what sb:/ lists (a symbolic link loop)"]
    assert [path for path, _ in files.read] == ["/d/in"]


def test_a_name_of_spaces_at_the_top_of_the_sandbox_is_copied(tmp_path: Path) -> None:
    """`sanitize_path` refuses a path of only whitespace (upstream's rule, 9abf078), but ` ` is a file name a
    listing gives: a download of the sandbox's root stopped at it (ValueError, nothing copied after)."""

    class Sanitizing(_TreeListing):
        def read_to(self, path: str, destination: Path, timeout: float) -> int:
            return super().read_to(sanitize_path(path), destination, timeout)  # as the SDK's read_to

    files = Sanitizing({".": [_entry(" "), _entry("a")]})
    sandbox: Any = type("S", (), {"files": files})()
    tally = _download_tree(sandbox, ".", tmp_path / "down", 10, "sb")
    assert (tally.files, tally.refused, tally.vanished) == (2, [], [])
    assert sorted(path for path, _ in files.read) == [" ", "a"]
    assert (tmp_path / "down" / " ").read_bytes() == b"x"


def _chmods(ran: list[str]) -> list[tuple[str, list[str]]]:
    """(mode, directories) of each `find DIR... -maxdepth 0 -type d -exec chmod MODE -- {} +` that ran."""
    found = []
    for command in ran:
        words = shlex.split(command)
        if words[0] == "find":
            cut = words.index("-maxdepth")
            assert words[cut:] == [
                "-maxdepth",
                "0",
                "-type",
                "d",
                "-exec",
                "chmod",
                words[-4],
                "--",
                "{}",
                "+",
            ]
            found.append((words[-4], words[1:cut]))
    return found


def test_an_uploaded_tree_keeps_its_directories_modes_set_after_their_contents(tmp_path: Path) -> None:
    """A private 0700 directory arrived 0755 (the runtime's), open to every user of the sandbox: `cp` keeps
    a directory's mode as `cp -r` does. Set once everything is in (a 0500 one could not be written into
    after), and those the owner cannot search (0600) last (deepest first: see the next test). As any user:
    only root reads what is in a 0600 directory (until December 7 this test passed only as root)."""
    tree = tmp_path / "tree"
    for sub in ("sub/deep", "ro", "emptyd", "plain", "closed"):
        (tree / sub).mkdir(parents=True)
    (tree / "sub" / "deep" / "f").write_text("x")
    (tree / "ro" / "f").write_text("x")
    modes = {"": 0o750, "sub": 0o700, "ro": 0o500, "emptyd": 0o700, "closed": 0o600}
    sandbox = _TreeSandbox()
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()
    try:
        for sub, mode in sorted(modes.items(), key=lambda kv: -kv[0].count("/")):
            (tree / sub).chmod(mode)
        assert copy(client, _args(str(tree), "sb:dest")) == 0
    finally:
        for sub in modes:
            (tree / sub).chmod(0o755)
    assert sandbox.ran[0] == "mkdir -p -- dest/closed dest/emptyd dest/plain"  # made before any mode is set
    assert _chmods(sandbox.ran) == [
        ("0750", ["./dest"]),
        ("0700", ["./dest/emptyd", "./dest/sub"]),
        ("0500", ["./dest/ro"]),  # searchable: any time after its file is in
        ("0600", ["./dest/closed"]),
    ]
    assert len(sandbox.ran) == 5  # `dest` was not there: nothing under it is, no need to ask


def test_directories_the_owner_cannot_search_are_set_last_deepest_first() -> None:
    """A change below a directory without `u+x` needs its search: those go last, deepest first, consecutive
    ones of a mode in one command."""
    modes = [
        ("dest", 0o750),
        ("dest/closed", 0o600),
        ("dest/closed/inner", 0o600),
        ("dest/closed/inner2", 0o640),
        ("dest/sub", 0o700),
        ("dest/closed/inner/x", 0o600),
    ]
    assert _chmods(_chmod_commands(modes)) == [
        ("0750", ["./dest"]),
        ("0700", ["./dest/sub"]),
        ("0600", ["./dest/closed/inner/x", "./dest/closed/inner"]),  # chmod takes them in order
        ("0640", ["./dest/closed/inner2"]),
        ("0600", ["./dest/closed"]),
    ]


@pytest.mark.parametrize(
    ("source", "destination"), [("tree/.", "sb:/"), ("tree/.", "sb:."), ("tree", "sb:/")]
)
def test_an_uploaded_tree_leaves_the_sandboxs_root_mode_alone(
    source: str, destination: str, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "f").write_text("x")
    (tree / "d").chmod(0o700)
    tree.chmod(0o700)
    sandbox = _TreeSandbox()
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()
    assert copy(client, _args(f"{tmp_path}/{source}", destination)) == 0
    prefix = "" if source.endswith(".") else "tree/"
    top = [] if source.endswith(".") else [f"./{prefix}".rstrip("/")]
    assert _chmods(sandbox.ran) == [("0700", [*top, f"./{prefix}d"])]


def test_an_uploaded_trees_contents_leave_an_existing_destinations_mode_alone(tmp_path: Path) -> None:
    """`cp -r src/. dir` gives `dir`, which exists, no mode; made by the copy, it gets the source's."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_text("x")
    tree.chmod(0o700)
    there = _TreeSandbox()
    there.list = lambda path, timeout: [FileEntry(name="dir", size=0, type="directory", modified=_STAMP)]  # type: ignore[method-assign]
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: there})()
    assert copy(client, _args(f"{tree}/.", "sb:dir")) == 0
    assert there.ran == []
    absent = _TreeSandbox()
    client = type("C", (), {"get_sandbox": lambda self, claim, namespace: absent})()
    assert copy(client, _args(f"{tree}/.", "sb:dir")) == 0
    assert _chmods(absent.ran) == [("0700", ["./dir"])]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_downloaded_tree_keeps_its_directories_modes_less_the_umask(tmp_path: Path) -> None:
    """Every directory came out 0755 (mkdir's), whatever the sandbox listed: a private 0700 one was open to
    every local user. Each is made 0700 while its files are written (a 0500 one could not be written into),
    then given its listed mode less the umask, deepest first; one listed without a mode gets mkdir's."""

    def d(name: str, mode: str | None) -> FileEntry:
        return FileEntry(name=name, size=4096, type="directory", modified=_STAMP, mode=mode)

    listings = {
        "tree": [
            d("sub", "0700"),
            d("ro", "0500"),
            d("emptyd", "0700"),
            d("plain", None),
            d("closed", "0600"),
        ],
        "tree/sub": [d("deep", "0755")],
        "tree/sub/deep": [_entry("f")],
        "tree/ro": [_entry("f")],
        "tree/emptyd": [],
        "tree/plain": [],
        "tree/closed": [d("inner", "0750")],
        "tree/closed/inner": [_entry("f")],
    }
    seen: dict[str, int] = {}

    class Recording(_TreeListing):
        def read_to(self, path: str, destination: Path, timeout: float) -> int:
            seen[path] = _mode(destination.parent)  # while the copy runs
            return super().read_to(path, destination, timeout)

    sandbox: Any = type("S", (), {"files": Recording(listings)})()
    down = tmp_path / "down"
    old = os.umask(0o027)
    try:
        tally = _download_tree(sandbox, "tree", down, 10, "sb", d("tree", "2700"))
    finally:
        os.umask(old)
    try:
        assert (tally.files, tally.refused, tally.unset) == (3, [], [])
        assert seen == {"tree/sub/deep/f": 0o700, "tree/ro/f": 0o700, "tree/closed/inner/f": 0o700}
        # read as any user can (`rglob` cannot see into the 0600 one but as root: until December 7 this test
        # passed only as root)
        assert _tree_modes(down) == {
            ".": 0o700,  # 2700 less 027, no set-id bit (not 0777 less 027, what an unread mode gives)
            "sub": 0o700,
            "sub/deep/f": 0o640,
            "ro/f": 0o640,
            "closed/inner/f": 0o640,
            "sub/deep": 0o750,
            "ro": 0o500,
            "emptyd": 0o700,
            "plain": 0o750,
            "closed": 0o600,
            "closed/inner": 0o750,
        }
    finally:
        for p in [down, *down.iterdir()]:
            p.chmod(0o755)


def test_a_downloaded_tree_leaves_directories_already_there_alone(tmp_path: Path) -> None:
    """As `cp -r`: a directory that exists keeps its mode, and one that is a symbolic link to a directory is
    written through, never chmodded (that would change the directory it names)."""
    listings = {
        "tree": [FileEntry(name="sub", size=0, type="directory", modified=_STAMP, mode="0700")],
        "tree/sub": [_entry("f")],
    }
    sandbox: Any = type("S", (), {"files": _TreeListing(listings)})()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    elsewhere.chmod(0o755)
    down = tmp_path / "down"
    down.mkdir()
    down.chmod(0o755)
    (down / "sub").symlink_to(elsewhere)
    top = FileEntry(name="tree", size=0, type="directory", modified=_STAMP, mode="0700")
    tally = _download_tree(sandbox, "tree", down, 10, "sb", top)
    assert (tally.files, tally.unset) == (1, [])
    assert (_mode(down), _mode(elsewhere)) == (0o755, 0o755)
    assert (elsewhere / "f").read_bytes() == b"x"


# --- a review of 74c9dba (December 7): commands that fit, four-digit modes, directories already there, the
# sticky bit and the umask, a download stopped while making directories, a local tree not all readable.


class _LocalSandbox:
    """A sandbox whose root is the local directory `root`: its file API writes and lists there as a runtime
    does (a parent it makes is 0755, a file the mode asked or 0644), and its commands run there through
    `/bin/sh -c` as sandboxd runs them, under the runtime's umask 022 - a command over Linux's 128 KiB for one
    argument fails to start (E2BIG), as it does in a sandbox."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = self
        self.commands = self
        self.ran: list[str] = []
        root.mkdir(exist_ok=True)

    def _path(self, path: str) -> Path:
        clean = sanitize_path(path) if path.strip("/.") else ""
        return self.root / clean if clean else self.root

    def list(self, path: str, timeout: float) -> list[FileEntry]:
        where = self._path(path)
        if not where.is_dir():
            raise SandboxRequestError("Path is not a directory", 404)
        entries = []
        for child in sorted(where.iterdir()):
            st = child.stat()
            kind = "directory" if stat.S_ISDIR(st.st_mode) else "file"
            mode = f"{stat.S_IMODE(st.st_mode):04o}"
            entries.append(FileEntry(name=child.name, size=st.st_size, type=kind, modified=_STAMP, mode=mode))
        return entries

    def write(self, path: str, content: Any, timeout: float, mode: int | None = None) -> None:
        where = self._path(path)
        missing = [p for p in [where.parent, *where.parent.parents] if not p.exists()]
        for parent in reversed(missing):
            try:
                parent.mkdir()
            except FileExistsError:
                continue  # made by a write running alongside
            parent.chmod(0o755)
        where.write_bytes(content.read())
        where.chmod(0o644 if mode is None else mode)

    def run(self, command: str, timeout: float, **kw: object) -> Any:
        self.ran.append(command)
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command], cwd=self.root, capture_output=True, text=True, umask=0o022
            )
        except OSError as err:  # E2BIG: the runtime could not start it
            return type("R", (), {"exit_code": 126, "stdout": "", "stderr": str(err)})()
        return type("R", (), {"exit_code": done.returncode, "stdout": done.stdout, "stderr": done.stderr})()


def _client_of(sandbox: object) -> Any:
    return type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()


@pytest.fixture
def umask() -> Callable[[int], int]:
    """Set this process's umask for the test (`_usual_umask` restores it)."""
    return os.umask


def _tree_modes(top: Path) -> dict[str, int]:
    """Every mode under `top` (its own as "."), read as any user can: a directory the owner cannot search
    (0600) is given u+rwx while what is below it is read, then its mode back."""
    found: dict[str, int] = {}

    def visit(here: Path, rel: str) -> None:
        mode = here.lstat().st_mode
        found[rel] = stat.S_IMODE(mode)
        if stat.S_ISDIR(mode):
            here.chmod(stat.S_IMODE(mode) | stat.S_IRWXU)
            try:
                for child in sorted(here.iterdir()):
                    visit(child, child.name if rel == "." else f"{rel}/{child.name}")
            finally:
                here.chmod(stat.S_IMODE(mode))

    visit(top, ".")
    return found


def _opened(top: Path) -> None:
    """Give everything under `top` u+rwx (a directory the owner cannot search could not be removed)."""
    subprocess.run(["chmod", "-R", "u+rwx", str(top)], check=True)


def test_directory_commands_of_a_big_tree_each_fit_one_argument(
    tmp_path: Path, umask: Callable[[int], int]
) -> None:
    """Every directory of one mode went into one `find ... -exec chmod` (and every empty one into one `mkdir
    -p`), which sandboxd runs as `/bin/sh -c COMMAND`: Linux takes at most 128 KiB in one argument, so a
    node_modules of ~2,000 directories (0775 under umask 002) failed with E2BIG once every file was sent."""
    umask(0o002)
    tree = tmp_path / "tree"
    for i in range(700):
        pkg = tree / "node_modules" / f"package-with-a-long-name-{i:05d}-{'x' * 60}" / "lib"
        pkg.mkdir(parents=True)
        (pkg / "index.js").write_text("x")
        (pkg.parent / "empty-directory-of-its-own").mkdir()
    (tree / "node_modules" / "private").mkdir()
    (tree / "node_modules" / "private").chmod(0o700)
    sandbox = _LocalSandbox(tmp_path / "sandbox")
    assert copy(_client_of(sandbox), _args(str(tree), "sb:dest")) == 0
    assert max(len(command.encode()) for command in sandbox.ran) <= 64 * 1024
    assert len(sandbox.ran) < 10  # a few commands, not one per directory
    dest = sandbox.root / "dest" / "node_modules"
    assert _mode(dest / f"package-with-a-long-name-00699-{'x' * 60}" / "empty-directory-of-its-own") == 0o775
    assert _mode(dest / f"package-with-a-long-name-00000-{'x' * 60}" / "lib") == 0o775
    assert _mode(dest / "private") == 0o700
    assert len(list(dest.iterdir())) == 701


def test_closed_directories_stay_deepest_first_across_commands() -> None:
    """Directories the owner cannot search are set deepest first (a change below one needs its search): also
    when there are too many for one command."""
    modes = [(f"a/{'b/' * (i % 7)}dir-{i:05d}-" + "x" * 60, 0o600 if i % 3 else 0o640) for i in range(4000)]
    modes += [(f"open/dir-{i:05d}-" + "y" * 60, 0o700) for i in range(3000)]
    commands = _chmod_commands(modes)
    assert max(len(command.encode()) for command in commands) <= 64 * 1024
    assert len(commands) > 2
    order = [
        (words[-4], d) for words in map(shlex.split, commands) for d in words[1 : words.index("-maxdepth")]
    ]
    assert sorted(order) == sorted((f"{m:04o}", f"./{d}") for d, m in modes)
    closed = [d for m, d in order if m != "0700"]
    assert [d for m, d in order if m == "0700"] == [f"./{d}" for d, m in modes if m == 0o700]
    assert order[: len(modes) - len(closed)] == [(m, d) for m, d in order if m == "0700"]  # searchable first
    depths = [d.count("/") for d in closed]
    assert depths == sorted(depths, reverse=True)


def test_empty_directories_are_made_by_commands_that_fit_one_argument(
    tmp_path: Path, umask: Callable[[int], int]
) -> None:
    tree = tmp_path / "tree"
    for i in range(1200):
        (tree / f"an-empty-directory-with-a-long-name-{i:05d}-{'y' * 80}" / "below").mkdir(parents=True)
    sandbox = _LocalSandbox(tmp_path / "sandbox")
    assert copy(_client_of(sandbox), _args(str(tree), "sb:dest")) == 0
    assert max(len(command.encode()) for command in sandbox.ran) <= 64 * 1024
    assert len(list((sandbox.root / "dest").iterdir())) == 1200
    assert (
        sandbox.root / "dest" / f"an-empty-directory-with-a-long-name-01199-{'y' * 80}" / "below"
    ).is_dir()


def test_a_downloaded_tree_keeps_four_digit_listed_modes_without_set_id_bits(
    tmp_path: Path, umask: Callable[[int], int]
) -> None:
    """The runtimes list `stat.S_IMODE` as four digits ("2770" on an fsGroup volume, where every directory is
    set-group-ID; "1777" for a sticky one): only "0NNN" was taken, so a private "2700" directory came out
    0777 less the umask, readable by every local user; a set-id file's mode was ignored likewise. Kept now
    less the umask, the sticky bit of a directory too (as `cp -r`), a set-id bit never."""
    umask(0o022)

    def d(name: str, mode: str) -> FileEntry:
        return FileEntry(name=name, size=4096, type="directory", modified=_STAMP, mode=mode)

    def f(name: str, mode: str) -> FileEntry:
        return FileEntry(name=name, size=1, type="file", modified=_STAMP, mode=mode)

    listings = {
        "tree": [d("private", "2700"), d("group", "2770"), d("shared", "1777"), f("tool", "4755")],
        "tree/private": [f("secret", "2640")],
        "tree/group": [],
        "tree/shared": [],
    }
    sandbox: Any = type("S", (), {"files": _TreeListing(listings)})()
    down = tmp_path / "down"
    tally = _download_tree(sandbox, "tree", down, 10, "sb", d("tree", "2750"))
    assert (tally.files, tally.refused, tally.unset) == (2, [], [])
    assert _tree_modes(down) == {
        ".": 0o750,
        "private": 0o700,
        "private/secret": 0o640,
        "group": 0o750,
        "shared": 0o1755,
        "tool": 0o755,
    }


def test_an_upload_leaves_directories_the_sandbox_has_alone(
    tmp_path: Path, umask: Callable[[int], int]
) -> None:
    """As `cp -r`: a directory already there keeps its mode; one the copy makes gets its source's. Every
    directory of the tree but the top was chmodded, one the sandbox had (used by others, 0755) made 0700."""
    umask(0o022)
    src = tmp_path / "src"
    for sub in ("shared/new", "fresh"):
        (src / sub).mkdir(parents=True)
        (src / sub / "f").write_text("x")
    for sub in ("shared/new", "shared", "fresh", ""):
        (src / sub).chmod(0o700)
    sandbox = _LocalSandbox(tmp_path / "sandbox")
    (sandbox.root / "dir" / "shared").mkdir(parents=True)
    (sandbox.root / "dir" / "src").mkdir()
    for there in ("dir/shared", "dir/src", "dir"):
        (sandbox.root / there).chmod(0o755)
    # the contents into `dir`: `dir/shared` was there, `dir/shared/new` and `dir/fresh` are new
    assert copy(_client_of(sandbox), _args(f"{src}/.", "sb:dir")) == 0
    modes = _tree_modes(sandbox.root / "dir")
    assert {k: v for k, v in modes.items() if "/" not in k or k.startswith("shared/new")} == {
        ".": 0o755, "shared": 0o755, "shared/new": 0o700, "shared/new/f": 0o644, "fresh": 0o700, "src": 0o755,
    }  # fmt: skip
    # `src` into `dir`, where `dir/src` is: it keeps its mode, what is made below it gets the source's
    assert copy(_client_of(sandbox), _args(str(src), "sb:dir")) == 0
    modes = _tree_modes(sandbox.root / "dir" / "src")
    assert (modes["."], modes["shared"], modes["shared/new"], modes["fresh"]) == (0o755, 0o700, 0o700, 0o700)
    # to a destination that is not there, nothing is: no command asks
    fresh = _LocalSandbox(tmp_path / "fresh")
    assert copy(_client_of(fresh), _args(str(src), "sb:new")) == 0
    assert all(command.startswith("find ") for command in fresh.ran)
    assert _tree_modes(fresh.root / "new")["."] == 0o700


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_an_upload_keeps_the_sticky_bit_less_the_umask(
    mask: int, tmp_path: Path, umask: Callable[[int], int]
) -> None:
    """`cp -r` makes a directory with its source's mode less the umask, the sticky bit kept, a set-id bit
    never: a 1777 directory became 0777 (`& 0o777`: no sticky bit, anyone could remove anyone's files), and
    a tree of 0777 (WSL's /mnt/c, a FAT stick) was world-writable in the sandbox, its files too."""
    umask(mask)
    tree = tmp_path / "tree"
    for sub in ("sticky", "open", "setgid"):
        (tree / sub).mkdir(parents=True)
        (tree / sub / "f").write_text("x")
        (tree / sub / "f").chmod(0o777)
    (tree / "sticky").chmod(0o1777)
    (tree / "open").chmod(0o777)
    (tree / "setgid").chmod(0o2750)
    tree.chmod(0o755)
    sandbox = _LocalSandbox(tmp_path / "sandbox")
    assert copy(_client_of(sandbox), _args(str(tree), "sb:dest")) == 0
    got = _tree_modes(sandbox.root / "dest")
    assert got == {
        ".": 0o755 & ~mask,
        "sticky": 0o1777 & ~mask,
        "sticky/f": 0o777 & ~mask,
        "open": 0o777 & ~mask,
        "open/f": 0o777 & ~mask,
        "setgid": 0o750 & ~mask,
        "setgid/f": 0o777 & ~mask,
    }


def test_a_download_stopped_while_making_directories_gives_those_made_their_modes(
    tmp_path: Path, umask: Callable[[int], int]
) -> None:
    """A local file where the tree has a directory stops the copy as it makes directories: those made until
    then were left 0700 (their modes were set only for a stop in the file phase)."""
    umask(0o022)

    def d(name: str) -> FileEntry:
        return FileEntry(name=name, size=4096, type="directory", modified=_STAMP, mode="0755")

    listings = {"t": [d("a"), d("b")], "t/a": [_entry("x")], "t/b": [_entry("y")]}
    sandbox: Any = type("S", (), {"files": _TreeListing(listings)})()
    down = tmp_path / "down"
    down.mkdir()
    (down / "b").write_text("a local file where the tree has a directory")
    with pytest.raises(FileExistsError):
        _download_tree(sandbox, "t", down, 10, "sb", d("t"))
    assert _mode(down / "a") == 0o755


def _as_a_user(body: Callable[[], None]) -> None:
    """Run `body` as a user the kernel checks permissions for: root (CAP_DAC_OVERRIDE) reads a 0600
    directory's entries and a 0000 file, and would not see what `cp` does for everyone else. As root, in a
    child process that is `nobody` (65534)."""
    if os.geteuid() != 0:
        body()
        return
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the test failed as user 65534 (its traceback: above)"


def test_an_upload_names_what_it_cannot_read_and_copies_the_rest() -> None:
    """A directory the user cannot search (0600): `is_symlink()` of its entries raised PermissionError and the
    whole upload stopped with a traceback, for everyone but root. As GNU `cp -r`: each entry that cannot be
    read is named (its directory made, with its mode), the rest copied, exit 1."""

    def body() -> None:
        work = Path(tempfile.mkdtemp(prefix="cp-unreadable-"))
        try:
            tree = work / "tree"
            for sub in ("ok", "closed/inner", "unlisted"):
                (tree / sub).mkdir(parents=True)
            (tree / "ok" / "f").write_text("ok")
            (tree / "closed" / "g").write_text("g")
            (tree / "closed" / "inner" / "h").write_text("h")
            (tree / "unlisted" / "i").write_text("i")
            (tree / "secret").write_text("s")
            (tree / "secret").chmod(0)
            (tree / "closed").chmod(0o600)
            (tree / "unlisted").chmod(0o300)
            sandbox = _LocalSandbox(work / "sandbox")
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = copy(_client_of(sandbox), _args(str(tree), "sb:dest"))
            lines = err.getvalue().splitlines()
            assert code == 1, lines
            assert f"error: {tree / 'closed' / 'g'}: not copied: Permission denied" in lines
            assert f"error: {tree / 'closed' / 'inner'}: not copied: Permission denied" in lines
            assert f"error: {tree / 'secret'}: not copied: Permission denied" in lines
            assert f"error: {tree / 'unlisted'}: its contents not copied: Permission denied" in lines
            assert lines[-1] == f"{tree} -> sb:dest (1 file, 2 bytes)"
            dest = sandbox.root / "dest"
            assert (dest / "ok" / "f").read_text() == "ok"
            assert (_mode(dest / "closed"), _mode(dest / "unlisted")) == (0o600, 0o300)
            assert not (dest / "secret").exists()
        finally:
            _opened(work)
            shutil.rmtree(work)

    _as_a_user(body)


def test_a_downloaded_directory_keeps_the_set_group_id_bit_its_local_parent_gives(
    tmp_path: Path, umask: Callable[[int], int]
) -> None:
    """Under a local set-group-ID directory (a group's shared one) `mkdir` makes one set-group-ID too, as
    `cp -r` leaves it; the mode set once its files were in cleared that bit (the sandbox's own set-id bits
    are never copied)."""
    umask(0o022)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    listings = {"t": [FileEntry(name="sub", size=0, type="directory", modified=_STAMP, mode="0700")]}
    listings["t/sub"] = [_entry("f")]
    sandbox: Any = type("S", (), {"files": _TreeListing(listings)})()
    top = FileEntry(name="t", size=0, type="directory", modified=_STAMP, mode="0750")
    tally = _download_tree(sandbox, "t", shared / "t", 10, "sb", top)
    assert (tally.files, tally.unset) == (1, [])
    assert (_mode(shared / "t"), _mode(shared / "t" / "sub")) == (0o2750, 0o2700)
