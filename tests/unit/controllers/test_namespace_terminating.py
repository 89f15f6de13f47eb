"""Creates refused because the namespace is being deleted are nothing to do (as for kube's ReplicaSet).

kube-apiserver refuses every create in a namespace being deleted (403 with a `NamespaceTerminating` cause).
The claim's cold create, the pool's member creates and the Sandbox's child creates then end the pass
quietly: no error (no backoff retries, no `reconciler error` line), no FailedCreate Event, no status write
that would report a failure. Any other 403 (an RBAC grant missing) stays a loud failure.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.controllers.claim.result import ClaimRetry
from agent_sandbox.controllers.indexes import INDEX_POD_NAME_HASH, pod_name_hash_index
from agent_sandbox.controllers.sandbox import SandboxReconcileError, SandboxReconciler
from agent_sandbox.controllers.sandbox.expectations import ChildExpectations
from agent_sandbox.controllers.warmpool import WarmPoolConfig, WarmPoolReconciler
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_WARM_POOL,
    SERVICE,
    Forbidden,
    NotFound,
    Request,
    Result,
)
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.claim.builders import NS as CLAIM_NS
from tests.unit.controllers.claim.builders import T0, World, claim, claim_ready, standard
from tests.unit.controllers.sandbox.builders import NOW, SB, sandbox, vct
from tests.unit.controllers.warmpool.fixtures import NS as POOL_NS
from tests.unit.controllers.warmpool.fixtures import standard as pool_standard
from tests.unit.kube.test_namespace_terminating import rbac, terminating

pytestmark = pytest.mark.unit


def loud(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Records at warning level or above (what an operator would be paged for)."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- claim: cold create


async def test_a_cold_create_refused_in_a_terminating_namespace_ends_the_pass_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    world = World(*standard(), (SANDBOX_CLAIM, claim()))  # pool of 0: cold
    world.observed.record(CLAIM_NS, "c1", "c1-uid", T0)
    world.fake.inject_error("create", terminating("c1", CLAIM_NS, "sandboxes.agents.x-k8s.io"), kind=SANDBOX)
    result = await world.reconcile()
    assert result.requeue_after is None  # nothing to come back for: the namespace is going
    assert world.events.events == []  # no FailedCreate
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1")) is None  # no ReconcilerError written
    assert world.writes() == [("create", "Sandbox", "c1")]
    assert loud(caplog) == []


async def test_a_cold_create_refused_by_rbac_stays_an_error() -> None:
    world = World(*standard(), (SANDBOX_CLAIM, claim()))
    world.observed.record(CLAIM_NS, "c1", "c1-uid", T0)
    world.fake.inject_error("create", rbac("c1"), kind=SANDBOX)
    with pytest.raises(ClaimRetry, match="cannot create resource"):
        await world.reconcile()
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == c.REASON_RECONCILER_ERROR  # type: ignore[index]
    assert [e[1] for e in world.events.events] == [c.EVENT_FAILED_CREATE]


# --------------------------------------------------------------------------- warm pool: member creates


async def test_member_creates_refused_in_a_terminating_namespace_are_no_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    fake = pool_standard(3)
    fake.inject_error("create", terminating("", POOL_NS, "sandboxes.agents.x-k8s.io"), kind=SANDBOX)
    rec = WarmPoolReconciler(fake, config=WarmPoolConfig(grace_jitter=0))
    await rec.reconcile(Request(POOL_NS, "pool"))  # no raise: no backoff storm
    assert fake.objects(SANDBOX) == []
    assert [a[:2] for a in fake.actions if a[0] == "create"] == [("create", "Sandbox")]  # slow start stopped
    assert rec.expectations.satisfied("ns/pool")  # the refused create was lowered
    assert loud(caplog) == []


async def test_member_creates_refused_by_rbac_stay_an_error() -> None:
    fake = pool_standard(3)
    fake.inject_error("create", rbac(), kind=SANDBOX)
    rec = WarmPoolReconciler(fake, config=WarmPoolConfig(grace_jitter=0))
    with pytest.raises(Forbidden):
        await rec.reconcile(Request(POOL_NS, "pool"))
    assert "status" not in fake.objects(SANDBOX_WARM_POOL)[0]


# --------------------------------------------------------------------------- sandbox: child creates


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def event(self, regarding: Any, type_: Any, reason: str, action: str, note: str) -> None:
        self.events.append((type_, reason))


def sandbox_reconciler(client: FakeClient, **kw: Any) -> SandboxReconciler:
    return SandboxReconciler(client, client, now=lambda: NOW, **kw)


def sandbox_client(**kw: Any) -> FakeClient:
    client = FakeClient((SANDBOX, sandbox(**kw)))
    client.add_index(POD, INDEX_POD_NAME_HASH, lambda o: list(pod_name_hash_index(o)))
    return client


@pytest.mark.parametrize(
    ("kind", "spec"),
    [(POD, {}), (PVC, {"vcts": [vct("data")]}), (SERVICE, {"service": True})],
    ids=["pod", "pvc", "service"],
)
async def test_a_child_create_refused_in_a_terminating_namespace_ends_the_pass_quietly(
    kind: Any, spec: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = sandbox_client(**spec)
    client.inject_error("create", terminating(SB, "ns", kind.plural), kind=kind, times=10)
    events, expectations = Events(), ChildExpectations()
    result = await sandbox_reconciler(client, events=events, expectations=expectations).reconcile(
        Request("ns", SB)
    )
    assert result.requeue_after is None
    assert events.events == []  # no FailedCreate
    assert not expectations.pending((kind,), "ns", SB)  # the refused create is not waited for
    assert "status" not in client.objects(SANDBOX)[0]  # no ReconcilerError written
    assert loud(caplog) == []


async def test_a_child_create_refused_by_rbac_stays_an_error_with_its_event() -> None:
    client = sandbox_client()
    client.inject_error("create", rbac(SB), kind=POD)
    events = Events()
    with pytest.raises(SandboxReconcileError, match="cannot create resource"):
        await sandbox_reconciler(client, events=events).reconcile(Request("ns", SB))
    assert events.events == [("Warning", c.EVENT_FAILED_CREATE)]


async def test_a_pool_deleted_during_the_pass_is_done_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """Its status write answers NotFound (seen deleting a namespace): as if the pass had not found it."""
    caplog.set_level(logging.DEBUG)
    fake = pool_standard(2)
    gone = NotFound(404, "NotFound", 'sandboxwarmpools.extensions.agents.x-k8s.io "pool" not found')
    fake.inject_error("patch", gone, kind=SANDBOX_WARM_POOL, name="pool")
    rec = WarmPoolReconciler(fake, config=WarmPoolConfig(grace_jitter=0))
    assert await rec.reconcile(Request(POOL_NS, "pool")) == Result()
    assert rec.expectations.satisfied("ns/pool")  # its records are forgotten, as for a pool not found
    assert loud(caplog) == []
