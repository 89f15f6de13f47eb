"""Path confinement rules (spec §2.1 and §2.2) on a real temporary directory tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent_sandbox.runtime.paths import InvalidPath, PathEscape, check_fd, confine, real_root

pytestmark = pytest.mark.unit


@pytest.fixture
def root(tmp_path: Path) -> str:
    r = real_root(tmp_path / "ws")
    os.makedirs(f"{r}/a/b")
    Path(r, "a", "f").write_text("x")
    os.symlink("a", f"{r}/inside-link")
    os.symlink("/etc", f"{r}/out-link")
    os.symlink("../..", f"{r}/a/up-link")
    os.symlink("/nonexistent/target", f"{r}/dangling-out")
    os.symlink("a/new-file", f"{r}/dangling-in")
    return r


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("", ""),
        (".", ""),
        ("/", ""),
        ("a/f", "a/f"),
        ("/a/f", "a/f"),
        ("a//b/../f", "a/f"),
        ("a/missing/deeper", "a/missing/deeper"),
        ("inside-link/f", "a/f"),
        ("dangling-in", "a/new-file"),
        ("a/b/..", "a"),
    ],
)
def test_inside(root: str, user: str, expected: str) -> None:
    assert confine(root, user) == os.path.join(root, expected).rstrip("/")


@pytest.mark.parametrize(
    "user",
    [
        "..",
        "../x",
        "a/../../x",
        "/../etc/passwd",
        "out-link",
        "out-link/passwd",
        "a/up-link",
        "dangling-out",
    ],
)
def test_escapes(root: str, user: str) -> None:
    with pytest.raises(PathEscape):
        confine(root, user)


def test_a_link_that_leaves_and_comes_back_is_inside(root: str) -> None:
    assert confine(root, "a/up-link/ws/a/f") == f"{root}/a/f"


def test_nul_is_invalid(root: str) -> None:
    with pytest.raises(InvalidPath):
        confine(root, "a\x00b")


def test_configured_root_prefix_is_stripped(root: str, tmp_path: Path) -> None:
    configured = str(tmp_path / "ws")
    assert confine(root, f"{configured}/a/f", configured_root=configured) == f"{root}/a/f"
    assert confine(root, configured, configured_root=configured) == root
    # without the configured root it is just a path below the root
    assert confine(root, f"{configured}/a/f") == f"{root}{configured}/a/f"
    # a sibling that merely shares the prefix is not the root
    assert confine(root, f"{configured}-evil/x", configured_root=configured) == f"{root}{configured}-evil/x"


def test_check_fd(root: str, tmp_path: Path) -> None:
    fd = os.open(f"{root}/a/f", os.O_RDONLY)
    try:
        check_fd(fd, root)
    finally:
        os.close(fd)
    outside = tmp_path / "outside"
    outside.write_text("o")
    fd = os.open(outside, os.O_RDONLY)
    try:
        with pytest.raises(PathEscape):
            check_fd(fd, root)
    finally:
        os.close(fd)
