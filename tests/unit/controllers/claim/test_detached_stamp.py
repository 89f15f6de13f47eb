"""The post-Ready first-ready stamp sent off the worker (`ClaimReconciler.detach_metadata_writes`).

The controller process frees the worker right after the status write; the stamp follows from a background
task. These pin what must not change with it: the same writes and annotations, one stamp in flight per
claim, a failure re-enqueued and backfilled exactly like the synchronous path - and that only the stamp is
detached or held: the claim's intent metadata is on it before its status shows Ready.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.kube import SANDBOX_CLAIM, Request
from agent_sandbox.kube.errors import TransportError
from tests.unit.controllers.claim.builders import (
    NS,
    T0,
    World,
    claim,
    claim_ready,
    fail_metadata_once,
    is_first_ready_stamp,
    member,
    sample,
    standard,
)

pytestmark = pytest.mark.unit

CTRL_COUNT = "agent_sandbox_claim_controller_startup_latency_ms_count"


async def _drain() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_pass_returns_after_the_status_write_and_the_stamp_follows() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    world.observed.record(NS, "c1", "c1-uid", T0)
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    gate = asyncio.Event()
    real = world.fake.patch

    async def slow_metadata(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        if is_first_ready_stamp(kind, patch, **kw):
            await gate.wait()
        return await real(kind, name, patch, **kw)

    world.fake.patch = slow_metadata  # type: ignore[method-assign]
    before = sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl")
    await world.reconcile()
    cl = world.get(SANDBOX_CLAIM, "c1")
    assert claim_ready(cl)["status"] == "True"  # type: ignore[index]
    assert c.ANNOTATION_CLAIM_FIRST_READY_AT not in (cl["metadata"].get("annotations") or {})
    assert cl["metadata"]["annotations"][c.ANNOTATION_SANDBOX_NAME] == "pool-a"
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1

    await world.reconcile()  # a pass while the stamp is in flight sends no second (backfill) patch
    gate.set()
    await _drain()
    ann = world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert ann[c.ANNOTATION_CLAIM_FIRST_READY_AT] == "2026-01-01T12:00:00.3Z"
    assert ann[c.ANNOTATION_SANDBOX_NAME] == "pool-a"
    assert ann[c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT] == "2026-01-01T12:00:00Z"
    assert [w for w in world.writes() if w[1] == "SandboxClaim"] == [
        ("patch", "SandboxClaim", "c1"),  # intent: assignment, first-observed
        ("patch", "SandboxClaim", "c1"),  # status
        ("patch", "SandboxClaim", "c1"),  # first-ready stamp, once
    ]
    assert retried == []
    world.clear_actions()
    await world.reconcile()
    assert world.writes() == []
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1


async def test_failed_detached_stamp_is_retried_and_backfilled_never_double_counted() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    fail_metadata_once(world)
    before = sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl")
    await world.reconcile()  # the pass itself succeeds: the failure happens in the background
    await _drain()
    assert retried == [Request(NS, "c1")]
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["status"] == "True"  # type: ignore[index]
    await world.reconcile()  # the retry: Ready was persisted, so backfill instead of recording again
    await _drain()
    ann = world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert ann[c.ANNOTATION_CLAIM_FIRST_READY_AT] == "unknown"
    assert sample(CTRL_COUNT, launch_type="warm", sandbox_template="tmpl") == before + 1


async def test_detached_stamp_waits_while_claims_arrive_and_carries_the_claim_uid() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    pressure = ClaimPressure(30.0, calm_after=0.2)
    world.reconciler.pressure = pressure
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    sent: list[Any] = []
    real = world.fake.patch

    async def record(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        if is_first_ready_stamp(kind, patch, **kw):
            sent.append(patch)
        return await real(kind, name, patch, **kw)

    world.fake.patch = record  # type: ignore[method-assign]
    pressure.note_arrival()
    await world.reconcile()
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["status"] == "True"  # type: ignore[index]
    await asyncio.sleep(0.05)
    assert sent == []  # still hot: the bookkeeping write waits
    ann = world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert ann[c.ANNOTATION_SANDBOX_NAME] == "pool-a"  # ... but the intent never does
    assert c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT in ann
    await pressure.wait_calm(5.0)
    await _drain()
    assert len(sent) == 1
    assert sent[0]["metadata"]["uid"] == "c1-uid"
    assert c.ANNOTATION_CLAIM_FIRST_READY_AT in world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert retried == []


async def test_a_claim_deleted_while_its_stamp_waits_is_not_patched() -> None:
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    pressure = ClaimPressure(30.0, calm_after=0.1)
    world.reconciler.pressure = pressure
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    pressure.note_arrival()
    await world.reconcile()
    world.clear_actions()
    await world.fake.delete(SANDBOX_CLAIM, "c1", namespace=NS)
    await pressure.wait_calm(5.0)
    await _drain()
    assert [w for w in world.writes() if w[0] == "patch"] == []  # no stamp
    assert retried == []
    assert world.reconciler._stamping == {}


async def test_a_graceful_stop_sends_the_held_stamp_at_once() -> None:
    """`ClaimPressure.flush` (the manager's graceful stop, before the Lease is released) ends the hold and
    returns once the stamp is written: a successor would only find a Ready claim without it (`unknown`)."""
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    pressure = ClaimPressure(30.0, calm_after=30.0)  # claims keep arriving for the whole test
    pressure.report_held(world.reconciler)
    world.reconciler.pressure = pressure
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    pressure.note_arrival()
    await world.reconcile()
    await _drain()
    assert pressure.unwritten() == {"claim_stamp": 1}
    await asyncio.wait_for(pressure.flush(), 1.0)
    ann = world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert ann[c.ANNOTATION_CLAIM_FIRST_READY_AT] == "2026-01-01T12:00:00.3Z"  # when it became Ready
    assert pressure.unwritten() == {"claim_stamp": 0}
    assert retried == []
    pressure.note_arrival()  # claims still arriving while the process stops hold nothing any more
    assert not pressure.hot()
    assert pressure.wait(None) is None


async def test_a_stamp_that_fails_during_the_graceful_stop_is_counted_as_lost_not_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The controller queue is shut down by then (a retry would vanish) and the successor can only write
    `unknown`: the manager's warning must name the stamp. (Before: counted 0, "retrying" logged.)"""
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    pressure = ClaimPressure(30.0, calm_after=30.0)
    pressure.report_held(world.reconciler)
    world.reconciler.pressure = pressure
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    pressure.note_arrival()
    await world.reconcile()
    await _drain()
    assert pressure.unwritten() == {"claim_stamp": 1}
    real = world.fake.patch

    async def refused(kind: Any, name: str, patch: Any, **kw: Any) -> Any:
        if is_first_ready_stamp(kind, patch, **kw):
            raise TransportError("PATCH sandboxclaims: connection refused")
        return await real(kind, name, patch, **kw)

    world.fake.patch = refused  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO):
        await asyncio.wait_for(pressure.flush(), 1.0)
    assert c.ANNOTATION_CLAIM_FIRST_READY_AT not in world.get(SANDBOX_CLAIM, "c1")["metadata"]["annotations"]
    assert pressure.unwritten() == {"claim_stamp": 1}
    assert pressure.held_writes() == {"claim_stamp": 0}  # the gauge: nothing held behind claims any more
    assert retried == []
    assert "retrying" not in caplog.text
    assert "first-ready stamp failed while stopping, not retried" in caplog.text


