"""A hibernated Sandbox's archive and a Sandbox under its name: what still ends the archive, which Sandbox is
its restore after an upgrade, and a restore pass that must not lose its record (controllers/lifecycle).

- A newcomer (a Sandbox created under the hibernated name) does not keep the archive from its expiry (its
  own `shutdownTime`, its claim's): until December 7 it did, for good, and the newcomer was refused its
  volumes forever; the note tells it to delete the archive of an expired one, not to restore it.
- A restore an older controller created and did not record (no `restored-from`, no `restored-uid`) is known
  by what that controller wrote (`owners.legacy_restore`): recorded, marked `restored-from`, handed its
  volumes. Until December 7 it was taken for a newcomer and stuck.
- The restore's UID is recorded right after the create: a failed read after it (the missing-volume check)
  neither ends the pass nor lets a deleted restore come back (until December 7 it did both).
- A restored Sandbox deleted between the release's liveness read and the release: the archive takes the
  volume back (the collector's unguarded removal of the Sandbox's reference would leave it with no owner).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.controllers.lifecycle.decide import (
    ANNOTATION_EXPIRED_AT,
    ANNOTATION_RESTORED_FROM,
    ANNOTATION_RESTORED_UID,
    ExpireArchive,
    MarkArchiveExpired,
    Nothing,
    RestoreSteps,
    Snapshot,
    archive_owner_ref,
    decide,
)
from agent_sandbox.controllers.lifecycle.execute_restore import hold_again
from agent_sandbox.controllers.lifecycle.metrics import LifecycleMetrics
from agent_sandbox.controllers.lifecycle.owners import legacy_restore
from agent_sandbox.controllers.lifecycle.reconciler import LifecycleReconciler
from agent_sandbox.kube import PVC, SANDBOX, Conflict, NotFound, Object, Request, ResourceKind, ServerError
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "ns"
DATA = {"kind": "PersistentVolumeClaim", "name": "data-sb"}
CLAIM_REF = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
    "kind": "SandboxClaim",
    "name": "c",
    "uid": "claim-uid",
    "controller": True,
}


def sandbox(uid: str, annotations: dict[str, str] | None = None, created: datetime = T0) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "sb",
            "namespace": NS,
            "uid": uid,
            "resourceVersion": "7",
            "creationTimestamp": format_time(created),
            "annotations": annotations or {},
        },
        "spec": {"operatingMode": "Running", "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
    }


def archive(
    *,
    restore_at: datetime | None = None,
    shutdown: datetime | None = None,
    policy: str = "Retain",
    annotations: dict[str, str] | None = None,
    claimed: bool = False,
) -> Object:
    old = sandbox("old-uid")
    if claimed:
        old["metadata"]["ownerReferences"] = [CLAIM_REF]
    if shutdown is not None:
        old["spec"] |= {"shutdownTime": format_time(shutdown), "shutdownPolicy": policy}
    body = lc.archive_body(old, cause=lc.Cause.REQUESTED, now=T0, children=[DATA])
    body["metadata"]["uid"] = "archive-uid"
    if restore_at is not None:
        body["spec"]["restore"] = lc.restore_request_patch(lc.Cause.MANUAL, restore_at)["spec"]["restore"]
    if annotations:
        body["metadata"]["annotations"] = annotations
    return body


HELD: Object = {
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "data-sb", "resourceVersion": "3", "ownerReferences": [{"uid": "archive-uid"}]},
}


def expired_claim() -> Object:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": "c", "namespace": NS, "uid": "claim-uid"},
        "spec": {"lifecycle": {"shutdownTime": format_time(T0 - timedelta(seconds=1))}},
    }


# --------------------------------------------------------------------------- a newcomer and the archive's expiry


@pytest.mark.parametrize("restore", [False, True])
def test_a_newcomer_does_not_keep_an_expired_archive_with_delete(restore: bool) -> None:
    arch = archive(shutdown=T0 - timedelta(hours=1), policy="Delete", restore_at=T0 if restore else None)
    plan = decide(Snapshot(now=T0, sandbox=sandbox("newcomer"), archive=arch, children=(HELD,)))
    assert plan == ExpireArchive("archive-uid", None)


def test_a_newcomer_does_not_keep_an_archive_under_an_expired_claim() -> None:
    arch = archive(claimed=True)
    plan = decide(
        Snapshot(now=T0, sandbox=sandbox("newcomer"), archive=arch, claim=expired_claim(), children=(HELD,))
    )
    assert plan == ExpireArchive("archive-uid", None, "ClaimExpired")


def test_an_expired_archive_kept_under_a_newcomer_is_marked_and_never_offered_for_restore() -> None:
    expired = archive(shutdown=T0 - timedelta(hours=1), restore_at=T0)
    plan = decide(Snapshot(now=T0, sandbox=sandbox("newcomer"), archive=expired, children=(HELD,)))
    assert plan == MarkArchiveExpired("archive-uid")
    marked = archive(
        shutdown=T0 - timedelta(hours=1),
        restore_at=T0,
        annotations={ANNOTATION_EXPIRED_AT: format_time(T0)},
    )
    plan = decide(Snapshot(now=T0, sandbox=sandbox("newcomer"), archive=marked, children=(HELD,)))
    assert isinstance(plan, Nothing)
    assert "has expired (shutdownPolicy Retain): it is never restored" in plan.conflict
    assert "delete the archive (kubectl delete sandboxarchive sb; its volumes go with it)" in plan.conflict
    assert "to restore the hibernated one" not in plan.conflict
    assert "waits until this Sandbox is deleted" not in plan.conflict


def test_a_newcomer_is_looked_at_again_at_the_archives_deadline() -> None:
    arch = archive(shutdown=T0 + timedelta(minutes=5), policy="Delete")
    plan = decide(Snapshot(now=T0, sandbox=sandbox("newcomer"), archive=arch, children=(HELD,)))
    assert isinstance(plan, Nothing)
    assert plan.requeue_after == 300.0
    assert "delete this Sandbox to restore the hibernated one" in plan.conflict


async def test_a_newcomer_no_longer_blocks_an_expired_archives_deletion() -> None:
    client, events = FakeClient(), Events()
    await hibernated(client, shutdown=T0 - timedelta(hours=1), policy="Delete")
    await client.create(SANDBOX, sandbox("ignored"), namespace=NS)
    await reconciler(client, events).reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
    with pytest.raises(NotFound):  # the archive was its only owner: collected with it
        await client.get(PVC, "data-sb", namespace=NS)


# --------------------------------------------------------------------------- an older controller's restore


def legacy(restore_at: datetime = T0, created_after: float = 1.0) -> Object:
    """What a controller from before `restored-from` created for the restore asked at `restore_at`."""
    made = lc.archived_sandbox(archive(restore_at=restore_at), cause=lc.Cause.MANUAL, now=restore_at)
    made["metadata"] |= {
        "uid": "legacy-uid",
        "resourceVersion": "9",
        # The API server's clock, whole seconds.
        "creationTimestamp": format_time(restore_at + timedelta(seconds=created_after)),
    }
    return made


def test_an_older_controllers_unrecorded_restore_is_recorded_marked_and_handed_its_volume() -> None:
    restored = legacy()
    assert ANNOTATION_RESTORED_FROM not in restored["metadata"]["annotations"]
    plan = decide(Snapshot(now=T0, sandbox=restored, archive=archive(restore_at=T0), children=(HELD,)))
    assert isinstance(plan, RestoreSteps)
    assert (plan.record_uid, plan.mark, plan.handover) == ("legacy-uid", "9", (HELD,))


def test_a_restore_recorded_by_an_older_controller_is_marked_too() -> None:
    recorded = archive(restore_at=T0, annotations={ANNOTATION_RESTORED_UID: "legacy-uid"})
    plan = decide(Snapshot(now=T0, sandbox=legacy(), archive=recorded, children=(HELD,)))
    assert isinstance(plan, RestoreSteps)
    assert (plan.record_uid, plan.mark) == (None, "9")
    marked = legacy()
    marked["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] = "archive-uid"
    plan = decide(Snapshot(now=T0, sandbox=marked, archive=recorded, children=(HELD,)))
    assert isinstance(plan, RestoreSteps)
    assert plan.mark is None


def test_what_is_not_an_older_controllers_restore() -> None:
    arch = archive(restore_at=T0)
    assert legacy_restore(legacy(), arch)
    # A newcomer copied from the hibernated Sandbox: its resume stamp is older than the archive.
    copied = legacy(restore_at=T0 - timedelta(days=1), created_after=86400)
    assert not legacy_restore(copied, arch)
    # Stamped long before it was created (a manifest applied again), or another cause.
    assert not legacy_restore(legacy(created_after=3600), arch)
    other = legacy()
    other["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] = "Request"
    assert not legacy_restore(other, arch)
    # No restore asked, or one recorded already (`restores` tells those), or a mark of another archive.
    assert not legacy_restore(legacy(), archive())
    assert not legacy_restore(legacy(), archive(restore_at=T0, annotations={ANNOTATION_RESTORED_UID: "x"}))
    foreign = legacy()
    foreign["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] = "earlier-archive-uid"
    assert not legacy_restore(foreign, arch)
    # Clocks a little apart (the requester's ahead of the controller's) are no newcomer.
    assert legacy_restore(legacy(restore_at=T0), archive(restore_at=T0 + timedelta(seconds=20)))
    plan = decide(Snapshot(now=T0, sandbox=copied, archive=arch, children=(HELD,)))
    assert isinstance(plan, Nothing)
    assert plan.conflict


async def test_an_older_controllers_restore_is_finished_after_an_upgrade() -> None:
    client, events = FakeClient(), Events()
    created = await hibernated(client)
    asked = datetime.now(UTC) - timedelta(seconds=5)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, asked), namespace=NS)
    # The older controller's create (its own clock), then it was stopped: nothing recorded.
    made = lc.archived_sandbox(created, cause=lc.Cause.MANUAL, now=asked + timedelta(seconds=1))
    restored = await client.create(SANDBOX, made, namespace=NS)
    await reconciler(client, events).reconcile(Request(NS, "sb"))
    arch = await client.get(lc.ARCHIVE, "sb", namespace=NS)
    assert arch["metadata"]["annotations"][ANNOTATION_RESTORED_UID] == restored["metadata"]["uid"]
    marked = await client.get(SANDBOX, "sb", namespace=NS)
    assert marked["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] == arch["metadata"]["uid"]
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    assert [r["uid"] for r in pvc["metadata"]["ownerReferences"]] == [restored["metadata"]["uid"]]
    assert [reason for _, _, reason, _ in events.seen] == []  # no HibernationConflict


# --------------------------------------------------------------------------- the restore's record


class Flaky:
    """Uncached reads: the first PVC read fails (an etcd leader change)."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.fail = True

    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> Object:
        if kind is PVC and self.fail:
            self.fail = False
            raise ServerError(503, "ServiceUnavailable", "etcd leader change")
        return await self.client.get(kind, name, namespace=namespace)


