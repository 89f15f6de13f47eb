"""Tracing spans and W3C propagation; h2c (gRPC) pass-through behind `--enable-h2c`."""

from __future__ import annotations

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
        "http.target": "/traced?x=1",
        "http.status_code": 200,
        "sandbox.id": "sb",
        "sandbox.namespace": "team",
        "sandbox.upstream_source": "pod-ip",
    }
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # continued the trace
    forwarded = {k.lower(): v for k, v in backend.seen[-1]["headers"]}
    # The sandbox sees the router's span as its parent.
    assert forwarded["traceparent"] == f"00-0af7651916cd43dd8448eb211c80319c-{span.context.span_id:016x}-01"


@pytest.fixture
async def grpc_backend() -> AsyncIterator[tuple[str, int]]:
    """A real gRPC server (generic handler, raw bytes) on its own loopback address."""
    ip = fresh_ip()

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
    port = server.add_insecure_port(f"{ip}:0")
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
