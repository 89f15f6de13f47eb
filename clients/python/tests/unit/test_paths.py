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
    ],
)
def test_sanitize_normalizes_to_a_relative_path(raw: str, clean: str) -> None:
    assert sanitize_path(raw) == clean


@pytest.mark.parametrize(
    "bad", ["", ".", "/", "./", "..", "a/../b", "../x", "a\nb", "a\x00b", "tab\there", "\x7f"]
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


@pytest.mark.parametrize("bad", ["new\nline", "tab\there", "del\x7f"])
def test_exists_refuses_control_characters_before_any_request(bad: str) -> None:
    """As write/read (and the Go SDK's Exists): a ValueError naming the path, not the runtime's 404."""
    from typing import Any

    from agent_sandbox_sdk import _files

    conn: Any = None  # never reached: the check comes first
    with pytest.raises(ValueError, match="control characters"):
        next(_files.exists(conn, bad, timeout=1.0))