async def test_a_failed_missing_volume_read_neither_fails_the_restore_nor_loses_its_record() -> None:
    client, events = FakeClient(), Events()
    await hibernated(client, with_volume=False)  # its PVC was deleted while hibernated
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    rec = reconciler(client, events, authoritative=Flaky(client))
    await rec.reconcile(Request(NS, "sb"))  # no error: the warning is skipped, the restore recorded
    first = await client.get(SANDBOX, "sb", namespace=NS)
    arch = await client.get(lc.ARCHIVE, "sb", namespace=NS)
    assert arch["metadata"]["annotations"][ANNOTATION_RESTORED_UID] == first["metadata"]["uid"]
    assert [reason for _, _, reason, _ in events.seen] == ["Restored"]
    # Deleted before the next pass, it stays deleted.
    await client.delete(SANDBOX, "sb", namespace=NS)
    await rec.reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(SANDBOX, "sb", namespace=NS)
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)


class QuickSandboxController(FakeClient):
    """The Sandbox controller sees the restored Sandbox at once and creates the PVC it misses (new, empty)
    before the lifecycle controller's uncached read of it."""

    async def create(self, kind: ResourceKind, obj: Object, **kwargs: Any) -> Object:
        made = await super().create(kind, obj, **kwargs)
        if kind is SANDBOX:
            ref = {
                "apiVersion": "agents.x-k8s.io/v1beta1",
                "kind": "Sandbox",
                "name": "sb",
                "uid": made["metadata"]["uid"],
                "controller": True,
            }
            pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
            meta = {"name": "data-sb", "ownerReferences": [ref]}
            await super().create(PVC, {**pvc, "metadata": meta}, namespace=NS)
        return made


