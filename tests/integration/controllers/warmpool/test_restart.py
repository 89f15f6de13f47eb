"""Creates == spec.replicas exactly across a controller SIGKILL mid-fill (controllers spec §3.6).

The real `agent-sandbox-controller --extensions` process fills a pool; it is SIGKILLed (no drain, its
in-memory expectations are lost) while create batches are in flight, and a fresh process takes over. Every
Sandbox creation in the namespace is counted from a watch that starts before the pool exists: the pool
must have created exactly `replicas` members - no duplicate from the restarted process re-creating
toward the target off its new cache, none missing.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import Iterator

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.kube import (
    SANDBOX_WARM_POOL,
    ApiClient,
    Object,
)
from tests import helpers
from tests.helpers import CreationLog, is_ready
from tests.integration.controllers.builders import create_template_and_pool, pool_members

pytestmark = pytest.mark.integration

REPLICAS = 40


eventually = functools.partial(helpers.eventually, within=120.0)


@pytest.fixture
def launches(cluster: DevCluster) -> Iterator[list[Started]]:
    procs: list[Started] = []
    try:
        yield procs
    finally:
        for p in procs:
            stop(p)


async def test_creates_equal_replicas_across_sigkill_and_restart(
    kube: ApiClient, cluster: DevCluster, namespace: str, launches: list[Started]
) -> None:
    ns = namespace
    launches.append(start_controller(cluster))
    async with CreationLog(kube, ns) as log:
        await create_template_and_pool(kube, ns, replicas=REPLICAS)
        # Slow start: batches of 1, 2, 4, ... - kill once the first batches landed, mid-fill.
        await eventually(lambda: _true(len(log.added) >= 3), "the first creates")
        first = launches[0]
        assert is_ours(first.pid, first.exe)
        os.kill(first.pid, signal.SIGKILL)  # no drain, expectations lost with the process
        stop(first)  # reaps it (by PID)
        at_kill = len(log.added)
        assert at_kill < REPLICAS, "the pool filled before the kill; the test would prove nothing"

        launches.append(start_controller(cluster))

        async def full() -> list[Object] | None:
            live = await pool_members(kube, ns)
            p = await kube.get(SANDBOX_WARM_POOL, "pool", namespace=ns)
            st = p.get("status") or {}
            ok = (
                len(live) == REPLICAS
                and all(is_ready(m) for m in live)
                and st.get("readyReplicas") == REPLICAS
            )
            return live if ok else None

        live = await eventually(full, f"{REPLICAS} Ready members after the restart")
        # Let any straggling create of either process surface in the watch before counting.
        await asyncio.sleep(1.0)
    assert len(log.added) == REPLICAS, (
        f"{len(log.added)} creates for {REPLICAS} replicas (killed at {at_kill})"
    )
    assert sorted(log.added) == sorted(m["metadata"]["name"] for m in live)


async def _true(value: bool) -> bool:
    return value
