"""Lifecycle races and endings (controllers/lifecycle): a resume that lands while the Sandbox is being
archived, a restored Sandbox deleted during its restore, an archive under an expired claim.

Decisions as pure tables; the reconciler over the in-memory FakeClient, whose writes are the only seam: a
user's write is made at the exact point the race needs (right after the archive's creation).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.controllers.claim.status import expiry
from agent_sandbox.controllers.lifecycle.decide import (
    ANNOTATION_RESTORED_UID,
    AbandonArchive,
    ArchiveSteps,
    ExpireArchive,
    Nothing,
    RestoreSteps,
    Snapshot,
    archive_owner_ref,
    claim_expired,
    decide,
)
from agent_sandbox.controllers.lifecycle.metrics import LifecycleMetrics
from agent_sandbox.controllers.lifecycle.reconciler import LifecycleReconciler
from agent_sandbox.kube import PVC, SANDBOX, NotFound, Object, Request, ResourceKind
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "ns"
CLAIM_REF = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
    "kind": "SandboxClaim",
    "name": "c",
    "uid": "claim-uid",
    "controller": True,
}
HIBERNATE = {lc.ANNOTATION_HIBERNATE: "true"}


def sandbox(mode: str = "Suspended", annotations: dict[str, str] | None = None, **meta: Any) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "sb",
            "namespace": NS,
            "uid": "sb-uid",
            "resourceVersion": "7",
            "creationTimestamp": format_time(T0),
            "annotations": annotations if annotations is not None else dict(HIBERNATE),
            "ownerReferences": [CLAIM_REF],
            **meta,
        },
        "spec": {"operatingMode": mode},
        "status": {
            "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": format_time(T0)}]
        },
    }


def archive_of(sb: Object, **spec: Any) -> Object:
    body = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=T0, children=[])
    body["metadata"]["uid"] = "archive-uid"
    body["spec"].update(spec)
    return body


HELD = {
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "a", "ownerReferences": [{"uid": "archive-uid"}]},
}
"""Held by the archive alone (the Sandbox's reference gone): handed to the Sandbox, never released."""
SHARED = {
    "kind": "PersistentVolumeClaim",
    "metadata": {
        "name": "b",
        "ownerReferences": [{"uid": "sb-uid", "controller": True}, {"uid": "archive-uid"}],
    },
}
"""Held by the archive and still controlled by the Sandbox: released."""
MARKED = {"metadata": {"name": "c", "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}}}


# --------------------------------------------------------------------------- decisions


def test_archiving_goes_on_only_while_the_hibernation_is_still_wanted() -> None:
    sb = sandbox()
    plan = decide(Snapshot(now=T0, sandbox=sb, archive=archive_of(sb), claim=MARKED))
    assert isinstance(plan, ArchiveSteps)
    assert plan.resource_version == "7"  # the delete is guarded by what was decided on


@pytest.mark.parametrize(
    "resumed",
    [
        sandbox("Running", {}),  # `lifecycle resume` (or a router) landed between create and delete
        sandbox("Suspended", {}),  # resumed and suspended again by hand: the hibernate request withdrawn
    ],
)
def test_a_sandbox_resumed_while_being_archived_keeps_running_and_the_archive_goes(resumed: Object) -> None:
    # Until December 6 the archiving went on: the Running Sandbox was deleted (Orphan), its Pod left
    # running with no owner, the router answering 502.
    archive = archive_of(sandbox())
    plan = decide(Snapshot(now=T0, sandbox=resumed, archive=archive, children=(HELD, SHARED), claim=MARKED))
    assert plan == AbandonArchive("archive-uid", (SHARED,), "c", None, (HELD,), "sb-uid")


def test_a_restore_asked_of_an_archive_whose_sandbox_is_still_there_resumes_it() -> None:
    archive = archive_of(sandbox(), restore={"cause": "Request"})
    plan = decide(Snapshot(now=T0, sandbox=sandbox(), archive=archive, children=(SHARED,)))
    assert plan == AbandonArchive("archive-uid", (SHARED,), None, "7", (), "sb-uid")


def test_a_restored_sandbox_deleted_during_its_restore_stays_deleted() -> None:
    # Until December 6 the archive (still asking for the restore) created it again.
    archive = archive_of(sandbox(), restore={"cause": "Manual"})
    assert isinstance(decide(Snapshot(now=T0, archive=archive)), RestoreSteps)  # not created yet
    archive["metadata"]["annotations"] = {ANNOTATION_RESTORED_UID: "new-uid"}
    plan = decide(Snapshot(now=T0, archive=archive, children=(HELD,), claim=MARKED))
    assert plan == ExpireArchive("archive-uid", "c", "RestoredSandboxDeleted", "new-uid")


def claim(**lifecycle: Any) -> Object:
    return {
        "metadata": {"name": "c", "annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: "sb"}},
        "spec": {"lifecycle": lifecycle},
    }


@pytest.mark.parametrize("restore", [False, True])
def test_a_hibernated_sandbox_goes_with_its_claims_expiry(restore: bool) -> None:
    # Until December 6 the archive and its volume stayed until the claim was deleted, and a restore brought
    # back a Sandbox under the expired claim.
    archive = archive_of(sandbox(), **({"restore": {"cause": "Manual"}} if restore else {}))
    expiring = claim(shutdownTime=format_time(T0 + timedelta(seconds=30)), shutdownPolicy="Retain")
    if not restore:  # looked at again at the claim's expiry
        assert decide(Snapshot(now=T0, archive=archive, claim=expiring)) == Nothing(30.0)
    later = T0 + timedelta(seconds=31)
    assert decide(Snapshot(now=later, archive=archive, claim=expiring)) == ExpireArchive(
        "archive-uid", "c", "ClaimExpired"
    )


def test_claim_expiry_is_reckoned_as_the_claim_controller_does() -> None:
    finished = {"type": "Finished", "status": "True", "lastTransitionTime": format_time(T0)}
    marked = {"type": "Ready", "status": "False", "reason": "ClaimExpired"}
    extended = {  # marked expired, then its shutdownTime moved later: no longer expired
        **claim(shutdownTime=format_time(T0 + timedelta(hours=1))),
        "status": {"conditions": [marked]},
    }
    cases = [
        claim(),
        claim(shutdownTime=format_time(T0 + timedelta(seconds=5))),
        claim(shutdownTime=format_time(T0 - timedelta(seconds=5))),
        {**claim(ttlSecondsAfterFinished=3), "status": {"conditions": [finished]}},
        {**claim(ttlSecondsAfterFinished=30), "status": {"conditions": [finished]}},
        {**claim(shutdownTime=format_time(T0)), "status": {"conditions": [marked]}},
        extended,
    ]
    for case in cases:
        ours = claim_expired(case, T0 + timedelta(seconds=10))
        theirs = expiry(case, T0 + timedelta(seconds=10))
        assert ours == (theirs.expired, theirs.time_left), case
    # Until December 6 the stale condition counted: the extended claim's hibernated Sandbox was deleted.
    assert not claim_expired(extended, T0 + timedelta(seconds=10))[0]
    archive = archive_of(sandbox())
    assert decide(Snapshot(now=T0, archive=archive, claim=extended)) == Nothing(3600.0)
    assert claim_expired(None, T0) == (False, None)


# --------------------------------------------------------------------------- the reconciler


class ResumeOnArchiveCreate(FakeClient):
    """Makes the user's resume land right after the archive is created (before the Sandbox is deleted)."""

    async def create(self, kind: ResourceKind, obj: Object, *, namespace: str | None = None) -> Object:
        created = await super().create(kind, obj, namespace=namespace)
        if kind == lc.ARCHIVE:
            await self.patch(SANDBOX, "sb", lc.resume_patch(lc.Cause.MANUAL, T0), namespace=namespace)
        return created


def reconciler(client: FakeClient, authoritative: FakeClient | None = None) -> LifecycleReconciler:
    """`authoritative`: the API server when `client` plays a cache that lags behind it."""

    class Events:
        def event(self, *_args: Any) -> None:
            pass

    return LifecycleReconciler(
        client,
        probe=None,
        events=Events(),
        metrics=LifecycleMetrics(CollectorRegistry()),
        extensions=False,
        authoritative=authoritative,
    )


async def _archived_sandbox_with_pvc(client: FakeClient) -> None:
    body = sandbox()
    body["metadata"].pop("ownerReferences")
    body["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "data"}}]
    created = await client.create(SANDBOX, body, namespace=NS)
    ref = {"uid": created["metadata"]["uid"], "controller": True, "kind": "Sandbox", "name": "sb"}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
    await client.create(PVC, {**pvc, "metadata": {"name": "data-sb", "ownerReferences": [ref]}}, namespace=NS)


async def test_a_resume_between_the_archive_and_the_delete_wins() -> None:
    client = ResumeOnArchiveCreate()
    rec = reconciler(client)
    await _archived_sandbox_with_pvc(client)
    await rec.reconcile(Request(NS, "sb"))  # archive created, the resume lands, the delete gets 409
    sb = await client.get(SANDBOX, "sb", namespace=NS)
    assert sb["spec"]["operatingMode"] == "Running"
    await rec.reconcile(Request(NS, "sb"))  # decided again: the archive is given up, its hold released
    with pytest.raises(NotFound):
        await client.get(lc.ARCHIVE, "sb", namespace=NS)
    pvc = await client.get(PVC, "data-sb", namespace=NS)
    assert [r["uid"] for r in pvc["metadata"]["ownerReferences"]] == [sb["metadata"]["uid"]]
    assert (await client.get(SANDBOX, "sb", namespace=NS))["spec"]["operatingMode"] == "Running"


async def test_a_sandbox_deleted_during_its_restore_is_not_created_again() -> None:
    client = FakeClient()
    rec = reconciler(client)
    old = sandbox()
    body = lc.archive_body(
        old, cause=lc.Cause.REQUESTED, now=T0, children=[{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    )
    body["metadata"].pop("ownerReferences")
    body["spec"]["sandbox"]["metadata"].pop("ownerReferences")
    archive = await client.create(lc.ARCHIVE, body, namespace=NS)
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
    held = {"name": "data-sb", "ownerReferences": [archive_owner_ref(archive)]}
    await client.create(PVC, {**pvc, "metadata": held}, namespace=NS)
    await client.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, T0), namespace=NS)
    await rec.reconcile(Request(NS, "sb"))
    restored = await client.get(SANDBOX, "sb", namespace=NS)
    recorded = (await client.get(lc.ARCHIVE, "sb", namespace=NS))["metadata"]["annotations"]
    assert recorded[ANNOTATION_RESTORED_UID] == restored["metadata"]["uid"]
    await client.delete(SANDBOX, "sb", namespace=NS)  # by its user, before it adopted the volume
    await rec.reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await client.get(SANDBOX, "sb", namespace=NS)
    with pytest.raises(NotFound):  # the volume is the garbage collector's now, as the Sandbox's would be
        await client.get(lc.ARCHIVE, "sb", namespace=NS)


async def test_a_restore_is_not_created_again_from_a_stale_archive() -> None:
    """The pass after the create may still read the archive without the `restored-uid` it wrote (the
    cache lags); with the restored Sandbox already deleted, it would create it again. Seen on the real
    control plane: two `Restored` passes for one request."""
    cache, live = FakeClient(), FakeClient()
    body = archive_of(sandbox(), restore={"cause": "Manual"})
    body["metadata"].pop("ownerReferences")
    body["spec"]["sandbox"]["metadata"].pop("ownerReferences")
    stale = await cache.create(lc.ARCHIVE, body, namespace=NS)
    recorded = {**body, "metadata": {**body["metadata"], "annotations": {ANNOTATION_RESTORED_UID: "gone"}}}
    recorded["metadata"]["uid"] = stale["metadata"]["uid"]
    await live.create(lc.ARCHIVE, recorded, namespace=NS)
    rec = reconciler(cache, live)
    await rec.reconcile(Request(NS, "sb"))
    with pytest.raises(NotFound):
        await cache.get(SANDBOX, "sb", namespace=NS)


@pytest.mark.parametrize("live_state", ["gone", "deleting", "orphaning", "alive"])
async def test_the_archives_hold_is_released_only_from_a_sandbox_the_api_server_still_has(
    live_state: str,
) -> None:
    """The cache showed the restored Sandbox, which its user had deleted milliseconds before: our removal of
    the archive's reference raced the garbage collector's removal of the Sandbox's, and the volume was left
    with no owner, never deleted (2 of 6 runs under load on the real control plane until December 6). A
    Sandbox being deleted with its children orphaned (`--cascade=orphan`) counts as there: kept, the volume
    would be left to the archive alone and deleted with it, against what the orphaning delete asked."""
    cache, live = FakeClient(), FakeClient()
    body = archive_of(sandbox(), restore={"cause": "Manual"})
    body["spec"]["children"] = [{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    body["metadata"].pop("ownerReferences")
    body["spec"]["sandbox"]["metadata"].pop("ownerReferences")
    archive = await cache.create(lc.ARCHIVE, body, namespace=NS)
    restored = sandbox("Running", {}, uid="restored-uid")  # a new object: not the archived one
    restored["metadata"].pop("ownerReferences")
    restored = await cache.create(SANDBOX, restored, namespace=NS)
    uid = restored["metadata"]["uid"]
    await cache.patch(
        lc.ARCHIVE, "sb", {"metadata": {"annotations": {ANNOTATION_RESTORED_UID: uid}}}, namespace=NS
    )
    ref = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "name": "sb",
        "uid": uid,
        "controller": True,
    }
    held = {"name": "data-sb", "ownerReferences": [archive_owner_ref(archive), ref]}
    await cache.create(
        PVC, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": held}, namespace=NS
    )
    if live_state != "gone":  # the same object (UID) as the API server has it
        finalizers = {"deleting": ["example.com/hold"], "orphaning": ["orphan"]}.get(live_state, [])
        await live.create(
            SANDBOX, {**restored, "metadata": {**restored["metadata"], "finalizers": finalizers}}
        )
        if finalizers:
            await live.delete(SANDBOX, "sb", namespace=NS)  # deletionTimestamp set, kept by the finalizer
    rec = reconciler(cache, live)
    await rec.reconcile(Request(NS, "sb"))
    owners = [
        r["uid"] for r in (await cache.get(PVC, "data-sb", namespace=NS))["metadata"]["ownerReferences"]
    ]
    if live_state in ("alive", "orphaning"):  # released, the restore finished
        assert owners == [uid]
        with pytest.raises(NotFound):
            await cache.get(lc.ARCHIVE, "sb", namespace=NS)
    else:  # the archive keeps its hold; the next pass ends it as a restore whose Sandbox was deleted
        assert owners == [archive["metadata"]["uid"], uid]
        assert (await cache.get(lc.ARCHIVE, "sb", namespace=NS))["metadata"]["uid"] == archive["metadata"][
            "uid"
        ]
