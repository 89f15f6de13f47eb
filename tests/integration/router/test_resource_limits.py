"""The router under resource pressure: a client that never reads, fd exhaustion, slow side-listener clients;
and the exactness of what it reports (access-log bytes and durations, span target)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent_sandbox.router import Router

from .conftest import Backend, RouterProcess, exchange, scrape

pytestmark = pytest.mark.integration

MB = 1 << 20


def _flood(port: int, request: bytes, limit: int) -> int:
    """Pipeline `request` over one connection that never reads; returns the bytes sent before the send
    blocked (the router stopped reading) or `limit`."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the router's answers back up at once
    s.connect(("127.0.0.1", port))
    s.settimeout(2.0)
    blob = request * (65536 // len(request))
    sent = 0
    try:
        while sent < limit:
            sent += s.send(blob)
    except TimeoutError:
        pass
    finally:
        s.close()
    return sent


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="router-400"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", id="healthz"),
    ],
)
async def test_a_client_that_never_reads_stops_the_router_reading_its_pipelined_requests(
    router: Router, request_: bytes
) -> None:
    """Answers the router writes itself must not pile up: once the client's write buffer is full, the router
    stops reading (and starting) its pipelined requests, so the sender blocks (until December 6 the router
    read on and buffered every answer: 800 MB of RSS for one connection)."""
    loop = asyncio.get_running_loop()
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            for conn in router.connections:
                if conn.transport is not None and not conn.closed:
                    peak = max(peak, conn.transport.get_write_buffer_size())
            await asyncio.sleep(0.01)

    watcher = loop.create_task(watch())
    try:
        sent = await asyncio.to_thread(_flood, router.http_port or 0, request_, 48 * MB)
    finally:
        watcher.cancel()
    # kernel socket buffers (autotuned) take a few MiB whatever the router does
    assert sent < 24 * MB, f"the router read {sent >> 20} MiB of requests from a client that reads nothing"
    assert peak < 2 * MB, f"{peak} bytes of answers buffered for one client"
    # and it still serves others
    ok = await exchange(router.http_port or 0, b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
    assert ok.status == 200


async def test_pipelined_requests_are_all_answered_once_the_client_reads(router: Router) -> None:
    """The pause is flow control only: a client that reads late gets every answer, in order."""
    n = 3000
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * n + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(0.5)  # the router's writes back up meanwhile
    data = b""
    async with asyncio.timeout(20):
        while data.count(b"HTTP/1.1 ") < n + 1:
            chunk = await reader.read(65536)
            assert chunk, "connection closed early"
            data += chunk
    writer.close()
    statuses = re.findall(rb"HTTP/1\.1 (\d{3})", data)
    assert statuses == [b"200"] * n + [b"400"]


# ---------------------------------------------------------------- fd exhaustion


def _limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def test_the_router_raises_its_open_files_soft_limit_to_the_hard_limit(tmp_path: Path) -> None:
    """As Go (1.19+) does at start: the soft RLIMIT_NOFILE (often 1024) goes up to the hard limit."""
    from tests.helpers import listen_port

    port, probe, metrics = listen_port(), listen_port(), listen_port()
    log = tmp_path / "router.log"
    argv = [
        "prlimit",
        "--nofile=256:4096",
        sys.executable,
        "-m",
        "agent_sandbox.router",
        f"--http-bind-address=127.0.0.1:{port}",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", probe), timeout=1):
                    break
            except OSError:
                pass
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        assert _limits(proc.pid) == (4096, 4096)
    finally:
        proc.kill()
        proc.wait(10)


async def test_near_fd_exhaustion_new_connections_get_503_not_a_reset(
    start_router: Callable[..., Awaitable[Router]], caplog: pytest.LogCaptureFixture
) -> None:
    """With the open-files limit almost reached a new client gets a 503 JSON with Retry-After (and the
    router a warning and a metric), not the reset libuv's accept-and-close gives it."""
    import resource

    router = await start_router()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    caplog.set_level(logging.WARNING, logger="agent_sandbox.router")
    try:
        # The reserve: leave fewer free descriptors than the router keeps for itself.
        probe = socket.socket()
        lowest = probe.fileno()
        probe.close()
        limit = 512 + lowest + 64
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
        while True:
            try:
                fd = socket.socket().detach()
            except OSError:
                break
            held.append(fd)
            if fd >= limit - 10:  # 10 left: inside the router's reserve (16), enough for the test's sockets
                break
        resp = await exchange(router.http_port or 0, b"GET /x HTTP/1.1\r\nHost: r\r\n\r\n")
    finally:
        for fd in held:
            socket.socket(fileno=fd).close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert resp.status == 503, resp
    assert resp.headers.get("retry-after") == "1"
    assert b"open files" in resp.body
    assert any("file descriptors" in r.getMessage() for r in caplog.records)
    text = await scrape(router)
    assert 'sandbox_router_fd_exhaustion_total{side="accept"} 1.0' in text


# ---------------------------------------------------------------- side listeners


@pytest.mark.parametrize("listener", ["metrics", "probe"])
async def test_a_partial_request_head_on_a_side_listener_is_closed_after_the_header_timeout(
    start_router: Callable[..., Awaitable[Router]], listener: str
) -> None:
    """Metrics and probe listeners drop a connection that sends no complete request head within
    `--read-header-timeout` (until December 6 such connections stayed forever and took the router's fds)."""
    router = await start_router("--read-header-timeout=1s")
    port = router.metrics_port if listener == "metrics" else router.probe_port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    start = time.perf_counter()
    async with asyncio.timeout(5):
        await reader.read()
    assert time.perf_counter() - start < 3
    writer.close()


async def test_side_listener_connections_are_capped() -> None:
    from aiohttp import web

    from agent_sandbox.kube._servers import HttpServer

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    server = HttpServer("test", "127.0.0.1:0", app, header_timeout=30, max_connections=4)
    task = asyncio.create_task(server.start())
    await server.wait_serving()
    try:
        held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        async with asyncio.timeout(3):
            assert await reader.read() == b""  # over the cap: closed at once
        writer.close()
        for _, w in held:
            w.close()
        await asyncio.sleep(0.1)
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{server.port}/") as resp:
            assert resp.status == 200
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# ---------------------------------------------------------------- what is reported


def _access(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.__dict__ for r in caplog.records if r.name == "sandbox-router.access"]


async def test_access_log_bytes_out_counts_the_body_only(
    router: Router, backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    """As upstream: `bytes_out` is the response body's length (headers were counted until December 6)."""
    caplog.set_level(logging.INFO, logger="sandbox-router.access")
    base = f"http://127.0.0.1:{router.http_port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/download/1000", headers=backend.headers()) as resp:
            assert len(await resp.read()) == 1000
        async with s.get(f"{base}/x") as resp:  # no X-Sandbox-ID: the router's own 400
            assert resp.status == 400
            body400 = await resp.read()
        async with s.head(f"{base}/x") as resp:
            assert resp.status == 400
    records = _access(caplog)
    assert [r["bytes_out"] for r in records] == [1000, len(body400), 0]


async def test_durations_are_not_rounded_to_milliseconds(
    router_process: Callable[..., RouterProcess],
) -> None:
    """The router process runs uvloop, whose loop clock has whole-ms resolution: durations taken with it
    were 0 or whole ms (access log `duration_ms` 0.0, histogram sums multiples of 1 ms)."""
    router = router_process()
    async with aiohttp.ClientSession() as s:
        for _ in range(20):
            async with s.get(f"http://127.0.0.1:{router.port}/x") as resp:
                assert resp.status == 400
                await resp.read()
        await asyncio.sleep(0.5)  # the access log is flushed in batches
        async with s.get(f"http://127.0.0.1:{router.metrics_port}/metrics") as resp:
            text = await resp.text()
    durations = [
        json.loads(line)["duration_ms"]
        for line in router.log.read_text().splitlines()
        if line.startswith("{") and '"msg":"request"' in line.replace(" ", "")
    ]
    assert len(durations) == 20, router.log.read_text()[-2000:]
    assert any(d != round(d) for d in durations), durations
    total = re.search(
        r'sandbox_router_request_duration_seconds_sum\{code="400",method="GET",sandbox_namespace="-"\} (\S+)',
        text,
    )
    assert total is not None
    ms = float(total.group(1)) * 1000
    assert abs(ms - round(ms)) > 1e-6, ms


def test_the_span_target_has_no_query() -> None:
    """As upstream (`r.URL.Path`): a query can carry secrets, it is not a span attribute."""
    from agent_sandbox.router._request import Request
    from agent_sandbox.router._tracing import start_span

    seen: dict[str, Any] = {}

    class Tracer:
        def start_span(self, name: str, **kwargs: Any) -> None:
            seen.update(kwargs["attributes"])

    for target, path in (
        (b"/files/a?token=secret", "/files/a"),
        (b"http://r.example/files/b?token=secret", "/files/b"),
        (b"/plain", "/plain"),
    ):
        req = Request()
        req.method = "GET"
        req.url = target
        start_span(Tracer(), None, req)
        assert seen["http.target"] == path
