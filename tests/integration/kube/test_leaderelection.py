"""Leader election on a real Lease: one winner, fast hand-over on release, takeover after a crash."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import LEASE, ApiClient, LeaderElectionConfig, LeaderElector

pytestmark = pytest.mark.integration


def _elector(client: ApiClient, namespace: str, identity: str, **timings: float) -> LeaderElector:
    cfg = LeaderElectionConfig(name="test-lease", namespace=namespace, identity=identity, **timings)
    return LeaderElector(client, cfg)


async def test_only_one_leader_and_release_hands_over_within_2s(
    cluster: DevCluster, kube: ApiClient, namespace: str
) -> None:
    # A second, independent client: two candidates that share nothing but the API server.
    async with await ApiClient.from_kubeconfig(str(cluster.kubeconfig)) as other:
        a = _elector(kube, namespace, "a")
        b = _elector(other, namespace, "b")
        await asyncio.wait_for(a.acquire(), 10)
        hold_a = asyncio.create_task(a.hold())
        acquire_b = asyncio.create_task(b.acquire())
        await asyncio.sleep(2.5)  # b gets at least one full retry period to (wrongly) win
        assert not acquire_b.done()
        lease = await kube.get(LEASE, "test-lease", namespace=namespace)
        assert lease["spec"]["holderIdentity"] == "a"

        hold_a.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hold_a
        released_at = time.monotonic()
        assert await a.release()
        await asyncio.wait_for(acquire_b, 10)
        handover = time.monotonic() - released_at
        assert b.is_leader
        assert handover <= 2.0, f"hand-over took {handover:.2f}s"
        lease = await kube.get(LEASE, "test-lease", namespace=namespace)
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1


async def test_crashed_leader_is_replaced_after_lease_expiry(
    cluster: DevCluster, kube: ApiClient, namespace: str
) -> None:
    timings = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}
    async with await ApiClient.from_kubeconfig(str(cluster.kubeconfig)) as other:
        a = _elector(kube, namespace, "a", **timings)
        b = _elector(other, namespace, "b", **timings)
        await asyncio.wait_for(a.acquire(), 10)
        # "Crash": a stops renewing without releasing.
        crashed_at = time.monotonic()
        await asyncio.wait_for(b.acquire(), 15)
        waited = time.monotonic() - crashed_at
        # b must have respected the lease (observed on b's own clock) before taking over.
        assert waited >= 3.0 - 0.5
        lease = await kube.get(LEASE, "test-lease", namespace=namespace)
        assert lease["spec"]["holderIdentity"] == "b"
