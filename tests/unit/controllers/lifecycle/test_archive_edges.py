"""Edges of archiving and restoring (controllers/lifecycle, docs/design/lifecycle-archive.md "Mechanics"):
owners gone before a restore, a stale Sandbox cache when an archive is given up, edits that are not resumes
during the archiving, a restore asked under an expired claim, and the hibernation's count.

Each race is made at the exact point it needs: the in-memory FakeClient's writes are the only seam, and a
second FakeClient stands for the API server where the cache must lag behind it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.controllers.lifecycle.decide import (
    ANNOTATION_ARCHIVED_VERSION,
    AbandonArchive,
    ArchiveSteps,
    RestoreSteps,
    Snapshot,
    archive_owner_ref,
    decide,
)
from agent_sandbox.controllers.lifecycle.metrics import LifecycleMetrics
from agent_sandbox.controllers.lifecycle.reconciler import LifecycleReconciler
from agent_sandbox.kube import PVC, SANDBOX, SANDBOX_CLAIM, NotFound, Object, Request, ResourceKind
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "ns"
CLAIM_API = "extensions.agents.x-k8s.io/v1beta1"


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def event(self, regarding: Object, type_: Any, reason: str, action: str, note: str) -> None:
        self.seen.append((reason, note))


def reconciler(
    client: FakeClient, *, live: FakeClient | None = None, events: Events | None = None
) -> tuple[LifecycleReconciler, CollectorRegistry]:
    registry = CollectorRegistry()
    rec = LifecycleReconciler(
        client,
        probe=None,
        events=events or Events(),
        metrics=LifecycleMetrics(registry),
        extensions=True,
        now=lambda: T0,
        authoritative=live,
    )
    return rec, registry


def claim_ref(uid: str) -> dict[str, Any]:
    return {"apiVersion": CLAIM_API, "kind": "SandboxClaim", "name": "c", "uid": uid, "controller": True}


def suspended(
    annotations: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None
) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "sb",
            "namespace": NS,
            "annotations": {lc.ANNOTATION_HIBERNATE: "true"} if annotations is None else annotations,
            "ownerReferences": owners or [],
        },
        "spec": {"operatingMode": "Suspended", "volumeClaimTemplates": [{"metadata": {"name": "data"}}]},
        "status": {
            "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": format_time(T0)}]
        },
    }


def pvc(*owners: dict[str, Any]) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-sb", "ownerReferences": list(owners)},
    }


def sandbox_ref(sb: Object) -> dict[str, Any]:
    uid = sb["metadata"]["uid"]
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "name": "sb",
        "uid": uid,
        "controller": True,
    }


async def hibernated(client: FakeClient, owners: list[dict[str, Any]]) -> Object:
    """An archive (its Sandbox gone) keeping PVC `data-sb`, its archived Sandbox owned by `owners`, with a
    restore asked for."""
    old = {**suspended(owners=owners), "metadata": {**suspended(owners=owners)["metadata"], "uid": "old"}}
    body = lc.archive_body(
        old, cause=lc.Cause.REQUESTED, now=T0, children=[{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    )
    body["metadata"].pop("ownerReferences", None)  # as the garbage collector leaves it: orphaned
    archive = await client.create(lc.ARCHIVE, body, namespace=NS)
    await client.create(PVC, pvc(archive_owner_ref(archive)), namespace=NS)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    return archive


# --------------------------------------------------------------------------- 1. owners gone before a restore


@pytest.mark.parametrize("claim_uid", [None, "new-claim-uid"])
async def test_a_restore_drops_an_owner_that_is_gone(claim_uid: str | None) -> None:
    """The claim was deleted with `--cascade=orphan` (None), or deleted and created again under its name.
    Until December 6 the restored Sandbox named the old claim as its only owner, the garbage collector
    deleted it at once, and the restore ended as a restored Sandbox deleted: archive and volumes deleted."""
    client = FakeClient()
    if claim_uid is not None:
        claim = {"apiVersion": CLAIM_API, "kind": "SandboxClaim", "metadata": {"name": "c", "uid": claim_uid}}
        await client.create(SANDBOX_CLAIM, claim, namespace=NS)
    await hibernated(client, [claim_ref("old-claim-uid")])
    events = Events()
    rec, _ = reconciler(client, events=events)
    await rec.reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    assert restored["metadata"].get("ownerReferences") in (None, [])
    assert any("without its deleted owner SandboxClaim/c" in note for reason, note in events.seen)


async def test_a_restore_keeps_an_owner_that_is_there() -> None:
    client = FakeClient()
    claim = {"apiVersion": CLAIM_API, "kind": "SandboxClaim", "metadata": {"name": "c", "uid": "claim-uid"}}
    await client.create(SANDBOX_CLAIM, claim, namespace=NS)
    other = {"apiVersion": "example.com/v1", "kind": "Notebook", "name": "n", "uid": "n-uid"}
    await hibernated(client, [claim_ref("claim-uid"), other])
    rec, _ = reconciler(client)
    await rec.reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    # A kind we cannot read is kept as archived.
    assert [o["uid"] for o in restored["metadata"]["ownerReferences"]] == ["claim-uid", "n-uid"]


def test_a_claim_created_again_under_the_name_is_not_the_archives() -> None:
    """Its expiry (and its mark) are not this archive's: the restore goes on."""
    old = {**suspended(owners=[claim_ref("old-claim-uid")])}
    old["metadata"] = {**old["metadata"], "uid": "old"}
    archive = lc.archive_body(old, cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    archive["spec"]["restore"] = {"cause": "Manual"}
    expired_new = {
        "metadata": {
            "name": "c",
            "uid": "new-claim-uid",
            "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"},
        },
        "spec": {"lifecycle": {"shutdownTime": format_time(T0 - timedelta(seconds=1))}},
    }
    plan = decide(Snapshot(now=T0, archive=archive, claim=expired_new))
    assert isinstance(plan, RestoreSteps)
    assert plan.claim_name is None