async def test_a_failed_stamp_counts_as_unwritten_until_its_retry_pass_runs() -> None:
    """A stamp failing during the drain re-enqueues into a queue that is shutting down (or whose backoff
    outlasts the stop): nothing would send it, so a stop counts it until a pass for the claim ran."""
    world = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    pressure = ClaimPressure(0.0)  # --sandbox-claim-priority-hold=0: the stamp is still detached
    pressure.report_held(world.reconciler)
    retried: list[Request] = []
    world.reconciler.detach_metadata_writes(retried.append)
    fail_metadata_once(world)
    await world.reconcile()
    await _drain()
    assert retried == [Request(NS, "c1")]  # the queue drops it: it is shutting down
    await asyncio.wait_for(pressure.flush(), 1.0)
    assert pressure.unwritten() == {"claim_stamp": 1}
    # Had the retry pass run, the stamp would be backfilled (or the claim gone): nothing left to count.
    world2 = World(*standard(member("pool-a")), (SANDBOX_CLAIM, claim()))
    retried2: list[Request] = []
    world2.reconciler.detach_metadata_writes(retried2.append)
    fail_metadata_once(world2)
    await world2.reconcile()
    await _drain()
    assert world2.reconciler.unwritten() == {"claim_stamp": 1}
    await world2.reconcile()  # the retry pass
    await _drain()
    assert world2.reconciler.unwritten() == {"claim_stamp": 0}
