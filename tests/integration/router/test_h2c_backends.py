"""h2c to a sandbox port that does not speak HTTP/2: a clear 502 / gRPC UNAVAILABLE naming the port.

The router passes h2c through byte for byte once the sandbox answers. A port that speaks only HTTP/1.1 (the
legacy runtime's 8888, sandboxd's REST 8080, any web app) answers the HTTP/2 preface with a 400; relayed, the
client read it as frames and failed with nothing to go on (curl: "Empty reply from server"; grpcio: a
protocol error). The router now checks the sandbox's first frame is SETTINGS (RFC 9113 section 3.4).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import httpx2
import pytest

from agent_sandbox.router import Router

from .conftest import Backend, scrape
from .test_h2c_pinning import OWN_CONNECTION, Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


def _headers(backend: Backend) -> dict[str, str]:
    return {"x-sandbox-id": "web", "x-sandbox-pod-ip": backend.ip, "x-sandbox-port": str(backend.port)}


async def test_a_grpc_call_to_an_http1_port_is_unavailable_naming_the_port(
    h2c_router: Router, backend: Backend
) -> None:
    target = f"127.0.0.1:{h2c_router.http_port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/echo.Echo/Who")(
                b"", metadata=tuple(_headers(backend).items()), timeout=10
            )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == (
        f"The backend sandbox web does not speak HTTP/2 (h2c) on port {backend.port}: "
        "it answered 'HTTP/1.0 400 Bad Request'"
    )
    # A real gRPC sandbox is served as before, on the same router.
    sandbox = Sandbox("grpc")
    await sandbox.server.start()
    try:
        async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
            who = channel.unary_unary("/echo.Echo/Who")
            assert await who(b"", metadata=sandbox.metadata(), timeout=10) == b"grpc"
    finally:
        await sandbox.server.stop(None)
    metrics = await scrape(h2c_router)
    # Counted once, as refused (not also as a 200 tunnel).
    assert (
        'sandbox_router_requests_total{code="502",method="other",sandbox_namespace="default"} 1.0' in metrics
    )
    assert (
        'sandbox_router_requests_total{code="200",method="other",sandbox_namespace="default"} 1.0' in metrics
    )


async def test_an_http2_request_to_an_http1_port_gets_a_json_502(
    h2c_router: Router, backend: Backend
) -> None:
    async with httpx2.AsyncClient(http1=False, http2=True) as client:  # prior knowledge, as curl's flag
        resp = await client.get(f"http://127.0.0.1:{h2c_router.http_port}/x", headers=_headers(backend))
    assert resp.http_version == "HTTP/2"
    assert resp.status_code == 502
    assert resp.json() == {
        "detail": f"The backend sandbox web does not speak HTTP/2 (h2c) on port {backend.port}: "
        "it answered 'HTTP/1.0 400 Bad Request'"
    }
    assert not backend.seen  # nothing reached the application: its server refused the preface
