"""The SDK around its client's `close()` and its calls' own timeouts, against the real control plane, router and
runtime (the same cases in memory: clients/python/tests/unit/test_close_cuts_calls.py, test_aclose_other_loop.py,
test_router_timeout_504.py).

Each failed until December 7:
- creates waiting for cold starts when the client's `with` block ended reconnected their claim watch, returned
  after the cleanup had run, and their claims were never deleted (sync threads and async tasks alike);
- `asyncio.run(work())` then `asyncio.run(client.close())` raised `RuntimeError: Event loop is closed`;
- a router's 504 for the call's own `X-Sandbox-Timeout` was a plain `SandboxRequestError` (and a GET was sent six
  times: 21.5 s for `timeout=1`).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    Sandbox,
    SandboxClient,
    SandboxConnectionError,
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxRequestTimeoutError,
)
from tests.helpers import wait_for

from .conftest import EXT, RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CREATES = 4
SANDBOXD = SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")


@pytest.fixture
def cold_pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    """A pool with no warm pods: every create waits for a cold start."""
    apply_pool(cluster, namespace, replicas=0, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=1, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def _claims(cluster: DevCluster, namespace: str) -> list[str]:
    status, out = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert status == 200, out
    return [item["metadata"]["name"] for item in out["items"]]


def _check_outcomes(outcomes: dict[int, tuple[object, float]], closed_at: float) -> None:
    """Each create returned before the close, or failed with the client-closed error; none returned after."""
    assert len(outcomes) == CREATES, outcomes
    cut = 0
    for what, at in outcomes.values():
        if isinstance(what, BaseException):
            assert isinstance(what, SandboxConnectionError), repr(what)
            assert "(client closed)" in str(what), repr(what)
            cut += 1
        else:
            assert at <= closed_at, f"a create returned {at - closed_at:.2f} s after the client closed"
    assert cut, "no create was in flight at the close: the case was not exercised"


def test_sync_creates_in_flight_when_the_with_block_ends_leave_nothing_behind(
    cluster: DevCluster, cold_pool: str
) -> None:
    outcomes: dict[int, tuple[object, float]] = {}
    with SandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig) as client:

        def create(i: int) -> None:
            try:
                made: object = client.create_sandbox("pool", cold_pool, sandbox_ready_timeout=90)
            except BaseException as err:  # reported to the test's thread
                made = err
            outcomes[i] = (made, time.monotonic())

        threads = [threading.Thread(target=create, args=(i,)) for i in range(CREATES)]
        for thread in threads:
            thread.start()
        # every claim POSTed: the creates wait for their claims now
        wait_for(lambda: len(_claims(cluster, cold_pool)) == CREATES, timeout=30, what="the claims")
    closed_at = time.monotonic()
    for thread in threads:
        thread.join(60)
    _check_outcomes(outcomes, closed_at)
    assert all(not isinstance(m, Sandbox) or not m.is_active for m, _ in outcomes.values())
    wait_for(lambda: _claims(cluster, cold_pool) == [], timeout=30, what="no claim left")


def test_async_creates_in_flight_when_the_client_closes_leave_nothing_behind(
    cluster: DevCluster, cold_pool: str
) -> None:
    outcomes: dict[int, tuple[object, float]] = {}

    async def main() -> float:
        client = AsyncSandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig, cleanup=False)

        async def create(i: int) -> None:
            try:
                made: object = await client.create_sandbox("pool", cold_pool, sandbox_ready_timeout=90)
            except BaseException as err:  # reported to the test
                made = err
            outcomes[i] = (made, time.monotonic())

        tasks = [asyncio.create_task(create(i)) for i in range(CREATES)]
        # every claim POSTed: the creates wait for their claims now
        await asyncio.to_thread(
            wait_for, lambda: len(_claims(cluster, cold_pool)) == CREATES, timeout=30, what="the claims"
        )
        async with client:
            pass
        closed_at = time.monotonic()
        await asyncio.wait(tasks, timeout=60)
        return closed_at

    closed_at = asyncio.run(main())
    _check_outcomes(outcomes, closed_at)
    wait_for(lambda: _claims(cluster, cold_pool) == [], timeout=30, what="no claim left")


def test_an_async_client_closed_on_a_new_event_loop(cluster: DevCluster, pool: str, router: str) -> None:
    client = AsyncSandboxClient(SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig)

    async def work() -> str:
        sandbox = await client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        return (await sandbox.commands.run("echo hi")).stdout

    assert asyncio.run(work()) == "hi\n"
    asyncio.run(client.close())  # raised RuntimeError: Event loop is closed

    async def cleanup() -> None:
        async with client:  # usable on a third loop: its claim is deleted
            pass

    asyncio.run(cleanup())
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="no claim left")


def test_the_routers_504_for_the_calls_own_timeout_is_a_timeout(
    cluster: DevCluster, pool: str, router: str
) -> None:
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        # The router's 504 and the client's own read timeout race (both at 1 s); the router's usually comes
        # first, and raised a plain SandboxRequestError "HTTP 504" until December 7. Three tries, each a timeout.
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(SandboxRequestTimeoutError) as ran:
                sandbox.commands.run("sleep 3", timeout=1)
            assert time.monotonic() - started < 3
            if ran.value.status_code is not None:  # the router's 504 (else the client's own read timeout)
                assert ran.value.status_code == 504, ran.value
                assert "X-Sandbox-Timeout" in str(ran.value), ran.value
        assert sandbox.commands.run("echo still here").stdout == "still here\n"
