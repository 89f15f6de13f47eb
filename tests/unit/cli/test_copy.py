"""`cp`'s handling of what a sandbox lists: the sandbox is untrusted, so a listed name is one path component."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.cli.copy import _checked_name, _download_tree
from agent_sandbox_sdk import SandboxError
from agent_sandbox_sdk.models import FileEntry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\\b", "nul\0"])
def test_unusable_names_are_refused(name: str) -> None:
    with pytest.raises(SandboxError, match="unusable name"):
        _checked_name(name, "dir")


@pytest.mark.parametrize("name", ["a", ".hidden", "with space", "ü", "a..b"])
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
    files = _ListingFiles([_entry("ok.txt"), _entry("..", "directory")])
    sandbox: Any = type("S", (), {"files": files})()
    target = tmp_path / "dest"
    with pytest.raises(SandboxError, match=r"unusable name '\.\.'"):
        _download_tree(sandbox, "work", target, 10)
    assert files.read == []  # the whole tree is listed before any file is written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]