# --------------------------------------------------------------------------- 2. stale Sandbox cache, abandon


async def test_an_archive_is_not_given_up_on_a_stale_sandbox() -> None:
    """The Sandbox's (Orphan) deletion went through and the garbage collector took its reference off the
    PVC; the cache still shows the Sandbox, and its hibernation is no longer due (the `hibernate` request
    gone). Until December 6 the archive was given up: the PVC released to no owner, the archive deleted."""
    cache, live = FakeClient(), FakeClient()
    sb = await cache.create(SANDBOX, suspended(annotations={}), namespace=NS)
    archive_body = lc.archive_body(
        sb, cause=lc.Cause.REQUESTED, now=T0, children=[{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    )
    archive = await cache.create(lc.ARCHIVE, archive_body, namespace=NS)
    await cache.create(PVC, pvc(archive_owner_ref(archive)), namespace=NS)
    rec, _ = reconciler(cache, live=live)  # the API server: the Sandbox is gone
    await rec.reconcile(Request(NS, "sb"))
    held = await cache.get(PVC, "data-sb", namespace=NS)
    owners = held["metadata"].get("ownerReferences") or []
    assert [r["uid"] for r in owners] == [archive["metadata"]["uid"]]
    assert (await cache.get(lc.ARCHIVE, "sb", namespace=NS))["metadata"]["uid"] == archive["metadata"]["uid"]


async def test_a_volume_the_archive_alone_holds_is_handed_to_the_resumed_sandbox() -> None:
    """Never released to no owner: until December 6 its ownerReferences became null."""
    client = FakeClient()
    sb = await client.create(SANDBOX, suspended(annotations={}), namespace=NS)  # resumed: hibernate withdrawn
    archive = await client.create(
        lc.ARCHIVE,
        lc.archive_body(
            sb,
            cause=lc.Cause.REQUESTED,
            now=T0,
            children=[{"kind": "PersistentVolumeClaim", "name": "data-sb"}],
        ),
        namespace=NS,
    )
    await client.create(PVC, pvc(archive_owner_ref(archive)), namespace=NS)
    rec, _ = reconciler(client)
    await rec.reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
    owners = (await client.get(PVC, "data-sb", namespace=NS))["metadata"]["ownerReferences"]
    assert [(r["uid"], r.get("controller")) for r in owners] == [(sb["metadata"]["uid"], True)]


# --------------------------------------------------------------------------- 3 and 6. edits during archiving


class WriteOnArchiveCreate(FakeClient):
    """Applies `edit` to the Sandbox right after the archive is created (before the Sandbox's delete)."""

    def __init__(self, edit: dict[str, Any]) -> None:
        super().__init__()
        self.edit = edit

    async def create(
        self, kind: ResourceKind, obj: Object, *, namespace: str | None = None, **kw: Any
    ) -> Object:
        created = await super().create(kind, obj, namespace=namespace, **kw)
        if kind == lc.ARCHIVE:
            await self.patch(SANDBOX, "sb", self.edit, namespace=namespace)
        return created


async def _archive_twice(client: FakeClient) -> tuple[Object, CollectorRegistry, Events]:
    await client.create(SANDBOX, suspended(), namespace=NS)
    await client.create(PVC, pvc(sandbox_ref(await client.get(SANDBOX, "sb", namespace=NS))), namespace=NS)
    events = Events()
    rec, registry = reconciler(client, events=events)
    await rec.reconcile(Request(NS, "sb"))  # archive created, the edit lands, the guarded delete gets 409
    assert await client.get(SANDBOX, "sb", namespace=NS)
    await rec.reconcile(Request(NS, "sb"))  # the archiving finished
    with pytest.raises(NotFound):
        await client.get(SANDBOX, "sb", namespace=NS)
    return await client.get(lc.ARCHIVE, "sb", namespace=NS), registry, events


async def test_an_edit_during_the_archiving_is_kept_in_the_archive() -> None:
    """A later `shutdownTime` written on the Suspended Sandbox while it was being archived: until December 6
    the archive kept the copy from before it, and the volumes were deleted at the old deadline."""
    later = format_time(T0 + timedelta(days=30))
    client = WriteOnArchiveCreate({"spec": {"shutdownTime": later}})
    archive, _, _ = await _archive_twice(client)
    assert archive["spec"]["sandbox"]["spec"]["shutdownTime"] == later


async def test_a_hibernation_held_up_by_a_write_is_counted_once() -> None:
    """Until December 6 only the pass that created the archive counted it, and not when its delete got 409."""
    client = WriteOnArchiveCreate({"metadata": {"labels": {"touched": "yes"}}})
    archive, registry, events = await _archive_twice(client)
    total = registry.get_sample_value("agent_sandbox_lifecycle_hibernations_total", {"cause": "Requested"})
    assert total == 1.0
    assert [reason for reason, _ in events.seen].count("Hibernated") == 1
    assert archive["spec"]["sandbox"]["metadata"]["labels"] == {"touched": "yes"}


def test_a_copy_older_than_the_sandbox_is_refreshed_before_the_delete() -> None:
    """Also after a restart: the Sandbox resumed and suspended again (hibernation due again) while the
    controller was down."""
    sb = {**suspended(), "metadata": {**suspended()["metadata"], "uid": "sb-uid", "resourceVersion": "9"}}
    archive = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    archive["metadata"]["annotations"] = {ANNOTATION_ARCHIVED_VERSION: "9"}
    plan = decide(Snapshot(now=T0, sandbox=sb, archive=archive))
    assert isinstance(plan, ArchiveSteps)
    assert plan.refresh is None
    status_only = {**sb, "metadata": {**sb["metadata"], "resourceVersion": "10"}}  # the copy still holds
    plan = decide(Snapshot(now=T0, sandbox=status_only, archive=archive))
    assert isinstance(plan, ArchiveSteps)
    assert (plan.resource_version, plan.refresh) == ("10", None)
    edited = {**sb, "metadata": {**sb["metadata"], "resourceVersion": "12"}, "spec": {**sb["spec"], "x": 1}}
    plan = decide(Snapshot(now=T0, sandbox=edited, archive=archive))
    assert isinstance(plan, ArchiveSteps)
    assert plan.resource_version == "12"
    assert plan.refresh is not None
    assert plan.refresh["spec"]["x"] == 1


# --------------------------------------------------------------------------- 5. restore under an expired claim


@pytest.mark.parametrize("still_due", [True, False])
def test_a_restore_asked_during_the_archiving_is_refused_under_an_expired_claim(still_due: bool) -> None:
    """Until December 6 the Sandbox was resumed under its expired claim. Now the restore request is void:
    the archiving goes on (the archive then ends as under any expired claim), or is given up without it."""
    owners = [claim_ref("claim-uid")]
    sb = suspended(owners=owners) if still_due else suspended(annotations={}, owners=owners)
    sb["metadata"].update(uid="sb-uid", resourceVersion="7")
    archive = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=T0, children=[])
    archive["metadata"]["uid"] = "archive-uid"
    archive["spec"]["restore"] = {"cause": "Request"}
    expired = {
        "metadata": {"name": "c", "uid": "claim-uid"},
        "spec": {"lifecycle": {"shutdownTime": format_time(T0 - timedelta(seconds=1))}},
    }
    plan = decide(Snapshot(now=T0, sandbox=sb, archive=archive, claim=expired))
    if still_due:
        assert isinstance(plan, ArchiveSteps)
    else:
        assert isinstance(plan, AbandonArchive)
        assert plan.resume_resource_version is None
