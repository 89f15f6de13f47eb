"""Fixtures for the router tests: real backends on loopback addresses, routers in-process or as processes.

Backends are real HTTP servers (aiohttp) bound to their own 127.x address, standing in for a sandbox's
runtime until tests use the dev cluster's local runner. Routers are the real `Router` (in-process, so
tests can read its state) or the real `agent-sandbox-router` console script (for RSS, signals, exit
codes). Nothing here is mocked. Tests never let the router resolve the DNS form: this machine's
resolver is on a private address, which tests must not reach (docs/router.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import pytest
from aiohttp import WSMsgType, web

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.router import router_kubeconfig
from agent_sandbox.router import Router, load_router_config
from tests.helpers import listen_port

_ips = itertools.count(random.randrange(1, 200) * 256)


def with_identity(cluster: DevCluster, *flags: str) -> tuple[str, ...]:
    """`flags` and the `--kubeconfig` of the router's identity for them: the admin's, or (with
    `AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount`, as CI runs) the install's `sandbox-router`
    ServiceAccount holding the grants of the router components those flags need (`devcluster.router`)."""
    return (*flags, f"--kubeconfig={router_kubeconfig(cluster, flags)}")


def fresh_ip() -> str:
    """A loopback address no dev cluster uses (clusters take 127.10.0.0/16 and up, one /16 each)."""
    n = next(_ips)
    return f"127.250.{(n // 256) % 256}.{n % 254 + 1}"


async def raw_backend(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, dict[str, str]]:
    """A sandbox stand-in speaking raw bytes on a fresh loopback address: the server, and the routing headers
    that reach it through the router."""
    ip = fresh_ip()
    server = await asyncio.start_server(serve, ip, 0)
    port = server.sockets[0].getsockname()[1]
    return server, {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": ip, "X-Sandbox-Port": str(port)}


@dataclass
class Backend:
    """A sandbox stand-in: records what reached it."""

    ip: str
    port: int
    seen: list[dict[str, Any]] = field(default_factory=list)
    uploads: list[int] = field(default_factory=list)

    def headers(self, pod_ip: bool = True, **extra: str) -> dict[str, str]:
        """Routing headers that reach this backend through the router."""
        h = {"X-Sandbox-ID": "sb", "X-Sandbox-Port": str(self.port)}
        if pod_ip:
            h["X-Sandbox-Pod-IP"] = self.ip
        h.update(extra)
        return h


def backend_app(backend: Backend) -> web.Application:
    async def echo(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = {
            "method": request.method,
            "raw_path": request.raw_path,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body_len": len(body),
            "body_sha": hashlib.sha256(body).hexdigest(),
            "version": f"{request.version.major}.{request.version.minor}",
        }
        backend.seen.append(seen)
        return web.json_response(seen)

    async def status(request: web.Request) -> web.Response:
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"sandbox says {code}", headers={"X-From": "sandbox"})

    async def sleep(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.match_info["seconds"]))
        return web.Response(text="slept")

    async def download(request: web.Request) -> web.StreamResponse:
        total = int(request.match_info["n"])
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        chunk = b"d" * 65536
        sent = 0
        while sent < total:
            part = chunk[: min(len(chunk), total - sent)]
            await resp.write(part)
            sent += len(part)
        await resp.write_eof()
        return resp

    async def upload(request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        n = 0
        async for chunk in request.content.iter_chunked(65536):
            digest.update(chunk)
            n += len(chunk)
        backend.uploads.append(n)
        return web.json_response({"received": n, "sha": digest.hexdigest()})

    async def drip(request: web.Request) -> web.StreamResponse:
        count = int(request.match_info["k"])
        every = float(request.query.get("every", "0.3"))
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(count):
            await resp.write(f"line {i}\n".encode())
            await asyncio.sleep(every)
        await resp.write_eof()
        return resp

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse(protocols=("echo.v1",), max_msg_size=0)
        await sock.prepare(request)
        backend.seen.append({"ws_headers": dict(request.headers)})
        async for msg in sock:
            if msg.type == WSMsgType.TEXT and msg.data.startswith("big:"):
                await sock.send_bytes(b"b" * int(msg.data[4:]))
            elif msg.type == WSMsgType.TEXT:
                await sock.send_str(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await sock.send_bytes(msg.data)
        return sock

    async def no_content(_: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_get("/sleep/{seconds}", sleep)
    app.router.add_get("/download/{n}", download)
    app.router.add_post("/upload", upload)
    app.router.add_get("/drip/{k}", drip)
    app.router.add_get("/ws", ws)
    app.router.add_route("*", "/nocontent", no_content)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


@pytest.fixture
async def start_backend() -> AsyncIterator[Callable[..., Awaitable[Backend]]]:
    runners: list[web.AppRunner] = []

    async def start(ip: str | None = None, port: int = 0) -> Backend:
        backend = Backend(ip or fresh_ip(), 0)
        runner = web.AppRunner(backend_app(backend), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, backend.ip, port)
        await site.start()
        backend.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        runners.append(runner)
        return backend

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def backend(start_backend: Callable[..., Awaitable[Backend]]) -> Backend:
    return await start_backend()


LOCAL = (
    "--http-bind-address=127.0.0.1:0",
    "--metrics-bind-address=127.0.0.1:0",
    "--health-probe-bind-address=127.0.0.1:0",
)


@pytest.fixture
async def start_router() -> AsyncIterator[Callable[..., Awaitable[Router]]]:
    """Start in-process routers on ephemeral loopback ports (`--allow-loopback-pod-ip` unless told)."""
    routers: list[Router] = []

    async def start(*flags: str, loopback: bool = True, **kwargs: Any) -> Router:
        args = [*LOCAL, *(["--allow-loopback-pod-ip"] if loopback else []), *flags]
        config, _ = load_router_config(args, {})
        router = Router(config, **kwargs)
        await router.start()
        routers.append(router)
        return router

    yield start
    for router in routers:
        await router.shutdown()


@pytest.fixture
async def router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router()


async def scrape(router: Router) -> str:
    """The router's /metrics text."""
    import urllib.request

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
            return text

    return await asyncio.to_thread(get)


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool


