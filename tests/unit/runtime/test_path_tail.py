"""`path_tail` and the root-delete guard (`root_named`, `names_root`): a route prefix spelled with escapes is
read as the prefix, never as an empty path - the root (docs/runtime.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from agent_sandbox.runtime._http import path_tail, root_named
from agent_sandbox.runtime.paths import InvalidPath, names_root, real_root

pytestmark = pytest.mark.unit


def _request(raw: str, match_path: str = "") -> web.Request:
    request = make_mocked_request("DELETE", "/", match_info={"path": match_path})
    # As aiohttp's parser builds it: the path kept as sent (make_mocked_request would normalise the escapes).
    return request.clone(rel_url=URL.build(path=raw, encoded=True))


@pytest.mark.parametrize(
    ("raw", "prefix", "tail"),
    [
        ("/files/tmp/x", "/files/", "tmp/x"),
        ("/%66iles/tmp/x", "/files/", "tmp/x"),
        ("/fi%6Ces/tmp/x", "/files/", "tmp/x"),
        ("/fi%6ces/a%2Fb", "/files/", "a/b"),
        ("/%66%69%6C%65%73/", "/files/", ""),
        ("/v1/files/", "/v1/files/", ""),
        ("/%76%31/%66iles/d", "/v1/files/", "d"),
        ("/v1/files/%2F", "/v1/files/", "/"),
        ("/v1/files/%25%2F", "/v1/files/", "%/"),
    ],
)
def test_path_tail_decodes_the_prefix_segment_by_segment(raw: str, prefix: str, tail: str) -> None:
    assert path_tail(_request(raw), prefix) == tail


@pytest.mark.parametrize(
    ("raw", "prefix"),
    [
        ("/%46iles/x", "/files/"),  # "Files"
        ("/%2Ffiles/x", "/files/"),  # "/files" in one segment
        ("/files", "/files/"),
        ("/v1/file/x", "/v1/files/"),
        ("/x/files/y", "/files/"),
        ("/%ff/x", "/files/"),
    ],
)
def test_a_path_that_does_not_start_with_the_prefix_is_invalid_never_the_root(raw: str, prefix: str) -> None:
    with pytest.raises(InvalidPath):
        path_tail(_request(raw), prefix)


def test_a_tail_that_is_no_utf8_is_invalid() -> None:
    with pytest.raises(InvalidPath, match="UTF-8"):
        path_tail(_request("/files/%ff"), "/files/")


@pytest.fixture
def root(tmp_path: Path) -> str:
    return real_root(tmp_path / "ws")


@pytest.mark.parametrize("user", ["", "/", ".", "./", "a/..", "//", "/workspace", "/workspace/"])
def test_names_root_spelled_the_root(root: str, user: str) -> None:
    assert names_root(root, user, configured_root="/workspace")


@pytest.mark.parametrize("user", ["a", "..", "../other", "a/../b", "\x00", "/workspacex"])
def test_names_root_anything_else(root: str, user: str) -> None:
    assert not names_root(root, user, configured_root="/workspace")


def test_the_configured_root_names_the_root_only_by_the_sandboxd_rule(root: str) -> None:
    assert not names_root(root, "/workspace")


def test_root_named_needs_both_readings(root: str) -> None:
    def named(p: str) -> bool:
        return names_root(root, p)

    assert root_named(_request("/files/", ""), "", named)
    assert root_named(_request("/files/%2F", "/"), "/", named)
    # The raw reading says root, aiohttp's says a file: a misread path, not the root named.
    assert not root_named(_request("/%66iles/tmp/x", "tmp/x"), "", named)
    assert not root_named(_request("/files/link", "link"), "link", named)
