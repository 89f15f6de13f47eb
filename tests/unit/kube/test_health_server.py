"""The probe server's checks carry upstream's names (spec controllers.md §5.3 step 9: `healthz`, `readyz`)."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from agent_sandbox.kube._servers import HealthServer

pytestmark = pytest.mark.unit


async def test_checks_are_named_healthz_and_readyz() -> None:
    server = HealthServer("127.0.0.1:0")
    serving = asyncio.create_task(server.start())
    try:
        await asyncio.wait_for(server.wait_serving(), 10)
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as session:
            for path, body in (("/healthz/healthz", "ok"), ("/readyz/readyz", "ok")):
                async with session.get(base + path) as resp:
                    assert (resp.status, await resp.text()) == (200, body), path
            async with session.get(base + "/readyz?verbose") as resp:
                assert "[+]readyz ok" in await resp.text()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
