"""A request body that stops arriving (Content-Length 100, 3 bytes sent, then silence) is answered 408 after
`--http-idle-timeout`, its temporary file removed (docs/runtime.md).

Until December 7 such a request was held forever: its `.sandboxd-tmp-*` file and descriptor stayed, and
`GET /v1/activity` said `idleSeconds: 0` the whole time - one stuck client kept the lifecycle controller from
ever suspending the sandbox.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.conftest import MakeRuntime, url

pytestmark = pytest.mark.integration

_TIMEOUT = 0.5


def _multipart_head(boundary: str, filename: str) -> bytes:
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()


def _requests(port: dict[str, int]) -> list[tuple[str, int, bytes]]:
    """(name, port, the request head and the start of its body): each promises more than it sends."""
    b = "xyzboundary"
    upload_body = _multipart_head(b, "up.txt") + b"abc"
    return [
        (
            "rest put",
            port["rest"],
            b"PUT /v1/files/stall.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
        ),
        (
            "rest put multipart",
            port["rest"],
            f"PUT /v1/files/stall2.txt HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={b}\r\n"
            f"Content-Length: 500\r\n\r\n".encode()
            + upload_body,
        ),
        (
            "legacy upload",
            port["legacy"],
            f"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={b}\r\n"
            f"Content-Length: 500\r\n\r\n".encode()
            + upload_body,
        ),
        (
            "legacy execute",
            port["legacy"],
            b'POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"co',
        ),
    ]


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    data = await asyncio.wait_for(reader.read(), 10)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _temp_files(root: str) -> list[str]:
    return [str(p) for p in Path(root).rglob(".sandboxd-tmp-*")]


@pytest.mark.parametrize("which", range(4))
async def test_a_stalled_body_is_a_408_and_leaves_nothing(
    make_runtime: MakeRuntime, which: int, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = await make_runtime(http_idle_timeout=_TIMEOUT)
    name, port, request = _requests(runtime.ports)[which]
    fds_before = len(os.listdir("/proc/self/fd"))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        started = time.monotonic()
        writer.write(request)
        await writer.drain()
        status, body = await _answer(reader)
        elapsed = time.monotonic() - started
        writer.write(b"late bytes of the body")  # after the answer: not read, no error
        await asyncio.sleep(0.1)
    finally:
        writer.close()
    assert status == 408, (name, body)
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    assert "body" in orjson.loads(body)["message"], body
    assert _TIMEOUT * 0.8 <= elapsed < _TIMEOUT + 3, elapsed
    assert _temp_files(runtime.root) == []
    assert not Path(runtime.root, "stall.txt").exists()
    assert not Path(runtime.root, "up.txt").exists()
    await asyncio.sleep(0.1)
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 1


async def test_activity_counts_idle_time_again_after_a_stalled_body(
    make_runtime: MakeRuntime, http: aiohttp.ClientSession
) -> None:
    runtime = await make_runtime(http_idle_timeout=_TIMEOUT)
    _, port, request = _requests(runtime.ports)[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with http.get(url(runtime, "rest", "/v1/activity")) as resp:
            assert (await resp.json())["inflightRequests"] == 1
        await _answer(reader)
    finally:
        writer.close()
    await asyncio.sleep(0.3)
    async with http.get(url(runtime, "rest", "/v1/activity")) as resp:
        report = await resp.json()
    assert report["inflightRequests"] == 0
    assert report["idleSeconds"] > 0


async def test_a_slow_body_that_keeps_arriving_is_not_cut(
    runtime: RuntimeServer, make_runtime: MakeRuntime
) -> None:
    """The limit is on silence, not on the whole body: a byte every 0.3 s for 2 s is stored."""
    slow = await make_runtime(http_idle_timeout=_TIMEOUT)
    reader, writer = await asyncio.open_connection("127.0.0.1", slow.ports["rest"])
    try:
        writer.write(
            b"PUT /v1/files/slow.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nConnection: close\r\n\r\n"
        )
        for byte in b"0123456":
            await asyncio.sleep(0.3)
            writer.write(bytes([byte]))
            await writer.drain()
        status, _ = await _answer(reader)
    finally:
        writer.close()
    assert status == 204
    assert Path(slow.root, "slow.txt").read_bytes() == b"0123456"
