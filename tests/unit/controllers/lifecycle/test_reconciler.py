"""`LifecycleReconciler` over the in-memory FakeClient: what it remembers per Sandbox is let go with it."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.controllers.lifecycle.metrics import LifecycleMetrics
from agent_sandbox.controllers.lifecycle.reconciler import LifecycleReconciler
from agent_sandbox.kube import SANDBOX, Object, Request
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.sandbox.builders import NS, sandbox

pytestmark = pytest.mark.unit

BAD = {lc.ANNOTATION_IDLE_TIMEOUT: "soon"}  # not a duration: an InvalidLifecycleSettings Event


class Events:
    def __init__(self) -> None:
        self.reasons: list[tuple[str, str]] = []

    def event(self, regarding: Object, type_: Any, reason: str, action: str, note: str) -> None:
        self.reasons.append((regarding["metadata"]["name"], reason))


def reconciler(client: FakeClient, events: Events) -> LifecycleReconciler:
    metrics = LifecycleMetrics(CollectorRegistry())
    return LifecycleReconciler(client, probe=None, events=events, metrics=metrics, extensions=False)


async def test_problem_reports_are_forgotten_with_their_sandboxes() -> None:
    client, events = FakeClient(), Events()
    rec = reconciler(client, events)
    names = [f"sb-{i}" for i in range(20)]
    for name in names:
        await client.create(SANDBOX, sandbox(name, uid=f"uid-{name}", annotations=BAD), namespace=NS)
        await rec.reconcile(Request(NS, name))
        await rec.reconcile(Request(NS, name))  # the same problems: not reported twice
    assert events.reasons == [(n, "InvalidLifecycleSettings") for n in names]
    assert rec.reported == 20
    for name in names:
        await client.delete(SANDBOX, name, namespace=NS)
        await rec.reconcile(Request(NS, name))
    assert rec.reported == 0


async def test_a_recreated_sandbox_is_reported_again() -> None:
    client, events = FakeClient(), Events()
    rec = reconciler(client, events)
    await client.create(SANDBOX, sandbox("sb", uid="uid-1", annotations=BAD), namespace=NS)
    await rec.reconcile(Request(NS, "sb"))
    await client.delete(SANDBOX, "sb", namespace=NS)
    await client.create(SANDBOX, sandbox("sb", uid="uid-2", annotations=BAD), namespace=NS)
    await rec.reconcile(Request(NS, "sb"))  # the delete's pass never ran: the UID tells them apart
    assert events.reasons == [("sb", "InvalidLifecycleSettings")] * 2
