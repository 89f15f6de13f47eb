"""Fixtures of the lifecycle tests: the real controller with `--sandbox-lifecycle` (one per module)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with the lifecycle controller on (installs the SandboxArchive CRD and grants)."""
    started = start_controller(cluster, extra=("--sandbox-lifecycle",))
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session