async def test_the_new_empty_volume_made_for_the_restore_is_no_archived_volume() -> None:
    """Until December 7 the read found the Sandbox controller's new PVC when that controller was quick, and
    the restore without its data said nothing (it lost the race more often once the record came first)."""
    client, events = QuickSandboxController(), Events()
    await hibernated(client, with_volume=False)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    await reconciler(client, events).reconcile(Request(NS, "sb"))
    assert [reason for _, _, reason, _ in events.seen] == ["Restored", "RestoreVolumeMissing"]


async def test_a_volume_brought_back_before_the_restore_is_not_reported_missing() -> None:
    """A PVC created again under the name before the restore (a backup) that the cache does not show yet."""
    client, events = FakeClient(), Events()
    await hibernated(client, with_volume=False)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    rec = reconciler(client, events)
    snap = await rec._observe(Request(NS, "sb"))  # the cache's view: no PVC
    backup = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
    meta = {"name": "data-sb", "creationTimestamp": "2020-01-01T00:00:00Z"}
    await client.create(PVC, {**backup, "metadata": meta}, namespace=NS)
    plan = decide(snap)
    assert isinstance(plan, RestoreSteps)
    assert plan.missing == ("data-sb",)
    await rec._execute(Request(NS, "sb"), snap, plan)
    assert [reason for _, _, reason, _ in events.seen] == ["Restored"]


