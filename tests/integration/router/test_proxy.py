"""The routing contract end to end (router spec §1.2-§1.8) through a real router to real backends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from agent_sandbox.router import Router

from .conftest import (
    Backend,
    exchange,
    fresh_ip,
    raw_backend,
    raw_request,
    request_bytes,
    scrape,
    still_serving,
)

pytestmark = pytest.mark.integration


def url(router: Router, path: str = "/") -> str:
    return f"http://127.0.0.1:{router.http_port}{path}"


async def test_forwarding_rewrites_headers_as_upstream(router: Router, backend: Backend) -> None:
    async with aiohttp.ClientSession() as s:
        headers = backend.headers(
            Authorization="Bearer secret",
            **{
                "X-Forwarded-For": "6.6.6.6",
                "X-Sandbox-UID": "u-1",
                "X-Custom": "kept",
                "Connection": "X-Hop",
                "X-Hop": "1",
            },
        )
        async with s.post(url(router, "/a/b%2Fc/..%2Fd?q=1&r=%20"), headers=headers, data=b"payload") as resp:
            assert resp.status == 200
            seen = await resp.json()
    got = {k.lower(): v for k, v in seen["headers"]}
    assert seen["raw_path"] == "/a/b%2Fc/..%2Fd?q=1&r=%20"  # raw path and query, byte for byte
    assert seen["body_len"] == 7
    assert got["host"] == f"{backend.ip}:{backend.port}"
    assert "authorization" not in got
    assert got["x-forwarded-for"] == "127.0.0.1"  # replaced by the observed peer
    assert got["x-forwarded-host"] == f"127.0.0.1:{router.http_port}"
    assert got["x-forwarded-proto"] == "http"
    assert got["x-sandbox-id"] == "sb"
    assert got["x-sandbox-uid"] == "u-1"
    assert got["x-custom"] == "kept"
    assert "x-hop" not in got  # named in Connection: hop-by-hop


async def test_healthz_is_the_routers(router: Router, backend: Backend) -> None:
    for method in ("GET", "POST", "DELETE"):
        resp = await raw_request(
            router.http_port or 0, request_bytes(method, "/healthz?x=1", backend.headers())
        )
        assert (resp.status, resp.body) == (200, b'{"status":"ok"}')
        assert resp.headers["content-type"] == "application/json"
    assert not backend.seen  # never proxied


async def test_upstream_statuses_are_verbatim(router: Router, backend: Backend) -> None:
    async with aiohttp.ClientSession() as s:
        for code in (201, 404, 418, 500, 503):
            async with s.get(url(router, f"/status/{code}"), headers=backend.headers()) as resp:
                assert resp.status == code
                assert await resp.text() == f"sandbox says {code}"
                assert resp.headers["X-From"] == "sandbox"
        async with s.get(url(router, "/nocontent"), headers=backend.headers()) as resp:
            assert resp.status == 204
            assert await resp.read() == b""
        async with s.head(url(router, "/status/200"), headers=backend.headers()) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Length"] == str(len("sandbox says 200"))


async def test_keep_alive_and_pipelining(router: Router, backend: Backend) -> None:
    one = request_bytes("GET", "/first", backend.headers())
    two = request_bytes("POST", "/second", backend.headers(), b"xyz")
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    writer.write(one + two)  # pipelined: answered in order on one connection
    data = b""
    async with asyncio.timeout(10):
        while data.count(b"HTTP/1.1 200") < 2 or not data.rstrip().endswith(b"}"):
            data += await reader.read(65536)
    writer.close()
    assert data.index(b'"raw_path": "/first"') < data.index(b'"raw_path": "/second"')
    assert [s["raw_path"] for s in backend.seen] == ["/first", "/second"]


async def test_chunked_request_and_expect_continue(router: Router, backend: Backend) -> None:
    body = b"4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n"
    headers = backend.headers(**{"Transfer-Encoding": "chunked", "Expect": "100-continue"})
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    writer.write(request_bytes("POST", "/chunked", headers))
    async with asyncio.timeout(5):
        interim = await reader.readuntil(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert backend.seen[0]["body_len"] == 7


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_upgrade_offer_with_a_body_is_declined_and_the_body_forwarded(
    router: Router, backend: Backend, chunked: bool
) -> None:
    """`curl --http2` on an http:// URL offers `Upgrade: h2c` on every request, POSTs included: the router
    read the body as the new protocol and forwarded the request without it, so the sandbox waited for a
    body that never came (curl timed out with nothing received). Declined as a server may (RFC 9110 §7.8),
    the body is forwarded and the connection stays HTTP/1.1 for the next request."""
    payload = b"x" * 70_000
    offer = {
        "Connection": "Upgrade, HTTP2-Settings",
        "Upgrade": "h2c",
        "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA",
    }
    if chunked:
        body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload)
        first = request_bytes(
            "POST", "/offer", backend.headers(**offer, **{"Transfer-Encoding": "chunked"}), body
        )
    else:
        first = request_bytes("POST", "/offer", backend.headers(**offer), payload)
    second = request_bytes("POST", "/after", backend.headers(), b"xyz")
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    writer.write(first + second)  # one write: the body and the next request arrive with the head
    data = b""
    async with asyncio.timeout(10):
        while data.count(b"HTTP/1.1 200") < 2 or not data.rstrip().endswith(b"}"):
            chunk = await reader.read(65536)
            assert chunk, f"closed after {data!r}"
            data += chunk
    writer.close()
    assert b"101" not in data.split(b"\r\n", 1)[0]
    assert [(s["raw_path"], s["body_len"]) for s in backend.seen] == [("/offer", len(payload)), ("/after", 3)]
    forwarded = {name.lower() for name, _ in backend.seen[0]["headers"]}
    assert not forwarded & {"upgrade", "http2-settings"}  # hop-by-hop: the offer is the router's to decline


async def test_response_streams_chunk_by_chunk(router: Router, backend: Backend) -> None:
    arrivals: list[float] = []
    async with aiohttp.ClientSession() as s, s.get(url(router, "/drip/4"), headers=backend.headers()) as resp:
        async for line in resp.content:
            arrivals.append(time.monotonic())
            assert line.startswith(b"line ")
    assert len(arrivals) == 4
    # Lines leave the sandbox 0.3 s apart; buffered delivery would bunch them at the end.
    assert arrivals[-1] - arrivals[0] > 0.6


@pytest.mark.parametrize("body", [b"", b"written by an HTTP/1.0 server, ended by its close"])
async def test_a_body_ended_by_the_sandbox_closing(router: Router, body: bytes) -> None:
    """A response without Content-Length or chunking ends when the sandbox closes (what Python's
    http.server does by default). The router relays it chunked and must end the chunked body then: it
    used to leave the final chunk unsent, so the client waited until the idle timeout."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer((fresh_ip(), 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        ip, port = server.server_address[:2]
        headers = {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": str(ip), "X-Sandbox-Port": str(port)}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s,
            s.get(url(router, "/old"), headers=headers) as resp,
        ):
            assert resp.status == 200
            assert await resp.read() == body
        # and on a raw keep-alive connection, the chunked body is complete without the router closing
        resp_raw = await raw_request(router.http_port or 0, request_bytes("GET", "/old", headers), within=5)
        assert (resp_raw.status, resp_raw.body, resp_raw.closed) == (200, body, False)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_request_resent_after_a_dead_pooled_connection_carries_its_body(
    router: Router, chunked: bool
) -> None:
    """The sandbox closes a keep-alive connection the router pooled just as the next request goes out on it:
    the router sends the request again on a fresh connection. It used to send it without its body (taken
    from the client's buffer by the first attempt), so a POST reached the sandbox truncated and waited
    for bytes that never came (a 502 or 504 for the client). Only a request that may run twice is sent
    again (`test_resend.py`): this POST says so with an `Idempotency-Key`."""
    bodies: list[bytes] = []
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first, served = connections == 1, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                fields = dict(
                    line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
                )
                if b"content-length" in fields:
                    body = await reader.readexactly(int(fields[b"content-length"]))
                else:  # one chunk and the last (what aiohttp sends for a small async generator)
                    body = b""
                    while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)) > 0:
                        body += await reader.readexactly(size + 2)
                        body = body[:-2]
                    await reader.readuntil(b"\r\n")
                if first and served == 1:
                    break  # closed unanswered: what a keep-alive timeout racing the request looks like
                bodies.append(body)
                served += 1
                out = b"got " + body
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(out), out))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server, headers = await raw_backend(serve)

    async def payload(data: bytes) -> AsyncIterator[bytes]:
        yield data

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            for i in range(2):
                data = b"body %d" % i
                async with s.post(
                    url(router, "/x"),
                    headers={**headers, "Idempotency-Key": f"body-{i}"},
                    data=payload(data) if chunked else data,
                ) as resp:
                    assert (resp.status, await resp.read()) == (200, b"got " + data)
        assert bodies == [b"body 0", b"body 1"]
        assert connections == 2  # the second request went out on the pooled connection first
    finally:
        server.close()


