"""ThreadedLeaderElector: the elector runs on its own thread and loop, and the manager uses it by default.

The Lease store is an in-memory fake used only from the elector's thread. Timings are small real
durations with wide margins: what is checked is where and whether renewals happen, never how fast.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agent_sandbox.kube import (
    LEASE,
    ApiClient,
    ClusterConfig,
    LeaderElectionConfig,
    LeaderElectionLost,
    Manager,
    ManagerOptions,
    ServerError,
    ThreadedLeaderElector,
)
from agent_sandbox.kube._config import NoAuth
from agent_sandbox.kube._manager import LEASE_CLIENT_BURST, LEASE_CLIENT_QPS
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit


async def eventually(probe: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


FAST = {"lease_duration": 0.9, "renew_deadline": 0.6, "retry_period": 0.05}


class ThreadRecordingClient(FakeClient):
    """Records the thread of every Lease call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()
        self.closed_on: str | None = None

    def _record(self, verb: str, kind: Any, namespace: str | None, name: str | None) -> None:
        self.threads.add(threading.current_thread().name)
        super()._record(verb, kind, namespace, name)

    async def close(self) -> None:
        self.closed_on = threading.current_thread().name


def _leading(**options: Any) -> ManagerOptions:
    """Manager options with leader election on Lease ns/lease and no servers."""
    return ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        leader_election=True,
        leader_election_id="lease",
        leader_election_namespace="ns",
        **options,
    )


def _threaded(client: FakeClient, identity: str = "a", **timings: float) -> ThreadedLeaderElector:
    cfg = LeaderElectionConfig(name="lease", namespace="ns", identity=identity, **(timings or FAST))
    return ThreadedLeaderElector(client, cfg)  # type: ignore[arg-type]


async def test_campaign_renewals_release_and_close_all_run_on_the_elector_thread() -> None:
    fake = ThreadRecordingClient()
    elector = _threaded(fake)
    await asyncio.wait_for(elector.acquire(), 5)
    assert elector.is_leader
    hold = asyncio.create_task(elector.hold())
    await eventually(lambda: len(elector.renew_rounds) >= 3, "three renewals")
    hold.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hold
    assert await asyncio.wait_for(elector.release(), 5)
    await elector.close()
    assert fake.threads == {"leader-election"}
    assert fake.closed_on == "leader-election"
    lease: Any = await fake.get(LEASE, "lease", namespace="ns")
    assert lease["spec"].get("holderIdentity") is None
    assert elector.thread is not None
    assert not elector.thread.is_alive()


async def test_renewals_continue_while_the_callers_loop_is_blocked() -> None:
    elector = _threaded(ThreadRecordingClient())
    await asyncio.wait_for(elector.acquire(), 5)
    hold = asyncio.create_task(elector.hold())
    await asyncio.sleep(0.2)
    before = len(elector.renew_rounds)
    # CPU-bound work on the caller's loop for longer than the lease: no await, the loop cannot run.
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        sum(range(1000))
    during = len(elector.renew_rounds) - before
    assert not hold.done()
    assert during >= 5, f"only {during} renewals while the loop was blocked"
    assert max(r.seconds for r in elector.renew_rounds) < FAST["renew_deadline"]
    hold.cancel()
    await elector.release()
    await elector.close()


async def test_losing_the_lease_on_the_thread_raises_in_the_caller() -> None:
    fake = ThreadRecordingClient()
    elector = _threaded(fake)
    await asyncio.wait_for(elector.acquire(), 5)
    fake.inject_error("*", ServerError(500, "InternalError", "etcd down"), kind=LEASE, times=10_000)
    with pytest.raises(LeaderElectionLost, match="etcd down"):
        await asyncio.wait_for(elector.hold(), 5)
    assert not elector.is_leader
    assert not await elector.release()  # nothing to give up
    await elector.close()


async def test_the_manager_holds_the_lease_through_the_thread_and_releases_it_on_stop() -> None:
    lease_store = ThreadRecordingClient()
    made: list[ThreadedLeaderElector] = []

    def new_elector(_api: Any, cfg: LeaderElectionConfig) -> ThreadedLeaderElector:
        made.append(ThreadedLeaderElector(lease_store, cfg))  # type: ignore[arg-type]
        return made[-1]

    opts = _leading(retry_period=0.05, renew_deadline=0.6, lease_duration=0.9, new_elector=new_elector)
    mgr = Manager(FakeClient(), opts)  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(mgr.elected.wait(), 5)
    await eventually(lambda: len(made[0].renew_rounds) >= 2, "two renewals")
    stop.set()
    await asyncio.wait_for(task, 10)
    lease: Any = await lease_store.get(LEASE, "lease", namespace="ns")
    assert lease["spec"].get("holderIdentity") is None  # released
    assert made[0].thread is not None
    assert not made[0].thread.is_alive()


def test_the_managers_default_elector_has_its_own_client_and_rate_budget() -> None:
    api = ApiClient(ClusterConfig(server="https://127.0.0.1:1", ssl=None, auth=NoAuth()), qps=1, burst=1)
    mgr = Manager(api, _leading())
    elector = mgr.elector
    assert isinstance(elector, ThreadedLeaderElector)
    lease_client = elector._client
    assert lease_client is not api
    assert lease_client._bucket is not api._bucket
    assert (lease_client._bucket.qps, lease_client._bucket.burst) == (LEASE_CLIENT_QPS, LEASE_CLIENT_BURST)
    assert lease_client._base_headers["User-Agent"].endswith("/leader-election")
    # client-go semantics are unchanged.
    assert (elector.config.lease_duration, elector.config.renew_deadline, elector.config.retry_period) == (
        15.0,
        10.0,
        2.0,
    )
