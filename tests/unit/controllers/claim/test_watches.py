"""Claim controller watches: predicates, map functions, warm-queue feeding (controllers spec §4.1, §4.2)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.claim.observability import ObservedTimes
from agent_sandbox.controllers.claim.queue import WarmQueue
from agent_sandbox.controllers.claim.store import Freshest
from agent_sandbox.controllers.claim.watches import (
    POOL_EVENTS,
    TEMPLATE_CREATED,
    ClaimLifecycleHandler,
    PoolDeletionHandler,
    WarmQueueFeeder,
    claim_cache_transform,
    map_pool_to_claims,
    map_template_to_claims,
    sandbox_status_changed,
    timing_predicate,
)
from agent_sandbox.controllers.claim_pressure import ClaimPressure
from agent_sandbox.controllers.indexes import (
    INDEX_CLAIM_POOL,
    INDEX_POOL_TEMPLATE_REF,
    claim_pool_index,
    pool_template_ref_index,
    sandbox_claim_uid_index,
)
from agent_sandbox.kube import SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, Cache, Request
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.claim.builders import NS, T0, claim, member, pool, ready_cond, template

pytestmark = pytest.mark.unit


def _with(obj: dict[str, Any], **status: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"].update(status)
    return out


BASE = member("s")
STATUS_CHANGES = [
    ("metadata only", {**copy.deepcopy(BASE), "metadata": {**BASE["metadata"], "labels": {"x": "y"}}}, False),
    ("podIPs", _with(BASE, podIPs=["10.9.9.9"]), True),
    ("Ready status", _with(BASE, conditions=[ready_cond("False")]), True),
    (
        "Ready reason only (SandboxExpired)",
        _with(BASE, conditions=[ready_cond("True", c.REASON_SANDBOX_EXPIRED)]),
        True,
    ),
    (
        "Finished appears",
        _with(BASE, conditions=[*BASE["status"]["conditions"], {"type": "Finished", "status": "True"}]),
        True,
    ),
    (
        "other condition",
        _with(BASE, conditions=[*BASE["status"]["conditions"], {"type": "Suspended", "status": "False"}]),
        False,
    ),
    (
        "deletion starts",
        {**copy.deepcopy(BASE), "metadata": {**BASE["metadata"], "deletionTimestamp": "t"}},
        True,
    ),
    ("nodeName only", _with(BASE, nodeName="n2"), False),
    (
        "Ready observedGeneration only",
        _with(BASE, conditions=[{**ready_cond(), "observedGeneration": 2}]),
        False,
    ),
]


@pytest.mark.parametrize(("case", "new", "want"), STATUS_CHANGES, ids=[s[0] for s in STATUS_CHANGES])
def test_owned_sandbox_update_filter(case: str, new: dict[str, Any], want: bool) -> None:
    assert sandbox_status_changed(BASE, new) is want


def test_finished_is_compared_whole_because_it_is_mirrored_verbatim() -> None:
    finished = {"type": "Finished", "status": "True", "reason": "PodSucceeded", "observedGeneration": 1}
    old = _with(BASE, conditions=[*BASE["status"]["conditions"], finished])
    new = _with(BASE, conditions=[*BASE["status"]["conditions"], {**finished, "observedGeneration": 2}])
    assert sandbox_status_changed(old, new)


def test_pool_and_template_predicates() -> None:
    p = pool()
    p["metadata"]["generation"] = 1
    status_only = {**copy.deepcopy(p), "status": {"replicas": 3}}
    respec = copy.deepcopy(p)
    respec["metadata"]["generation"] = 2
    assert POOL_EVENTS.create(p)
    assert POOL_EVENTS.delete(p)
    assert not POOL_EVENTS.update(p, status_only)
    assert POOL_EVENTS.update(p, respec)
    t = template()
    assert TEMPLATE_CREATED.create(t)
    assert not TEMPLATE_CREATED.update(t, t)
    assert not TEMPLATE_CREATED.delete(t)


def test_timing_predicate_records_first_sighting_per_uid() -> None:
    seen = ObservedTimes()
    now = [T0]
    pred = timing_predicate(seen, lambda: now[0])
    cl = claim()
    assert pred.create(cl)
    now[0] = T0 + timedelta(seconds=5)
    assert pred.update(cl, cl)
    assert seen.get(NS, "c1", "c1-uid") == T0  # the first sighting sticks
    recreated = claim(uid="other-uid")
    assert pred.delete(recreated)  # a delete of another UID must not drop the live entry
    assert seen.get(NS, "c1", "c1-uid") == T0
    assert pred.create(recreated)
    assert seen.get(NS, "c1", "other-uid") == T0 + timedelta(seconds=5)
    assert pred.delete(recreated)
    assert len(seen) == 0


def test_indexes() -> None:
    assert claim_pool_index(claim()) == ["pool"]
    assert claim_pool_index({"metadata": {}, "spec": {"warmPoolRef": {"name": ""}}}) == []
    assert sandbox_claim_uid_index(member("m")) == []  # pool-owned
    owned = member("m", owner_kind=c.KIND_SANDBOX_CLAIM, pool_uid="claim-uid")
    assert sandbox_claim_uid_index(owned) == ["claim-uid"]


def _feeder() -> tuple[WarmQueue, WarmQueueFeeder, list[object]]:
    queue, woken = WarmQueue(), []
    return queue, WarmQueueFeeder(queue, Freshest(), woken.append), woken


def test_feeder_adds_adoptable_members_and_refreshes_node() -> None:
    queue, feeder, _ = _feeder()
    feeder.on_add(member("a", ips=()))
    feeder.on_add(member("claimed", owner_kind=c.KIND_SANDBOX_CLAIM))
    feeder.on_add(member("other", pool_name="p2"))
    assert queue.names("ns/pool") == ["a"]
    assert queue.names("ns/p2") == ["other"]
    old = member("a", ips=())
    feeder.on_update(old, member("a", node="n1"))
    assert queue.names("ns/pool") == ["a"]
    assert queue.size("ns/pool") == 1


def test_feeder_removes_deleted_members_and_pool_deletion_drops_the_queue() -> None:
    queue, feeder, _ = _feeder()
    for name in ("a", "b"):
        feeder.on_add(member(name))
    feeder.on_delete(member("a"))
    assert queue.names("ns/pool") == ["b"]
    PoolDeletionHandler(queue).on_delete(pool())
    assert len(queue) == 0


def test_feeder_wakes_waiting_claims_when_a_member_gets_its_ip() -> None:
    queue, feeder, woken = _feeder()
    feeder.on_add(member("a", ips=()))
    queue.wait("ns/pool", Request(NS, "c1"))
    feeder.on_update(member("a", ips=()), member("a", ips=(), node="n1"))  # still no IP: nobody woken
    assert woken == []
    feeder.on_update(member("a", ips=()), member("a"))
    assert woken == [Request(NS, "c1")]
    feeder.on_update(member("a", ips=()), member("a"))
    assert woken == [Request(NS, "c1")]  # waiters are woken once


@pytest.fixture
async def cache() -> AsyncIterator[tuple[FakeClient, Cache]]:
    bound = claim("bound", status={"sandbox": {"name": "s"}})
    deleting = claim("deleting")
    deleting["metadata"]["finalizers"] = ["x/y"]
    fake = FakeClient(
        (SANDBOX_TEMPLATE, template()),
        (SANDBOX_WARM_POOL, pool()),
        (SANDBOX_WARM_POOL, pool("pool2", uid="p2")),
        (SANDBOX_WARM_POOL, pool("other", tmpl="t2", uid="p3")),
        (SANDBOX_CLAIM, claim("c1")),
        (SANDBOX_CLAIM, claim("c2", pool_name="pool2")),
        (SANDBOX_CLAIM, claim("c3", pool_name="other")),
        (SANDBOX_CLAIM, bound),
        (SANDBOX_CLAIM, deleting),
    )
    await fake.delete(SANDBOX_CLAIM, "deleting", namespace=NS)
    cache = Cache(fake)
    cache.add_index(SANDBOX_CLAIM, INDEX_CLAIM_POOL, claim_pool_index)
    cache.add_index(SANDBOX_WARM_POOL, INDEX_POOL_TEMPLATE_REF, pool_template_ref_index)
    task = asyncio.create_task(cache.start())
    await asyncio.wait_for(cache.wait_for_sync(), 5)
    try:
        yield fake, cache
    finally:
        task.cancel()


async def test_pool_events_wake_only_unbound_live_claims(cache: tuple[FakeClient, Cache]) -> None:
    _, c_ = cache
    got = map_pool_to_claims(c_)(pool())
    assert got == [Request(NS, "c1")]  # "bound" is bound, "deleting" is being deleted


async def test_template_creation_wakes_claims_of_every_pool_using_it(cache: tuple[FakeClient, Cache]) -> None:
    _, c_ = cache
    got = sorted(map_template_to_claims(c_)(template()), key=lambda r: r.name)
    assert got == [Request(NS, "bound"), Request(NS, "c1"), Request(NS, "c2")]


async def test_only_claims_still_waiting_for_a_sandbox_count_as_claim_pressure() -> None:
    pressure = ClaimPressure(15.0)
    handler = ClaimLifecycleHandler(Freshest(), pressure)
    handler.on_add(claim("ready", status={"conditions": [ready_cond("True")]}))
    gone = claim("gone")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    handler.on_add(gone)
    handler.on_update(claim("c1"), claim("c1"))
    assert pressure.arrivals == 0
    assert not pressure.hot()
    handler.on_add(claim("new"))
    handler.on_add(claim("pending", status={"conditions": [ready_cond("False")]}))
    assert pressure.arrivals == 2
    assert pressure.hot()


def test_the_claim_cache_keeps_managed_fields_only_of_applied_claims() -> None:
    """The intent patch's reset decision reads them (docs/design/managed-fields.md)."""
    update = {"manager": "python-httpx", "operation": "Update"}
    apply = {"manager": "argocd-controller", "operation": "Apply"}
    posted = {"metadata": {"name": "a", "managedFields": [update]}}
    applied = {"metadata": {"name": "b", "managedFields": [update, apply]}}
    assert "managedFields" not in claim_cache_transform(posted)["metadata"]
    assert claim_cache_transform(applied)["metadata"]["managedFields"] == [update, apply]
    assert claim_cache_transform({"metadata": {"name": "c"}}) == {"metadata": {"name": "c"}}


def test_a_deleted_claim_is_remembered_until_its_delete_event_or_the_ttl() -> None:
    now = [0.0]
    fresh = Freshest(ttl=30.0, clock=lambda: now[0])
    handler = ClaimLifecycleHandler(fresh, ClaimPressure(15.0))
    fresh.mark_deleted("c1-uid")
    fresh.mark_deleted("c2-uid")
    assert fresh.deleted("c1-uid")
    assert fresh.deleted("c2-uid")
    assert not fresh.deleted("other")
    handler.on_delete(claim("c1"))  # the informer delivered it
    assert not fresh.deleted("c1-uid")
    now[0] = 31.0  # never delivered (a lost event): forgotten after the TTL
    assert not fresh.deleted("c2-uid")