async def test_a_connection_paused_for_a_slow_client_is_pooled_reading(
    router: Router, backend: Backend
) -> None:
    """A slow client (a browser after a large download) fills its buffer with a response's last bytes: the
    router pauses reading the sandbox connection just as the response completes, and pooled it paused, so the
    next request sent on it was never answered (a 504 after the 30 s header timeout; Chromium met it in CI)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port, limit=16384)
    writer.write(request_bytes("GET", "/download/4194304", backend.headers()))
    got, tail = 0, b""
    async with asyncio.timeout(60):
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        while not tail.endswith(b"\r\n0\r\n\r\n"):  # the last chunk (the body is all "d")
            chunk = await reader.read(16384)
            assert chunk, "closed before the end of the download"
            got, tail = got + len(chunk), (tail + chunk)[-16:]
            await asyncio.sleep(0.002)  # a client that takes bytes slowly: the router's buffer for it fills
    writer.close()
    assert got > 4 << 20
    # Every later request reaches the same sandbox over the pooled connections.
    for i in range(3):
        async with asyncio.timeout(10):
            answer = await exchange(
                router.http_port or 0, request_bytes("GET", f"/after/{i}", backend.headers())
            )
        assert answer.status == 200, answer


@pytest.mark.parametrize("endless", [True, False])
async def test_response_head_is_bounded(router: Router, endless: bool) -> None:
    """The sandbox is untrusted: a response head that never ends is cut off at 1 MiB with a 502 (it used to
    be buffered until the 30 s response-header timeout, hundreds of MB at loopback speed); a large head
    under the bound (900 KiB in many reads) is relayed."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Big: " + b"b" * 8000 + b"\r\n"
        try:
            for _ in range(100_000 if endless else 900 * 1024 // len(line)):
                writer.write(line)
                await writer.drain()
            writer.write(b"Content-Length: 2\r\n\r\nok")
            await writer.drain()
            await reader.read()
        except ConnectionError:
            pass
        writer.close()

    server, headers = await raw_backend(serve)
    try:
        start = time.monotonic()
        resp = await raw_request(router.http_port or 0, request_bytes("GET", "/", headers), within=10)
        if endless:
            assert resp.status == 502
            assert json.loads(resp.body) == {"detail": "Could not connect to the backend sandbox: sb"}
            assert time.monotonic() - start < 5  # not the 30 s response-header timeout
        else:
            assert (resp.status, resp.body) == (200, b"ok")
            assert len(resp.headers["x-big"]) == 8000
    finally:
        server.close()


async def test_dead_backend_is_502_after_retries(start_router: Callable[..., Awaitable[Router]]) -> None:
    router = await start_router("--upstream-retry-initial-delay=50ms", "--upstream-retry-max-delay=100ms")
    headers = {"X-Sandbox-ID": "gone", "X-Sandbox-Pod-IP": "127.250.255.254", "X-Sandbox-Port": "9"}
    start = time.monotonic()
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/", headers))
    assert resp.status == 502
    assert json.loads(resp.body) == {"detail": "Could not connect to the backend sandbox: gone"}
    assert time.monotonic() - start >= 0.05 + 0.1 + 0.1  # three backoffs: 50, 100, 100 ms
    metrics = await scrape(router)
    assert 'sandbox_router_upstream_retries_total{sandbox_namespace="default"} 3.0' in metrics
    assert 'sandbox_router_upstream_errors_total{reason="dial",sandbox_namespace="default"} 1.0' in metrics


async def test_timeouts_are_504(start_router: Callable[..., Awaitable[Router]], backend: Backend) -> None:
    router = await start_router("--response-header-timeout=500ms")
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/sleep/3", backend.headers()))
    assert resp.status == 504
    assert json.loads(resp.body) == {
        "detail": "Timed out waiting for the backend sandbox: sb (no response within 0.5 s: the router's "
        "--response-header-timeout; a client may ask for up to 180 s with X-Sandbox-Timeout)"
    }
    # X-Sandbox-Timeout: the client's own bound (capped by --proxy-timeout) also covers the headers wait.
    ok = await raw_request(
        router.http_port or 0, request_bytes("GET", "/sleep/1", backend.headers(**{"X-Sandbox-Timeout": "5"}))
    )
    assert ok.status == 200
    short = await raw_request(
        router.http_port or 0,
        request_bytes("GET", "/sleep/3", backend.headers(**{"X-Sandbox-Timeout": "0.3"})),
    )
    assert short.status == 504


async def test_proxy_timeout_caps_sandbox_timeout(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    router = await start_router("--proxy-timeout=400ms")
    start = time.monotonic()
    resp = await raw_request(
        router.http_port or 0,
        request_bytes("GET", "/sleep/3", backend.headers(**{"X-Sandbox-Timeout": "60"})),
    )
    assert resp.status == 504
    assert time.monotonic() - start < 2
    # Which limit cut it: a command still running must not read like a sandbox that is gone.
    assert json.loads(resp.body)["detail"] == (
        "Timed out waiting for the backend sandbox: sb "
        "(no response within 0.4 s: X-Sandbox-Timeout 60 s, capped by the router's --proxy-timeout)"
    )


async def test_a_stream_that_keeps_moving_outlives_the_proxy_timeout(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    """The proxy timeout bounds a stretch with nothing relayed, not the whole exchange (the legacy router's
    per-read timeout): a command's output stream, a long download or a slow upload that keeps moving is not
    cut mid-way - until December 5 it was, at 180 s, and the streamed command died with its connection."""
    router = await start_router("--proxy-timeout=1s")
    start = time.monotonic()
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/drip/8", backend.headers()))
    assert resp.status == 200
    assert resp.body == b"".join(f"line {i}\n".encode() for i in range(8))
    assert time.monotonic() - start > 2  # 8 lines 0.3 s apart: longer than the 1 s limit
    # An upload sent in pieces for longer than the limit (the request body keeps moving).
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port or 0)
    try:
        head = request_bytes("POST", "/upload", {**backend.headers(), "Transfer-Encoding": "chunked"})
        writer.write(head)
        for _ in range(8):
            writer.write(b"4\r\nabcd\r\n")
            await writer.drain()
            await asyncio.sleep(0.3)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert b'"received": 32' in answer
    finally:
        writer.close()


async def test_a_stalled_stream_is_cut_after_the_proxy_timeout(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    router = await start_router("--proxy-timeout=1s")
    start = time.monotonic()
    resp = await raw_request(
        router.http_port or 0, request_bytes("GET", "/drip/3?every=5", backend.headers()), within=8
    )
    elapsed = time.monotonic() - start
    assert resp.status == 200  # the head was relayed; the cut can only be a close mid-body
    assert resp.body == b"line 0\n"
    assert resp.closed
    assert 0.9 < elapsed < 4, elapsed


async def test_upgrade_over_plain_http_is_refused(
    router: Router, start_backend: Callable[..., Awaitable[Backend]]
) -> None:
    # A sandbox answering 101 to a request that did not ask to upgrade (legacy router's rule).
    server_ip = "127.250.254.9"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)
        writer.close()

    server = await asyncio.start_server(handle, server_ip, 0)
    port = server.sockets[0].getsockname()[1]
    try:
        headers = {"X-Sandbox-ID": "sb", "X-Sandbox-Pod-IP": server_ip, "X-Sandbox-Port": str(port)}
        resp = await raw_request(router.http_port or 0, request_bytes("GET", "/", headers))
        assert resp.status == 502
        assert json.loads(resp.body)["detail"].startswith("Backend attempted a WebSocket upgrade over HTTP.")
    finally:
        server.close()


async def test_metrics_names_and_labels(router: Router, backend: Backend) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(url(router, "/x"), headers=backend.headers(**{"X-Sandbox-Namespace": "team-a"})):
            pass
        async with s.get(url(router, "/x")):
            pass
    text = await scrape(router)
    assert 'sandbox_router_requests_total{code="200",method="GET",sandbox_namespace="team-a"} 1.0' in text
    assert 'sandbox_router_requests_total{code="400",method="GET",sandbox_namespace="-"} 1.0' in text
    assert 'sandbox_router_request_duration_seconds_bucket{code="200",le="0.005",method="GET"' in text
    assert 'le="180.0"' in text
    assert "sandbox_router_inflight_requests 0.0" in text
    assert 'sandbox_router_authz_decisions_total{decision="allow",sandbox_namespace="team-a"} 1.0' in text
    assert "sandbox_router_build_info{build_date=" in text
    for name in ("sandbox_router_upstream_errors_total", "sandbox_router_upstream_retries_total",
                 "sandbox_router_cache_invalidations_total", "sandbox_router_cert_reloads_total"):  # fmt: skip
        assert f"# TYPE {name} counter" in text


async def test_namespace_labels_are_bounded_by_what_was_routed(
    start_router: Callable[..., Awaitable[Router]], backend: Backend, tmp_path: Path
) -> None:
    """Namespaces in labels come from a header: refused requests with random ones added a series each
    (15,000 of them made a scrape take 6 s, stalling proxying and probes with it). Now a namespace is named
    once a request to it was resolved to a sandbox; refusals before that count under `-`."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 40)
    router = await start_router("--authz-mode=scoped-token", f"--authz-scoped-token-secret-file={secret}")
    async with aiohttp.ClientSession() as s:
        for i in range(200):
            headers = {"X-Sandbox-ID": "sb", "X-Sandbox-Namespace": f"random-{i}"}
            async with s.get(url(router, "/x"), headers=headers) as resp:
                assert resp.status == 401
    text = await scrape(router)
    labels = {
        line.split('sandbox_namespace="')[1].split('"')[0]
        for line in text.splitlines()
        if "sandbox_namespace=" in line
    }
    assert labels == {"-"}
    assert 'sandbox_router_requests_total{code="401",method="GET",sandbox_namespace="-"} 200.0' in text


async def test_access_log_fields(router: Router, backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sandbox-router.access")
    async with aiohttp.ClientSession() as s:
        headers = backend.headers(**{"User-Agent": "probe/1", "X-Sandbox-Namespace": "team-a"})
        async with s.get(url(router, "/logged?secret=1"), headers=headers) as resp:
            await resp.read()
        async with s.get(url(router, "/healthz")) as resp:
            await resp.read()
    records = [r for r in caplog.records if r.name == "sandbox-router.access"]
    assert len(records) == 1  # /healthz is not logged
    rec = records[0].__dict__
    assert records[0].getMessage() == "request"
    assert {
        k: rec[k]
        for k in ("method", "path", "status", "client_ip", "sandbox_id", "sandbox_namespace", "user_agent")
    } == {
        "method": "GET",
        "path": "/logged",
        "status": 200,
        "client_ip": "127.0.0.1",
        "sandbox_id": "sb",
        "sandbox_namespace": "team-a",
        "user_agent": "probe/1",
    }
    assert rec["bytes_out"] > 0
    assert rec["duration_ms"] >= 0


async def test_probes_and_draining(start_router: Callable[..., Awaitable[Router]], backend: Backend) -> None:
    router = await start_router("--shutdown-timeout=5s")

    def probe(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{router.probe_port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    assert await asyncio.to_thread(probe, "/healthz") == (200, '{"status":"ok"}')
    assert await asyncio.to_thread(probe, "/readyz") == (200, "ok")
    slow = asyncio.create_task(
        raw_request(router.http_port or 0, request_bytes("GET", "/sleep/1", backend.headers()))
    )
    await asyncio.sleep(0.3)
    drained = asyncio.create_task(router.shutdown())
    await asyncio.sleep(0.1)
    assert router.ready is False
    resp = await slow
    assert resp.status == 200  # in-flight request finished
    assert resp.headers.get("connection") == "close"
    await drained


async def test_header_timeout_starts_after_the_request_body(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    # Go's ResponseHeaderTimeout runs from the end of the request body: a slow upload is not cut off.
    router = await start_router("--response-header-timeout=1s")

    async def slow_body() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"x" * 1000
            await asyncio.sleep(0.4)

    async with (
        aiohttp.ClientSession() as s,
        s.post(url(router, "/upload"), headers=backend.headers(), data=slow_body()) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["received"] == 5000


async def _early_answering_backend() -> tuple[asyncio.Server, dict[str, str]]:
    """A sandbox that answers a chunked upload once the payload's own end marker is in, before the chunked
    terminator: what the runtime's multipart reader does at the closing boundary (aiohttp)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readuntil(b"END")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                await reader.readuntil(b"0\r\n\r\n")  # the terminator, whenever it comes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    return await raw_backend(serve)


async def test_an_answer_before_the_chunked_terminator_keeps_the_promised_connection(router: Router) -> None:
    """The sandbox answered an upload before the client's chunked terminator reached the router; the router
    relayed the answer as keep-alive and then closed the connection, so the client's next request on it
    failed (found chasing a one-off `ReadError: Connection reset by peer` in a 5,000-file `agent-sandbox cp`).
    The rest of the body is now read and dropped and the connection kept."""
    server, headers = await _early_answering_backend()
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    try:
        for n in range(3):
            head = request_bytes("POST", "/upload", {**headers, "Transfer-Encoding": "chunked"})
            writer.write(head + b"8\r\npart-END\r\n")
            async with asyncio.timeout(5):
                try:
                    answer = await reader.readuntil(b"ok")
                except asyncio.IncompleteReadError as err:
                    raise AssertionError(f"request {n}: closed after {err.partial!r}") from None
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert b"connection: close" not in answer.lower(), (n, answer)
            await asyncio.sleep(0.1)  # the terminator comes after the answer (its own TCP segment)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    finally:
        writer.close()
        server.close()
    await still_serving(router)


async def test_a_body_the_sandbox_did_not_wait_for_ends_the_connection_after_the_answer(
    router: Router,
) -> None:
    """More of the body than is worth reading after the answer (a large upload the sandbox refused at once):
    the connection closes, but only after the client can read the answer (a half-close that drains input,
    not a reset that would discard it)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 4\r\n\r\nbig!")
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        writer.close()

    server, headers = await raw_backend(serve)
    size = 64 << 20
    reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
    try:
        writer.write(request_bytes("PUT", "/v1/files/big", {**headers, "Content-Length": str(size)}))
        sent = 0
        answer = b""
        async with asyncio.timeout(10):
            while b"big!" not in answer and sent < size:
                writer.write(b"x" * (1 << 20))
                sent += 1 << 20
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.01):
                        answer += await reader.read(65536)
            while b"big!" not in answer:
                chunk = await reader.read(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 413"), answer
            assert await reader.read(65536) == b""  # then closed, cleanly
    finally:
        writer.close()
        server.close()
    await still_serving(router)
