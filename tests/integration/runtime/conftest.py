"""A real runtime server on 127.0.0.1 (ephemeral ports, temporary root) per test, plus leak checks.

These tests start real processes; no fakes. After every test the root must have no process left working in
it and the test process no unreaped child.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from grpc import aio

from agent_sandbox.runtime import RuntimeConfig, RuntimeServer
from tests.integration.runtime.helpers import ProcessClient, leaked_processes, zombie_children

MakeRuntime = Callable[..., Awaitable[RuntimeServer]]


@pytest.fixture
async def make_runtime(tmp_path: Path) -> AsyncIterator[MakeRuntime]:
    """Start runtime servers with config overrides; all are stopped and checked for leaks afterwards."""
    servers: list[RuntimeServer] = []

    async def make(**overrides: Any) -> RuntimeServer:
        root = overrides.pop("root_dir", tmp_path / f"root{len(servers)}")
        config = RuntimeConfig(
            root_dir=root, listen_host="127.0.0.1", legacy_port=0, rest_port=0, grpc_port=0, **overrides
        )
        server = RuntimeServer(config)
        await server.start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        await server.stop(2.0)
    for server in servers:
        assert leaked_processes(server.root) == [], "processes left running in the root"
    assert zombie_children() == [], "unreaped children of the test process"


@pytest.fixture
async def runtime(make_runtime: MakeRuntime) -> RuntimeServer:
    """One runtime server with the default limits."""
    return await make_runtime()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


@pytest.fixture
async def grpc_client(runtime: RuntimeServer) -> AsyncIterator[ProcessClient]:
    channel = aio.insecure_channel(f"127.0.0.1:{runtime.ports['grpc']}")
    try:
        yield ProcessClient(channel)
    finally:
        await channel.close()


def url(server: RuntimeServer, protocol: str, path: str) -> str:
    return f"http://127.0.0.1:{server.ports[protocol]}{path}"
