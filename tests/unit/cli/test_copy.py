"""`cp`'s handling of what a sandbox lists: the sandbox is untrusted, so a listed name is one path component."""

from __future__ import annotations

import argparse
import os
import posixpath
import shlex
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.cli.copy import _checked_name, _download_tree, copy
from agent_sandbox_sdk import (
    SandboxConnectionError,
    SandboxError,
    SandboxRequestError,
    SandboxRequestTimeoutError,
)
from agent_sandbox_sdk._paths import sanitize_path
from agent_sandbox_sdk.models import FileEntry

pytestmark = pytest.mark.unit


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
        return type("R", (), {"exit_code": 0, "stderr": ""})()


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
    after), and those the owner cannot search (0600) last, deepest first: a change below one needs it."""
    tree = tmp_path / "tree"
    for sub in ("sub/deep", "ro", "emptyd", "plain", "closed/inner", "closed/inner2"):
        (tree / sub).mkdir(parents=True)
    (tree / "sub" / "deep" / "f").write_text("x")
    (tree / "ro" / "f").write_text("x")
    (tree / "closed" / "inner" / "f").write_text("x")
    (tree / "closed" / "inner2" / "f").write_text("x")
    modes = {"": 0o750, "sub": 0o700, "ro": 0o500, "emptyd": 0o700, "closed": 0o600, "closed/inner": 0o600}
    modes |= {"closed/inner2": 0o640}
    sandbox = _TreeSandbox()
    client: Any = type("C", (), {"get_sandbox": lambda self, claim, namespace: sandbox})()
    try:
        for sub, mode in sorted(modes.items(), key=lambda kv: -kv[0].count("/")):
            (tree / sub).chmod(mode)
        assert copy(client, _args(str(tree), "sb:dest")) == 0
    finally:
        for sub in modes:
            (tree / sub).chmod(0o755)
    assert sandbox.ran[0] == "mkdir -p -- dest/emptyd dest/plain"  # made before any mode is set
    assert _chmods(sandbox.ran) == [
        ("0750", ["./dest"]),
        ("0700", ["./dest/emptyd", "./dest/sub"]),
        ("0500", ["./dest/ro"]),  # searchable: any time after its file is in
        ("0600", ["./dest/closed/inner"]),
        ("0640", ["./dest/closed/inner2"]),
        ("0600", ["./dest/closed"]),
    ]
    assert len(sandbox.ran) == 7


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
        tally = _download_tree(sandbox, "tree", down, 10, "sb", d("tree", "2775"))
    finally:
        os.umask(old)
    try:
        assert (tally.files, tally.refused, tally.unset) == (3, [], [])
        assert seen == {"tree/sub/deep/f": 0o700, "tree/ro/f": 0o700, "tree/closed/inner/f": 0o700}
        got = {p.relative_to(down).as_posix(): _mode(p) for p in [down, *down.rglob("*")] if p.is_dir()}
        assert got == {
            ".": 0o750,  # 2775 less 027, no set-id bit
            "sub": 0o700,
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