# --------------------------------------------------------------------------- a deletion during the release


class DeletedBeforeTheRelease(FakeClient):
    """Once armed: the restored Sandbox is deleted right before the release patch (after the liveness read),
    and the garbage collector's removal of its reference - decided before the release, unguarded (a
    strategic merge patch by UID) - lands right after it."""

    armed = False

    async def patch(self, kind: ResourceKind, name: str, patch: Any, **kwargs: Any) -> Object:
        if not (self.armed and kind is PVC):
            return await super().patch(kind, name, patch, **kwargs)
        self.armed = False
        ns = kwargs.get("namespace")
        gone = await self.delete(SANDBOX, "sb", namespace=ns, propagation_policy="Orphan")
        done = await super().patch(kind, name, patch, **kwargs)
        uid = gone["metadata"]["uid"]
        refs = [r for r in done["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
        await super().patch(PVC, name, {"metadata": {"ownerReferences": refs or None}}, namespace=ns)
        return done


async def test_a_restored_sandbox_deleted_during_the_release_leaves_its_volume_to_the_archive() -> None:
    client, events = DeletedBeforeTheRelease(), Events()
    created = await hibernated(client)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    rec = reconciler(client, events)
    await rec.reconcile(Request(NS, "sb"))  # creates the restore
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    # The Sandbox controller takes the volume back (its controller reference; the archive's stays).
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    sb_ref = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "name": "sb",
        "uid": restored["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    refs = [*pvc["metadata"]["ownerReferences"], sb_ref]
    await client.patch(PVC, "data-sb", {"metadata": {"ownerReferences": refs}}, namespace=NS)
    client.armed = True
    await rec.reconcile(Request(NS, "sb"))  # the release, the Sandbox deleted meanwhile
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    assert [r["uid"] for r in pvc["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
    # The next pass ends the archive as a restore whose Sandbox was deleted: the volume goes with it.
    await rec.reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
    with pytest.raises(NotFound):
        await client.get(PVC, "data-sb", namespace=NS)


# --------------------------------------------------------------------------- what clients write is no restore


def resumed(newcomer: Object, patch: dict[str, Any]) -> Object:
    """`newcomer` after a client's merge patch of its annotations (and mode)."""
    notes = newcomer["metadata"]["annotations"]
    for key, value in patch["metadata"]["annotations"].items():
        if value is None:
            notes.pop(key, None)
        else:
            notes[key] = value
    newcomer["spec"] |= patch.get("spec") or {}
    return newcomer


def sdk_resume(at: datetime) -> dict[str, Any]:
    """The Python SDK's `resume()` of a Sandbox in any mode (`operating_mode_patch`): no `last-activity`."""
    stamp = lc.format_rfc3339nano(at)
    notes = {lc.ANNOTATION_RESUME_REASON: "Manual", lc.ANNOTATION_RESUMED_AT: stamp}
    return {"metadata": {"annotations": notes}, "spec": {"operatingMode": "Running"}}


def test_a_newcomer_the_sdk_resumed_at_once_is_no_older_controllers_restore() -> None:
    """A reviewer's probe: the controller down, a restore asked; the newcomer (applied again from the same
    manifest) resumed by the SDK a second after its creation was taken for the restore and handed the
    archived volume (until December 7)."""
    arch = archive(restore_at=T0)
    newcomer = resumed(
        sandbox("newcomer-uid", created=T0 + timedelta(seconds=2)), sdk_resume(T0 + timedelta(seconds=3))
    )
    assert not legacy_restore(newcomer, arch)
    plan = decide(Snapshot(now=T0 + timedelta(seconds=4), sandbox=newcomer, archive=arch, children=(HELD,)))
    assert isinstance(plan, Nothing)
    assert plan.conflict


def test_a_newcomer_a_router_resumed_after_its_creation_is_no_older_controllers_restore() -> None:
    """A reviewer's probe: created Suspended 2 s after the router's restore request, woken by the router 8 s
    later (`resume_patch` writes `last-activity` too)."""
    arch = archive()
    arch["spec"]["restore"] = lc.restore_request_patch(lc.Cause.REQUEST, T0)["spec"]["restore"]
    newcomer = sandbox("newcomer-uid", created=T0 + timedelta(seconds=2))
    newcomer["spec"]["operatingMode"] = "Suspended"
    newcomer = resumed(newcomer, lc.resume_patch(lc.Cause.REQUEST, T0 + timedelta(seconds=10)))
    assert not legacy_restore(newcomer, arch)
    plan = decide(Snapshot(now=T0 + timedelta(seconds=11), sandbox=newcomer, archive=arch, children=(HELD,)))
    assert isinstance(plan, Nothing)
    assert plan.conflict


def test_an_older_controllers_restore_is_told_by_its_spec_labels_and_stamps() -> None:
    arch = archive(restore_at=T0)
    assert legacy_restore(legacy(created_after=-1.0), arch)  # the API server's clock a little behind
    stale = legacy()
    stale["metadata"]["annotations"][lc.ANNOTATION_LAST_ACTIVITY] = format_time(T0 + timedelta(minutes=1))
    assert not legacy_restore(stale, arch)
    other_spec = legacy()
    other_spec["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "scratch"}}]
    assert not legacy_restore(other_spec, arch)
    labelled = legacy()
    labelled["metadata"]["labels"] = {"app": "other"}
    assert not legacy_restore(labelled, arch)
    suspended = legacy()
    suspended["spec"]["operatingMode"] = "Suspended"  # the mode is not compared
    assert legacy_restore(suspended, arch)
    # Stamped well after its creation: a client's resume, not the older controller's create.
    assert not legacy_restore(legacy(created_after=-5.0), arch)


def test_an_expired_archive_is_ended_not_handed_to_an_older_controllers_restore() -> None:
    arch = archive(restore_at=T0, shutdown=T0 - timedelta(hours=1), policy="Delete")
    plan = decide(Snapshot(now=T0, sandbox=legacy(), archive=arch, children=(HELD,)))
    assert plan == ExpireArchive("archive-uid", None)
    kept = archive(restore_at=T0, shutdown=T0 - timedelta(hours=1))
    plan = decide(Snapshot(now=T0, sandbox=legacy(), archive=kept, children=(HELD,)))
    assert plan == MarkArchiveExpired("archive-uid")


async def test_a_newcomer_the_sdk_resumed_while_the_controller_was_down_gets_no_archived_volume() -> None:
    """The reviewer's probe against the reconciler: the newcomer was marked `restored-from`, handed the
    volume, and the archive deleted, with no HibernationConflict (until December 7)."""
    client, events = FakeClient(), Events()
    created = await hibernated(client)
    now = datetime.now(UTC)
    asked = lc.restore_request_patch(lc.Cause.MANUAL, now - timedelta(seconds=20))
    await client.patch(lc.ARCHIVE, "sb", asked, namespace=NS)
    body = sandbox("x")
    for key in ("uid", "creationTimestamp", "resourceVersion"):
        body["metadata"].pop(key)
    newcomer = await client.create(SANDBOX, body, namespace=NS)
    await client.patch(SANDBOX, "sb", sdk_resume(now), namespace=NS)
    rec = reconciler(client, events)
    for _ in range(2):
        await rec.reconcile(Request(NS, "sb"))
    sb = await client.get(SANDBOX, "sb", namespace=NS)
    assert sb["metadata"]["uid"] == newcomer["metadata"]["uid"]
    assert ANNOTATION_RESTORED_FROM not in sb["metadata"]["annotations"]
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    assert [r["uid"] for r in pvc["metadata"]["ownerReferences"]] == [created["metadata"]["uid"]]
    arch = await client.get(lc.ARCHIVE, "sb", namespace=NS)
    assert ANNOTATION_RESTORED_UID not in (arch["metadata"].get("annotations") or {})
    assert "HibernationConflict" in [reason for _, _, reason, _ in events.seen]


# --------------------------------------------------------------------------- a failed hold-again


class FailingReads:
    """Uncached reads; once armed, the next PVC read fails (an etcd leader change during `hold_again`)."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.armed = False

    async def get(self, kind: ResourceKind, name: str, namespace: str | None = None) -> Object:
        if self.armed and kind is PVC:
            self.armed = False
            raise ServerError(503, "ServiceUnavailable", "etcd leader change")
        return await self.client.get(kind, name, namespace=namespace)


async def released_to_a_deleted_restore(client: DeletedBeforeTheRelease, reads: Any) -> LifecycleReconciler:
    """A restore created and its volume taken back by the Sandbox controller; the release pass armed to see
    the restored Sandbox deleted right before its patch."""
    await hibernated(client)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    rec = reconciler(client, Events(), authoritative=reads)
    await rec.reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    sb_ref = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "name": "sb",
        "uid": restored["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    refs = [*pvc["metadata"]["ownerReferences"], sb_ref]
    await client.patch(PVC, "data-sb", {"metadata": {"ownerReferences": refs}}, namespace=NS)
    client.armed = True
    return rec


async def test_a_failed_hold_again_does_not_leave_the_volume_ownerless_past_the_archive() -> None:
    """A reviewer's probe: the pass that saw the restored Sandbox deleted failed in `hold_again`; the next
    pass deleted the archive and the volume was kept with no owner, for good (until December 7)."""
    client = DeletedBeforeTheRelease()
    reads = FailingReads(client)
    rec = await released_to_a_deleted_restore(client, reads)
    reads.armed = True
    with pytest.raises(ServerError):
        await rec.reconcile(Request(NS, "sb"))
    assert not (await client.get(PVC, "data-sb", namespace=NS))["metadata"].get("ownerReferences")
    await rec.reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
    with pytest.raises(NotFound):  # held again before the archive's deletion: collected with it
        await client.get(PVC, "data-sb", namespace=NS)


class AlwaysConflicting(FakeClient):
    """Every guarded PVC write conflicts (a writer always in between)."""

    async def patch(self, kind: ResourceKind, name: str, patch: Any, **kwargs: Any) -> Object:
        if kind is PVC and (patch.get("metadata") or {}).get("resourceVersion"):
            raise Conflict(409, "Conflict", "the object has been modified")
        return await super().patch(kind, name, patch, **kwargs)


async def test_hold_again_giving_up_after_conflicts_fails_the_pass() -> None:
    """Until December 7 the fifth conflict fell through: the pass went on as if the volume were held."""
    client = AlwaysConflicting()
    await client.create(
        PVC,
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data-sb"}},
        namespace=NS,
    )
    rec = reconciler(client, Events())
    with pytest.raises(Conflict):
        await hold_again(rec._executor, (HELD,), "sb", "archive-uid", NS)


# --------------------------------------------------------------------------- helpers


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str]] = []

    def event(self, regarding: Object, type_: Any, reason: str, action: str, note: str) -> None:
        self.seen.append((str(regarding["metadata"].get("uid")), type_, reason, note))


def reconciler(client: FakeClient, events: Events, authoritative: Any = None) -> LifecycleReconciler:
    metrics = LifecycleMetrics(CollectorRegistry())
    return LifecycleReconciler(
        client, probe=None, events=events, metrics=metrics, extensions=False, authoritative=authoritative
    )


async def hibernated(
    client: FakeClient,
    *,
    with_volume: bool = True,
    shutdown: datetime | None = None,
    policy: str = "Retain",
) -> Object:
    body = archive(shutdown=shutdown, policy=policy)
    body["metadata"].pop("uid")
    created = await client.create(lc.ARCHIVE, body, namespace=NS)
    if with_volume:
        pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
        # Created before its archive, as an archived volume is (`_hold_ownerless` goes by it).
        held = {
            "name": "data-sb",
            "ownerReferences": [archive_owner_ref(created)],
            "creationTimestamp": "2020-01-01T00:00:00Z",
        }
        await client.create(PVC, {**pvc, "metadata": held}, namespace=NS)
    return created