class _Collector:
    """The first response of what is read: the router answers the requests a client pipelined (or the
    bytes after a whole request, a 400) each in turn, and later ones may arrive in the same read."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body = b""
        self.complete = False
        self.status = 0
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.complete:
            self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if not self.complete and self.parser is not None:
            self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


async def raw_request(
    port: int, data: bytes, *, within: float = 10.0, host: str = "127.0.0.1"
) -> RawResponse:
    """Send raw bytes, read one response (and whether the server then closed the connection)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        collector = _Collector()
        parser = collector.parser = httptools.HttpResponseParser(collector)
        async with asyncio.timeout(within):
            while not collector.complete:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                parser.feed_data(chunk)
            closed = False
            try:
                async with asyncio.timeout(0.5):
                    closed = await reader.read(1) == b""
            except TimeoutError:
                closed = False
        return RawResponse(
            collector.status or parser.get_status_code(), collector.headers, collector.body, closed
        )
    finally:
        writer.close()


async def exchange(
    port: int, data: bytes, *, head: bool = False, half_close: bool = False, within: float = 8.0
) -> RawResponse:
    """Send `data` and read one response without waiting to see a close (status 0: the router closed
    without answering); `head`: the request was HEAD (parse the head only); `half_close`: end our side
    after sending. Fails the test if neither a response nor a close comes within `within` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if half_close:
            writer.write_eof()
        collector = _Collector()
        parser = collector.parser = httptools.HttpResponseParser(collector)
        closed = False
        got = b""
        try:
            async with asyncio.timeout(within):
                while not collector.complete:
                    chunk = await reader.read(65536)
                    if not chunk:
                        closed = True
                        break
                    got += chunk
                    if head and b"\r\n\r\n" in got:
                        # a response to HEAD announces a length it does not send: parse the head only
                        parser.feed_data(got[: got.index(b"\r\n\r\n") + 4])
                        collector.complete = True
                        break
                    parser.feed_data(chunk)
        except TimeoutError:
            pytest.fail(f"no answer and no close within {within}s for {data[:300]!r}")
        except httptools.HttpParserUpgrade:
            collector.complete = True
        status = (collector.status or parser.get_status_code()) if got else 0
        return RawResponse(status, collector.headers, collector.body, closed)
    finally:
        writer.close()


async def still_serving(router: Router) -> None:
    """The router answers its own /healthz on the proxy port."""
    ok = await exchange(router.http_port or 0, b"GET /healthz HTTP/1.1\r\nHost: r\r\n\r\n")
    assert ok.status == 200, ok


def request_bytes(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: router.test"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body and "Content-Length" not in headers and "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class RouterProcess:
    """`agent-sandbox-router` running as its own process."""

    proc: subprocess.Popen[bytes]
    port: int
    probe_port: int
    metrics_port: int
    log: Path

    def rss_peak_kib(self) -> int:
        return _status_kib(self.proc.pid, "VmHWM")

    def rss_kib(self) -> int:
        return _status_kib(self.proc.pid, "VmRSS")


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


@pytest.fixture
def router_process(tmp_path: Path) -> Iterator[Callable[..., RouterProcess]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> RouterProcess:
        port, probe, metrics = listen_port(), listen_port(), listen_port()
        log = tmp_path / f"router-{len(procs)}.log"
        argv = [
            sys.executable,
            "-m",
            "agent_sandbox.router",
            f"--http-bind-address=127.0.0.1:{port}",
            f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            "--allow-loopback-pod-ip",
            *flags,
        ]
        proc_env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "KUBERNETES_SERVICE"))}
        proc_env.update(env or {})
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=proc_env)
        procs.append(proc)
        import time
        import urllib.request

        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{probe}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"router did not become ready: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        return RouterProcess(proc, port, probe, metrics, log)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
