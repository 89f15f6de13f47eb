"""Client-side path sanitizing and the two runtimes' URL encodings (spec §3.5)."""

from __future__ import annotations

import pytest

from agent_sandbox_sdk._paths import legacy_path, sandboxd_path, sanitize_path

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("a.txt", "a.txt"),
        ("dir/hello.txt", "dir/hello.txt"),
        ("/etc/passwd", "etc/passwd"),
        ("a//b/./c", "a/b/c"),
        ("./x", "x"),
        ("dir/", "dir"),
        # normalized first, as upstream 1.0.8's `_safe_upload_path` and spec §3.5 do: only a `..` that is left
        # after normalizing escapes the root (until December 6 `a/../b` was refused)
        ("a/../b", "b"),
        ("a/b/../c", "a/c"),
        ("./a/../b/", "b"),
        ("/a/../b", "b"),
        ("/../x", "x"),  # `..` at the root is the root
        (" a", " a"),
    ],
)
def test_sanitize_normalizes_to_a_relative_path(raw: str, clean: str) -> None:
    assert sanitize_path(raw) == clean


@pytest.mark.parametrize(
    "bad",
    [
        *("", ".", "/", "./", "..", "a/..", "../x", "a/../../x", "../", "a\nb", "a\x00b", "tab\there"),
        *("\x7f", " ", "   ", "\u00a0", "\u3000 "),  # whitespace only: upstream's `not path.strip()`
    ],
)
def test_sanitize_rejects_unsafe_paths_naming_them(bad: str) -> None:
    with pytest.raises(ValueError, match="path"):
        sanitize_path(bad)


def test_sanitize_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        sanitize_path(b"a")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "encoded"),
    [
        ("a.txt", "a.txt"),
        ("dir/hello.txt", "dir%2Fhello.txt"),
        ("sp ace/ü", "sp%20ace%2F%C3%BC"),
        ("", ""),
        (".", ""),
        ("q?x#y", "q%3Fx%23y"),
        ("../../etc/passwd", "..%2F..%2Fetc%2Fpasswd"),
        ("..", "%2E%2E"),  # not a dot segment an HTTP library resolves away (the request went to `/`)
    ],
)
def test_legacy_encoding_percent_encodes_the_whole_path(path: str, encoded: str) -> None:
    assert legacy_path(path) == encoded


@pytest.mark.parametrize(
    ("path", "encoded"),
    [
        ("a.txt", "a.txt"),
        ("dir/hello.txt", "dir%2Fhello.txt"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        ("a/./b/../c", "a%2F%2E%2Fb%2F%2E%2E%2Fc"),
        ("", ""),
        ("x y/%", "x%20y%2F%25"),
    ],
)
def test_sandboxd_encoding_encodes_segments_and_dot_segments(path: str, encoded: str) -> None:
    assert sandboxd_path(path) == encoded


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("", "cannot be empty"),
        (" ", "cannot be empty"),
        ("a\nb", "contains ASCII control characters"),
        (".", "does not name a file"),
        ("a/../../x", r"escapes the sandbox root.*'\.\.' segment"),
    ],
)
def test_sanitize_messages_carry_upstreams_wording(bad: str, message: str) -> None:
    """Code written against upstream 1.0.8 that matches its ValueError's words keeps matching."""
    with pytest.raises(ValueError, match=message):
        sanitize_path(bad)
