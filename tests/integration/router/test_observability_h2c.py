"""Tracing spans and W3C propagation; h2c (gRPC) pass-through behind `--enable-h2c`."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from agent_sandbox.kube import Tracing
from agent_sandbox.router import Router
from agent_sandbox.router._upstream import UpstreamPool
from tests.helpers import eventually

from .conftest import Backend, fresh_ip

pytestmark = pytest.mark.integration


async def test_request_span_and_propagation(
    start_router: Callable[..., Awaitable[Router]], backend: Backend
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider.get_tracer("sandbox-router"), TraceContextTextMapPropagator(), provider)
    router = await start_router(tracing=tracing)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = backend.headers(traceparent=parent, **{"X-Sandbox-Namespace": "team"})
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{router.http_port}/traced?x=1", headers=headers, data=b"x") as resp,
    ):
        assert resp.status == 200
    (span,) = exporter.get_finished_spans()
    assert span.name == "HTTP POST"
    assert span.attributes is not None
    assert dict(span.attributes) | {} == {
        "http.method": "POST",
        "http.target": "/traced",  # the path only, as upstream's r.URL.Path (the query can carry secrets)
        "http.status_code": 200,
        "sandbox.id": "sb",
        "sandbox.namespace": "team",
        "sandbox.upstream_source": "pod-ip",
    }
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # continued the trace
    forwarded = {k.lower(): v for k, v in backend.seen[-1]["headers"]}
    # The sandbox sees the router's span as its parent.
    assert forwarded["traceparent"] == f"00-0af7651916cd43dd8448eb211c80319c-{span.context.span_id:016x}-01"


def echo_server(ip: str, port: int = 0) -> tuple[grpc.aio.Server, int]:
    """A real gRPC server (generic handler, raw bytes) bound to `ip:port`, not started."""

    async def say(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        meta = dict(context.invocation_metadata() or ())
        return b"echo:" + request + b" for " + str(meta.get("x-sandbox-id", "")).encode()

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "echo.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)}
            ),
        )
    )
    return server, server.add_insecure_port(f"{ip}:{port}")


@pytest.fixture
async def grpc_backend() -> AsyncIterator[tuple[str, int]]:
    """A started `echo_server` on its own loopback address."""
    ip = fresh_ip()
    server, port = echo_server(ip)
    await server.start()
    try:
        yield ip, port
    finally:
        await server.stop(None)


def metadata(ip: str, port: int, sandbox: str = "sb") -> tuple[tuple[str, str], ...]:
    return (("x-sandbox-id", sandbox), ("x-sandbox-pod-ip", ip), ("x-sandbox-port", str(port)))


async def test_grpc_through_the_router(
    start_router: Callable[..., Awaitable[Router]], grpc_backend: tuple[str, int]
) -> None:
    ip, port = grpc_backend
    router = await start_router("--enable-h2c")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        say = channel.unary_unary("/echo.Echo/Say")
        for i in range(3):  # several streams on the one pinned connection
            assert (
                await say(f"hi {i}".encode(), metadata=metadata(ip, port), timeout=10)
                == f"echo:hi {i} for sb".encode()
            )
        # A stream naming another sandbox is refused unprocessed on the pinned connection (GOAWAY); gRPC
        # retries it on a new connection, which the router pins to the other sandbox.
        assert (
            await say(b"x", metadata=metadata(ip, port, sandbox="other"), timeout=10) == b"echo:x for other"
        )
    # Each h2c connection counts once, when it ends (method label "other": the HTTP/2 preface's PRI).
    labels = {"method": "other", "code": "200", "sandbox_namespace": "default"}

    async def counted() -> bool:
        return router.metrics.registry.get_sample_value("sandbox_router_requests_total", labels) == 2

    await eventually(counted, "both h2c connections counted", within=5)


async def test_grpc_refusals_carry_grpc_status(start_router: Callable[..., Awaitable[Router]]) -> None:
    router = await start_router("--enable-h2c")
    cases = [
        ((), grpc.StatusCode.INVALID_ARGUMENT, "X-Sandbox-ID header is required."),
        (
            (("x-sandbox-id", "sb"), ("x-sandbox-pod-ip", "169.254.169.254")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "Invalid target IP address.",
        ),
        (
            metadata("127.250.255.253", 9),
            grpc.StatusCode.UNAVAILABLE,
            "Could not connect to the backend sandbox: sb",
        ),
    ]
    for meta, code, detail in cases:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/echo.Echo/Say")(b"x", metadata=meta, timeout=15)
            assert (err.value.code(), err.value.details()) == (code, detail)


async def test_h2c_is_off_by_default(router: Router) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await channel.unary_unary("/echo.Echo/Say")(b"x", metadata=(("x-sandbox-id", "sb"),), timeout=10)
    assert err.value.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    )


@pytest.mark.parametrize("server_speaks_first", [True, False])
async def test_what_a_server_sends_before_the_tunnel_attaches(server_speaks_first: bool) -> None:
    """An HTTP/2 server sends its SETTINGS as soon as it accepts. On a busy router those bytes can be
    read before the coroutine that dialled resumes and attaches the tunnel: an h2c dial keeps them for
    the tunnel (it used to close the connection, and the client saw "Socket closed"); an HTTP/1.1
    connection still refuses a server that speaks out of turn."""
    preface = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame

    async def speak_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(preface)
        await reader.read()  # hold the connection until the router closes it
        writer.close()

    server = await asyncio.start_server(speak_first, fresh_ip(), 0)
    host, port = server.sockets[0].getsockname()[:2]
    loop = asyncio.get_running_loop()
    upstream = await UpstreamPool().dial(
        host, port, deadline=loop.time() + 10, server_speaks_first=server_speaks_first
    )
    try:

        async def settled() -> bool:  # the loop runs other work before anything attaches to the connection
            return upstream.closed or bytes(upstream.early or b"") == preface

        await eventually(settled, "the server's first bytes read", within=10, interval=0.05)
        if server_speaks_first:
            assert not upstream.closed
            assert upstream.early == preface
        else:
            assert upstream.closed
    finally:
        upstream.close()
        server.close()
        await server.wait_closed()


async def test_grpc_reaches_a_sandbox_that_starts_listening_late(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    """A just-Ready (or just-resumed) sandbox whose gRPC port is not open yet: the h2c dial is retried
    with backoff like an HTTP/1.1 dial, so the call succeeds instead of ending UNAVAILABLE."""
    ip = fresh_ip()
    with socket.socket() as probe:  # a port on the sandbox's address that nothing listens on yet
        probe.bind((ip, 0))
        port = probe.getsockname()[1]
    router = await start_router("--enable-h2c")
    retries = {"sandbox_namespace": "default"}
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        call = asyncio.ensure_future(
            channel.unary_unary("/echo.Echo/Say")(b"late", metadata=metadata(ip, port), timeout=15)
        )

        async def refused_once() -> bool:
            value = router.metrics.registry.get_sample_value("sandbox_router_upstream_retries_total", retries)
            return bool(value)

        await eventually(refused_once, "a refused dial retried", within=10, interval=0.02)
        server, bound = echo_server(ip, port)
        assert bound == port
        await server.start()
        try:
            assert await call == b"echo:late for sb"
        finally:
            await server.stop(None)
