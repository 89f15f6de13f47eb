"""A saturated controller keeps its lease (issue 11): renewals land within the renew deadline on a real Lease.

The controller under test is a real manager with client-go's timings (lease 15 s, renew deadline 10 s,
retry 2 s) whose event loop and API client are both saturated on purpose (`benchmarks.lease_saturation`):

* the shared client is throttled to 2 requests/s (burst 1) and 32 workers keep writing through it, so a
  request waits ~16 s for a token: longer than the renew deadline;
* every reconcile first spins the CPU for 0.4 s without awaiting, so the event loop is busy most of the time.

With the elector on the manager's loop and client (before issue 11) both tests fail: the renewal times out
after 10 s, the manager stops with `LeaderElectionLost`, and the rival takes the lease. The tests also check
that the load really was that heavy, so they cannot pass vacuously.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from benchmarks.lease_saturation import Load, Saturated, saturated_controller

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import LEASE, ApiClient, LeaderElectionConfig, ThreadedLeaderElector

pytestmark = pytest.mark.integration

LEASE_NAME = "saturation-test"
SATURATED_FOR = 30.0  # seconds: 15 renewal rounds, twice the lease duration
RENEW_DEADLINE = 10.0
LOAD = Load()


def _assert_saturated(s: Saturated) -> None:
    """The load was as heavy as intended: otherwise a pass would prove nothing."""
    assert s.hog.passes >= 20, f"only {s.hog.passes} reconciles ran"
    worst_wait = max(s.hog.write_waits, default=0.0)
    assert worst_wait > RENEW_DEADLINE, (
        f"the shared client never made a request wait longer than the renew deadline ({worst_wait:.1f}s)"
    )
    lag = max(s.loop_lag, default=0.0)
    assert lag >= LOAD.spin / 2, f"the event loop was not saturated (worst lag {lag:.2f}s)"


@pytest.fixture
async def saturated(cluster: DevCluster, kube: ApiClient, namespace: str) -> AsyncIterator[Saturated]:
    """The saturated controller, leading the Lease `saturation-test`; stopped (and the Lease released) after."""
    async with saturated_controller(
        str(cluster.kubeconfig), kube, namespace, lease=LEASE_NAME, identity="saturated", load=LOAD
    ) as s:
        yield s


def _running(s: Saturated) -> None:
    if s.task.done():
        pytest.fail(f"the manager stopped: {s.task.exception()!r}")
    assert s.elector.is_leader


async def test_renewals_land_within_the_deadline_while_loop_and_client_are_saturated(
    saturated: Saturated,
) -> None:
    s = saturated
    assert isinstance(s.elector, ThreadedLeaderElector)  # the manager's default
    assert s.elector.config.renew_deadline == RENEW_DEADLINE  # client-go's timings, not shortened ones
    rounds_before = len(s.elector.renew_rounds)
    await asyncio.sleep(SATURATED_FOR)
    _running(s)
    rounds = [r.seconds for r in list(s.elector.renew_rounds)[rounds_before:]]
    _assert_saturated(s)
    # One round every retry period (2 s) over 30 s, each well inside the 10 s renew deadline.
    assert len(rounds) >= 10, f"only {len(rounds)} renewal rounds in {SATURATED_FOR:.0f}s"
    assert max(rounds) < RENEW_DEADLINE, f"a renewal round took {max(rounds):.2f}s"


async def test_the_saturated_leader_keeps_the_lease_against_a_second_candidate(
    saturated: Saturated, cluster: DevCluster, kube: ApiClient, namespace: str
) -> None:
    # The rival campaigns from its own thread and client: it takes over as soon as the leader's renewals
    # stop for a lease duration (15 s) on the rival's clock.
    rival = ThreadedLeaderElector(
        await ApiClient.from_kubeconfig(str(cluster.kubeconfig)),
        LeaderElectionConfig(name=LEASE_NAME, namespace=namespace, identity="rival"),
    )
    campaign = asyncio.create_task(rival.acquire())
    try:
        await asyncio.sleep(SATURATED_FOR)
        assert not campaign.done(), "the rival acquired the lease"
        _running(saturated)
        assert rival.observed_holder == "saturated"
        lease: Any = await kube.get(LEASE, LEASE_NAME, namespace=namespace)
        assert lease["spec"]["holderIdentity"] == "saturated"
        assert lease["spec"]["leaseTransitions"] == 0
        _assert_saturated(saturated)
    finally:
        campaign.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await campaign
        await rival.close()
