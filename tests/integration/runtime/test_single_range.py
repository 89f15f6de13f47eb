"""Single `Range` requests answered as sandboxd's Go server (`http.ServeContent`) does, where aiohttp's
FileResponse differed (until December 7): a range on an empty file, an empty suffix, a number past int64."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.conftest import url

pytestmark = pytest.mark.integration


def _target(server: RuntimeServer, protocol: str, name: str) -> str:
    return (
        url(server, "rest", f"/v1/files/{name}")
        if protocol == "rest"
        else url(server, "legacy", f"/download/{name}")
    )


async def _get(
    http: aiohttp.ClientSession, target: str, range_header: str, method: str = "GET"
) -> tuple[int, str | None, bytes]:
    async with http.request(method, target, headers={"Range": range_header}) as resp:
        return resp.status, resp.headers.get("Content-Range"), await resp.read()


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_a_range_on_an_empty_file_is_ignored(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """Go (golang/go#54794): some clients send a Range with every request; an empty file is a 200, not a 416
    (ours for a suffix too, where Go answers a malformed 206 `bytes 0--1/0`)."""
    Path(runtime.root, "empty").write_bytes(b"")
    target = _target(runtime, protocol, "empty")
    for header in ("bytes=0-", "bytes=0-99", "bytes=5-", "bytes=-5", "bytes=-0", "bytes=0-0,1-1"):
        assert await _get(http, target, header) == (200, None, b""), header
    # A malformed header is still refused, as Go does.
    assert (await _get(http, target, "bytes=x-"))[0] == 416
    assert (await _get(http, target, "bytes=0-99", "HEAD"))[0] == 200


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_an_empty_suffix_is_unsatisfiable(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """RFC 9110 §14.1.2: `bytes=-0` selects nothing - 416 with the length, never the whole file as a 206
    (Go sends a 206 with the invalid `bytes 5-4/5`, golang/go#81262)."""
    Path(runtime.root, "f").write_bytes(b"hello")
    target = _target(runtime, protocol, "f")
    assert await _get(http, target, "bytes=-0") == (416, "bytes */5", b"")
    assert await _get(http, target, "bytes=-2") == (206, "bytes 3-4/5", b"lo")
    assert await _get(http, target, "bytes=1-2") == (206, "bytes 1-2/5", b"el")
    assert await _get(http, target, "bytes=1-") == (206, "bytes 1-4/5", b"ello")
    assert (await _get(http, target, "bytes=5-"))[:2] == (416, "bytes */5")


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_a_range_header_naming_no_range_is_the_whole_file(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """Go's parseRange answers "no overlap" only when a range started past the end: `bytes=` or `bytes=,`
    names none, and Go serves the whole file (a 416 `bytes */5` here until the review of December 7)."""
    Path(runtime.root, "f").write_bytes(b"hello")
    target = _target(runtime, protocol, "f")
    for header in ("bytes=", "bytes=,", "bytes= , "):
        assert await _get(http, target, header) == (200, None, b"hello"), header


@pytest.mark.parametrize("protocol", ["rest", "legacy"])
async def test_a_number_past_int64_is_a_malformed_range(
    runtime: RuntimeServer, http: aiohttp.ClientSession, protocol: str
) -> None:
    """Go's strconv.ParseInt refuses it: 416 (aiohttp read any length of digits and served a 206)."""
    data = os.urandom(100)
    Path(runtime.root, "f").write_bytes(data)
    target = _target(runtime, protocol, "f")
    big = "99999999999999999999999"
    for header in (f"bytes=0-{big}", f"bytes={big}-", f"bytes=-{big}", f"bytes=0-{2**63}"):
        assert (await _get(http, target, header))[0] == 416, header
    # int64's largest is a number: clipped to the end of the file.
    assert await _get(http, target, f"bytes=90-{2**63 - 1}") == (206, "bytes 90-99/100", data[90:])
    # Go's unit is case-sensitive: `Bytes=` is not a byte range.
    assert (await _get(http, target, "Bytes=0-1"))[0] == 416
