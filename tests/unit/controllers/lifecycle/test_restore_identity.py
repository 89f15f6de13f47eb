"""Which Sandbox is a hibernated Sandbox's restore, and a restore whose volume is gone
(controllers/lifecycle: decide, reconciler; owners.restores).

- A Sandbox created under a hibernated name (a newcomer) is reported, never handed the archived volumes,
  also when a restore is asked for meanwhile (until December 7 the restore took it for the restored one and
  handed it the volumes); the restore waits until it is deleted.
- The restore is the Sandbox carrying `restored-from` with the archive's UID (written on the create), or the
  one the archive's `restored-uid` names (a restore created before that annotation: its volumes are handed
  over by the lifecycle controller, since the Sandbox controller refuses them to it).
- A restore whose archived PVC was deleted meanwhile goes ahead and says so (`RestoreVolumeMissing`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.controllers.lifecycle.decide import (
    ANNOTATION_RESTORED_FROM,
    ANNOTATION_RESTORED_UID,
    ExpireArchive,
    Nothing,
    RestoreSteps,
    Snapshot,
    archive_owner_ref,
    decide,
)
from agent_sandbox.controllers.lifecycle.metrics import LifecycleMetrics
from agent_sandbox.controllers.lifecycle.reconciler import LifecycleReconciler
from agent_sandbox.kube import PVC, SANDBOX, NotFound, Object, Request
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "ns"
DATA = {"kind": "PersistentVolumeClaim", "name": "data-sb"}


def sandbox(uid: str, annotations: dict[str, str] | None = None) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "sb",
            "namespace": NS,
            "uid": uid,
            "resourceVersion": "7",
            "creationTimestamp": format_time(T0),
            "annotations": annotations or {},
        },
        "spec": {"operatingMode": "Running", "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
    }


def archive(restore: bool = True, restored_uid: str | None = None) -> Object:
    body = lc.archive_body(sandbox("old-uid"), cause=lc.Cause.REQUESTED, now=T0, children=[DATA])
    body["metadata"]["uid"] = "archive-uid"
    if restore:
        body["spec"]["restore"] = {"cause": "Manual"}
    if restored_uid:
        body["metadata"]["annotations"] = {ANNOTATION_RESTORED_UID: restored_uid}
    return body


HELD: Object = {
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "data-sb", "resourceVersion": "3", "ownerReferences": [{"uid": "archive-uid"}]},
}


# --------------------------------------------------------------------------- decisions


@pytest.mark.parametrize("restore", [False, True])
def test_a_newcomer_is_reported_and_never_handed_the_volumes(restore: bool) -> None:
    plan = decide(Snapshot(now=T0, sandbox=sandbox("newcomer"), archive=archive(restore), children=(HELD,)))
    assert isinstance(plan, Nothing)
    assert "SandboxArchive 'sb' keeps the hibernated Sandbox (UID old-uid)" in plan.conflict
    assert "PersistentVolumeClaim data-sb, which this Sandbox does not get" in plan.conflict
    assert ("the restore asked for waits until this Sandbox is deleted" in plan.conflict) is restore


def test_the_restore_is_created_marked_and_a_missing_volume_is_named() -> None:
    plan = decide(Snapshot(now=T0, archive=archive()))
    assert isinstance(plan, RestoreSteps)
    assert plan.create is not None
    assert plan.create["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] == "archive-uid"
    assert plan.missing == ("data-sb",)
    plan = decide(Snapshot(now=T0, archive=archive(), children=(HELD,)))
    assert isinstance(plan, RestoreSteps)
    assert plan.missing == ()


def test_a_restore_from_before_the_annotation_is_handed_its_volumes() -> None:
    legacy = sandbox("restored-uid")  # no `restored-from`: the Sandbox controller refuses it the volume
    plan = decide(
        Snapshot(now=T0, sandbox=legacy, archive=archive(restored_uid="restored-uid"), children=(HELD,))
    )
    assert isinstance(plan, RestoreSteps)
    assert (plan.handover, plan.waiting) == ((HELD,), False)
    marked = sandbox("restored-uid", {ANNOTATION_RESTORED_FROM: "archive-uid"})
    plan = decide(
        Snapshot(now=T0, sandbox=marked, archive=archive(restored_uid="restored-uid"), children=(HELD,))
    )
    assert isinstance(plan, RestoreSteps)
    assert (plan.handover, plan.waiting) == ((), True)  # the Sandbox controller takes it back


def test_a_newcomer_after_the_restored_sandbox_was_deleted_does_not_keep_the_archive() -> None:
    plan = decide(
        Snapshot(
            now=T0,
            sandbox=sandbox("newcomer"),
            archive=archive(restored_uid="restored-uid"),
            children=(HELD,),
        )
    )
    assert plan == ExpireArchive("archive-uid", None, "RestoredSandboxDeleted", "restored-uid")


# --------------------------------------------------------------------------- the reconciler


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def event(self, regarding: Object, type_: Any, reason: str, action: str, note: str) -> None:
        self.seen.append((str(regarding["metadata"].get("uid")), type_, reason, note))


def reconciler(client: FakeClient, events: Events) -> LifecycleReconciler:
    metrics = LifecycleMetrics(CollectorRegistry())
    return LifecycleReconciler(client, probe=None, events=events, metrics=metrics, extensions=False)


async def _hibernated(client: FakeClient, *, with_volume: bool) -> Object:
    body = archive(restore=False)
    body["metadata"].pop("uid")
    created = await client.create(lc.ARCHIVE, body, namespace=NS)
    if with_volume:
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
        held = {"name": "data-sb", "ownerReferences": [archive_owner_ref(created)]}
        await client.create(PVC, {**pvc, "metadata": held}, namespace=NS)
    return created


@pytest.mark.parametrize("with_volume", [True, False])
async def test_a_restore_whose_volume_was_deleted_says_so(with_volume: bool) -> None:
    client, events = FakeClient(), Events()
    await _hibernated(client, with_volume=with_volume)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    await reconciler(client, events).reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    uid = restored["metadata"]["uid"]
    assert (
        restored["metadata"]["annotations"][ANNOTATION_RESTORED_FROM]
        == (await client.get(lc.ARCHIVE, "sb", namespace=NS))["metadata"]["uid"]
    )
    reasons = [(u, t, r) for u, t, r, _ in events.seen]
    if with_volume:
        assert reasons == [(uid, "Normal", "Restored")]
    else:
        assert reasons == [(uid, "Normal", "Restored"), (uid, "Warning", "RestoreVolumeMissing")]
        assert "PersistentVolumeClaim 'data-sb' was deleted while hibernated" in events.seen[1][3]
        assert "new, empty volume" in events.seen[1][3]


async def test_a_newcomer_is_reported_naming_the_archive_and_the_restore_waits() -> None:
    client, events = FakeClient(), Events()
    await _hibernated(client, with_volume=True)
    newcomer = await client.create(SANDBOX, sandbox("ignored"), namespace=NS)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    rec = reconciler(client, events)
    await rec.reconcile(Request(NS, "sb"))
    ((uid, type_, reason, note),) = events.seen
    assert (uid, type_, reason) == (newcomer["metadata"]["uid"], "Warning", "HibernationConflict")
    assert "SandboxArchive 'sb'" in note
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    assert [r["kind"] for r in pvc["metadata"]["ownerReferences"]] == ["SandboxArchive"]  # untouched
    # Deleted, the restore goes on.
    await client.delete(SANDBOX, "sb", namespace=NS)
    await rec.reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    assert restored["metadata"]["uid"] != newcomer["metadata"]["uid"]
    assert ANNOTATION_RESTORED_FROM in restored["metadata"]["annotations"]


async def test_an_archive_whose_restore_was_deleted_goes_despite_a_newcomer() -> None:
    """The uncached read before deleting the archive holds it back for the restored Sandbox only (until
    December 7 any Sandbox of the name did, and a newcomer kept the archive and its volume for good)."""
    client, events = FakeClient(), Events()
    await _hibernated(client, with_volume=True)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    mark = {"metadata": {"annotations": {ANNOTATION_RESTORED_UID: "deleted-restore-uid"}}}
    await client.patch(lc.ARCHIVE, "sb", mark, namespace=NS)
    await client.create(SANDBOX, sandbox("ignored"), namespace=NS)
    await reconciler(client, events).reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
