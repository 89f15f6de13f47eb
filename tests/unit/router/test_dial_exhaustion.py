"""EMFILE when dialling the sandbox: the router is out of descriptors, not the sandbox dead.

The upstream dial is replaced by one raising `OSError(EMFILE)`, so these run an in-process `Router` on
loopback with no backend and no cluster (the routing headers point at an unused loopback address). The rest
of the router's behaviour under fd pressure is in tests/integration/router/test_resource_limits.py.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httptools
import pytest

from agent_sandbox.router import Router, load_router_config

pytestmark = pytest.mark.unit

LOCAL = (
    "--http-bind-address=127.0.0.1:0",
    "--metrics-bind-address=127.0.0.1:0",
    "--health-probe-bind-address=127.0.0.1:0",
    "--allow-loopback-pod-ip",
)

# Nothing listens here: the dial is faked and fails before any connect.
ROUTING = {
    "X-Sandbox-ID": "sb",
    "X-Sandbox-Namespace": "default",
    "X-Sandbox-Port": "9",
    "X-Sandbox-Pod-IP": "127.251.0.1",
}


@pytest.fixture
async def start_router() -> AsyncIterator[Callable[..., Awaitable[Router]]]:
    """Start in-process routers on ephemeral loopback ports."""
    routers: list[Router] = []

    async def start(*flags: str) -> Router:
        config, _ = load_router_config([*LOCAL, *flags], {})
        router = Router(config)
        await router.start()
        routers.append(router)
        return router

    yield start
    for router in routers:
        await router.shutdown()


@pytest.fixture
async def router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router()


def _emfile_dial(router: Router, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Replace the router's upstream dial with one raising EMFILE; the returned list counts the dials."""
    assert router.proxy is not None
    dials: list[int] = []

    async def dial(*_: Any, **__: Any) -> Any:
        dials.append(1)
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(router.proxy.pool, "dial", dial)
    return dials


async def _scrape(router: Router) -> str:
    """The router's /metrics text."""

    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
            return text

    return await asyncio.to_thread(get)


@dataclass
class _Response:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


async def _exchange(port: int, path: str, headers: dict[str, str]) -> _Response:
    """Send one HTTP/1.1 GET and read its response."""
    head = [f"GET {path} HTTP/1.1", "Host: router.test", *(f"{k}: {v}" for k, v in headers.items())]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        resp = _Response()
        parser = httptools.HttpResponseParser(resp)
        async with asyncio.timeout(8):
            while not resp.complete:
                chunk = await reader.read(65536)
                assert chunk, "the router closed without a complete response"
                parser.feed_data(chunk)
        resp.status = parser.get_status_code()
        return resp
    finally:
        writer.close()


async def test_fd_exhaustion_on_the_upstream_dial_is_503_without_retries(
    router: Router, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE dialling the sandbox is the router out of descriptors, not a dead sandbox: 503 with
    Retry-After at once (no 1.4 s of retries, no 502 `Could not connect`), a warning and its own labels."""
    dials = _emfile_dial(router, monkeypatch)
    caplog.set_level(logging.WARNING, logger="agent_sandbox.router")
    start = time.perf_counter()
    resp = await _exchange(router.http_port or 0, "/x", ROUTING)
    assert time.perf_counter() - start < 0.5
    assert resp.status == 503, resp
    assert resp.headers.get("retry-after") == "1"
    assert b"open files" in resp.body
    assert len(dials) == 1
    assert any("file descriptors" in r.getMessage() for r in caplog.records)
    text = await _scrape(router)
    assert 'sandbox_router_fd_exhaustion_total{side="dial"} 1.0' in text
    assert 'reason="resources"' in text
    assert 'reason="dial"' not in text


async def test_fd_exhaustion_on_the_h2c_dial_is_503(
    start_router: Callable[..., Awaitable[Router]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import h2.config
    import h2.connection
    import h2.events

    router = await start_router("--enable-h2c")
    dials = _emfile_dial(router, monkeypatch)
    h2conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    h2conn.initiate_connection()
    headers = [(":method", "GET"), (":path", "/x"), (":scheme", "http"), (":authority", "r")]
    headers += [(k.lower(), v) for k, v in ROUTING.items()]
    h2conn.send_headers(1, headers, end_stream=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    writer.write(h2conn.data_to_send())
    status = None
    async with asyncio.timeout(5):
        while status is None:
            data = await reader.read(65536)
            assert data
            for event in h2conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
            writer.write(h2conn.data_to_send())
    writer.close()
    assert status == b"503"
    assert len(dials) == 1
    text = await _scrape(router)
    assert 'sandbox_router_fd_exhaustion_total{side="dial"} 1.0' in text
