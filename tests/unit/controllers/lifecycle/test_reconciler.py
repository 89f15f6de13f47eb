"""`LifecycleReconciler` over the in-memory FakeClient: what it remembers per Sandbox is let go with it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.controllers.lifecycle.decide import archive_owner_ref
from agent_sandbox.controllers.lifecycle.metrics import LifecycleMetrics
from agent_sandbox.controllers.lifecycle.reconciler import LifecycleReconciler
from agent_sandbox.kube import PVC, SANDBOX, NotFound, Object, Request
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.sandbox.builders import NS, sandbox

pytestmark = pytest.mark.unit

BAD = {lc.ANNOTATION_IDLE_TIMEOUT: "soon"}  # not a duration: an InvalidLifecycleSettings Event


class Events:
    def __init__(self) -> None:
        self.reasons: list[tuple[str, str]] = []
        self.notes: list[str] = []

    def event(self, regarding: Object, type_: Any, reason: str, action: str, note: str) -> None:
        self.reasons.append((regarding["metadata"]["name"], reason))
        self.notes.append(note)


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


async def test_every_unusable_annotation_is_named_in_one_event() -> None:
    """Events of one object, reason and action are one series that keeps its first note (the recorder, as
    client-go's): one Event per problem named only the first unusable annotation (until December 6)."""
    client, events = FakeClient(), Events()
    rec = reconciler(client, events)
    bad = {
        lc.ANNOTATION_IDLE_TIMEOUT: "15",
        lc.ANNOTATION_HIBERNATE_AFTER: "-1h",
        lc.ANNOTATION_AUTO_RESUME: "yes",
    }
    await client.create(SANDBOX, sandbox("sb", uid="uid-1", annotations=bad), namespace=NS)
    await rec.reconcile(Request(NS, "sb"))
    assert events.reasons == [("sb", "InvalidLifecycleSettings")]
    for key, value in bad.items():
        assert f'{key}="{value}"' in events.notes[0], events.notes[0]


# --------------------------------------------------------------------------- restore and expiry of archives

PVC_NAME = "data-sb"


async def _hibernated(client: FakeClient, **spec: Any) -> Object:
    """An archive of Sandbox `sb` keeping its PVC (as archiving leaves them), and that PVC."""
    old = sandbox("sb", uid="old-uid", mode="Suspended", vcts=[{"metadata": {"name": "data"}}])
    old["spec"].update(spec)
    body = lc.archive_body(
        old,
        cause=lc.Cause.REQUESTED,
        now=datetime.now(UTC),
        children=[{"kind": "PersistentVolumeClaim", "name": PVC_NAME}],
    )
    archive = await client.create(lc.ARCHIVE, body, namespace=NS)
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": PVC_NAME, "namespace": NS, "ownerReferences": [archive_owner_ref(archive)]},
    }
    await client.create(PVC, pvc, namespace=NS)
    return archive


def _owner_uids(obj: Object) -> list[str]:
    return [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]


async def test_restore_leaves_the_volume_to_the_archive_until_the_sandbox_controller_takes_it() -> None:
    # Until December 6 the archive's reference was dropped right after the create: an expired Sandbox never
    # adopted the PVC, which was left with no owner (never deleted), and the patch raced the adoption (409).
    client, events = FakeClient(), Events()
    rec = reconciler(client, events)
    archive = await _hibernated(client)
    await client.patch(
        lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, datetime.now(UTC)), namespace=NS
    )
    await rec.reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    await rec.reconcile(Request(NS, "sb"))  # the Sandbox controller has not adopted it yet: nothing moves
    pvc = await client.get(PVC, PVC_NAME, namespace=NS)
    assert _owner_uids(pvc) == [archive["metadata"]["uid"]]
    assert await client.get(lc.ARCHIVE, "sb", namespace=NS) is not None
    # The Sandbox controller adopts it (its controller reference, the archive's kept).
    adopted = [*pvc["metadata"]["ownerReferences"], {"uid": restored["metadata"]["uid"], "controller": True}]
    await client.patch(PVC, PVC_NAME, {"metadata": {"ownerReferences": adopted}}, namespace=NS)
    await rec.reconcile(Request(NS, "sb"))
    pvc = await client.get(PVC, PVC_NAME, namespace=NS)
    assert _owner_uids(pvc) == [restored["metadata"]["uid"]]
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)


async def test_an_expired_archive_is_deleted_or_kept_by_its_shutdown_policy() -> None:
    past = format_time(datetime.now(UTC) - timedelta(minutes=1))
    for policy, kept in (("Delete", False), ("Retain", True)):
        client, events = FakeClient(), Events()
        rec = reconciler(client, events)
        await _hibernated(client, shutdownTime=past, shutdownPolicy=policy)
        await client.patch(
            lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, datetime.now(UTC)), namespace=NS
        )
        await rec.reconcile(Request(NS, "sb"))
        with pytest.raises(NotFound):  # never restored
            await client.get(SANDBOX, "sb", namespace=NS)
        try:
            await client.get(lc.ARCHIVE, "sb", namespace=NS)
            found = True
        except NotFound:
            found = False
        assert found is kept, policy


async def test_an_expired_archive_unmarks_its_claim_before_it_goes() -> None:
    """A failure between the two steps leaves the archive (the next pass repeats both), never a claim marked
    hibernated with no archive left to lead back to it (the order until December 6)."""
    from agent_sandbox.kube import SANDBOX_CLAIM, ServerError

    past = format_time(datetime.now(UTC) - timedelta(minutes=1))
    client, events = FakeClient(), Events()
    rec = LifecycleReconciler(
        client, probe=None, events=events, metrics=LifecycleMetrics(CollectorRegistry()), extensions=True
    )
    claim = await client.create(
        SANDBOX_CLAIM,
        {"metadata": {"name": "c", "namespace": NS, "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}},
         "spec": {"warmPoolRef": {"name": "p"}}},
        namespace=NS,
    )  # fmt: skip
    owner = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim", "name": "c",
             "uid": claim["metadata"]["uid"], "controller": True}  # fmt: skip
    old = sandbox("sb", uid="old-uid", mode="Suspended")
    old["spec"].update(shutdownTime=past, shutdownPolicy="Delete")
    old["metadata"]["ownerReferences"] = [owner]
    await client.create(lc.ARCHIVE, lc.archive_body(old, cause=lc.Cause.REQUESTED, now=datetime.now(UTC),
                                                    children=[]), namespace=NS)  # fmt: skip
    client.inject_error("patch", ServerError("etcd is slow"), kind=SANDBOX_CLAIM)
    with pytest.raises(ServerError):
        await rec.reconcile(Request(NS, "sb"))
    assert await client.get(lc.ARCHIVE, "sb", namespace=NS)  # still there: the next pass finishes
    await rec.reconcile(Request(NS, "sb"))
    assert lc.ANNOTATION_HIBERNATED_SANDBOX not in (await client.get(SANDBOX_CLAIM, "c", namespace=NS))[
        "metadata"
    ].get("annotations", {})
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
