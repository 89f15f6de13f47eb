"""A caller's `X-Sandbox-Timeout` that runs out before the sandbox is reached is a 504, never a 502.

The SDK sends a call's timeout as `X-Sandbox-Timeout`; a 502 `Could not connect` tells it the sandbox is
unreachable (it retries and reads the Sandbox: ~16 s for a call that asked for microseconds), a 504 that
its own time ran out. Under uvloop (the deployed router's loop) the loop clock has whole-millisecond
resolution: a dial cut by a sub-millisecond deadline used to find `loop.time()` still short of it and
answered 502 (a probe on a dev cluster: sometimes, for `timeout=1e-4`/`1e-6` on a healthy sandbox).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from .conftest import Backend, RouterProcess, exchange, raw_request, request_bytes

pytestmark = pytest.mark.integration

ATTEMPTS = 40


@pytest.mark.parametrize("sandbox_timeout", ["1e-06", "0.0001"])
async def test_a_tiny_sandbox_timeout_is_504_on_a_healthy_sandbox(
    router_process: Callable[..., RouterProcess], backend: Backend, sandbox_timeout: str
) -> None:
    router = router_process("--access-log=false")
    seen: dict[int, int] = {}
    for _ in range(ATTEMPTS):
        resp = await exchange(
            router.port, request_bytes("GET", "/", backend.headers(**{"X-Sandbox-Timeout": sandbox_timeout}))
        )
        seen[resp.status] = seen.get(resp.status, 0) + 1
        if resp.status == 200:
            continue  # the sandbox answered within the time: fine
        assert resp.status == 504, (resp.status, resp.body, seen)
        detail = json.loads(resp.body)["detail"]
        assert detail.startswith("Timed out waiting for the backend sandbox: sb ("), detail
        assert "X-Sandbox-Timeout)" in detail, detail
    assert seen.get(504), seen  # the point of the test: the deadline did cut requests


async def test_a_dead_backend_is_still_502_within_a_sandbox_timeout(
    router_process: Callable[..., RouterProcess],
) -> None:
    """Upstream's wire text for a real connection failure is kept when the caller's time has not run out."""
    router = router_process("--upstream-retry-initial-delay=10ms", "--upstream-retry-max-delay=20ms")
    headers = {
        "X-Sandbox-ID": "gone",
        "X-Sandbox-Pod-IP": "127.250.255.254",
        "X-Sandbox-Port": "9",
        "X-Sandbox-Timeout": "30",
    }
    resp = await raw_request(router.port, request_bytes("GET", "/", headers))
    assert resp.status == 502
    assert json.loads(resp.body) == {"detail": "Could not connect to the backend sandbox: gone"}
