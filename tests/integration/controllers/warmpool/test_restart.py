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
import time
from collections.abc import Iterator

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, is_ours, stop
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    Object,
)
from tests import helpers
from tests.helpers import CreationLog, is_ready

pytestmark = pytest.mark.integration

EXT = "extensions.agents.x-k8s.io/v1beta1"
REPLICAS = 40


def wait_served(cluster: DevCluster) -> None:
    """The controller re-patches the CRDs at start-up (brief 503s); wait until pools are served."""
    admin = cluster.admin()
    body = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "probe"},
        "spec": {"sandboxTemplateRef": {"name": "x"}},
    }
    path = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxwarmpools?dryRun=All"
    deadline = time.monotonic() + 30
    while (status := admin.request("POST", path, body)[0]) != 201:
        assert time.monotonic() < deadline, f"sandboxwarmpools not served (HTTP {status})"
        time.sleep(0.1)


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
    wait_served(cluster)
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }
    pool = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "pool"},
        "spec": {"replicas": REPLICAS, "sandboxTemplateRef": {"name": "tmpl"}},
    }
    await kube.create(SANDBOX_TEMPLATE, template, namespace=ns)
    async with CreationLog(kube, ns) as log:
        await kube.create(SANDBOX_WARM_POOL, pool, namespace=ns)
        # Slow start: batches of 1, 2, 4, ... - kill once the first batches landed, mid-fill.
        await eventually(lambda: _true(len(log.added) >= 3), "the first creates")
        first = launches[0]
        assert is_ours(first.pid, first.exe)
        os.kill(first.pid, signal.SIGKILL)  # no drain, expectations lost with the process
        stop(first)  # reaps it (by PID)
        at_kill = len(log.added)
        assert at_kill < REPLICAS, "the pool filled before the kill; the test would prove nothing"

        launches.append(start_controller(cluster))
        wait_served(cluster)

        async def full() -> list[Object] | None:
            live = await kube.list(
                SANDBOX, namespace=ns, label_selector={c.LABEL_WARM_POOL_SANDBOX: naming.name_hash("pool")}
            )
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
