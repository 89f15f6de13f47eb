"""The lifecycle executor's archive steps: hibernating a Sandbox into its SandboxArchive, giving an archive up
when the Sandbox was resumed meanwhile, and ending an archive that will never be restored.

Each function carries out one plan of `decide` (`ArchiveSteps`, `AbandonArchive`, `MarkArchiveExpired`,
`ExpireArchive`); conflicts (409) and NotFound end the pass, and the next one decides again.
"""

from __future__ import annotations

import contextlib
import copy
import logging

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import ReadOnlyObject, format_rfc3339nano, parse_time
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    AlreadyExists,
    NotFound,
    Request,
    Result,
)

from .decide import (
    ANNOTATION_ARCHIVED_VERSION,
    ANNOTATION_EXPIRED_AT,
    RESTORE_POLL,
    AbandonArchive,
    ArchiveSteps,
    ExpireArchive,
    Snapshot,
    adopt_child_patch,
    handover_child_patch,
    release_child_patch,
    restores,
)
from .execute import RETRY_SOON, Executor, end_archive
from .observe import CHILD_KINDS

__all__ = ["abandon_archive", "archive_sandbox", "expire_archive", "mark_archive_expired"]

log = logging.getLogger("agent_sandbox.controllers.lifecycle")


async def archive_sandbox(ex: Executor, request: Request, snap: Snapshot, plan: ArchiveSteps) -> Result:
    """`ArchiveSteps`: create (or refresh) the archive, have it hold the children, mark the claim, then delete
    the Sandbox (orphaning its children), guarded by the resourceVersion the archive copied."""
    ns = request.namespace
    archive = snap.archive
    if plan.archive is not None:
        try:
            archive = await ex.client.create(lc.ARCHIVE, plan.archive, namespace=ns)
        except AlreadyExists:
            return Result(requeue_after=RETRY_SOON)  # the cache will show it (ours from a lost pass)
    assert archive is not None
    if plan.refresh is not None:
        # The Sandbox changed since it was copied: copy it again (guarded by the archive's
        # resourceVersion: a stale cache gets 409), so the delete below, guarded by the Sandbox's
        # resourceVersion, deletes exactly what the archive keeps.
        body = copy.deepcopy(dict(archive))
        body["spec"]["sandbox"] = plan.refresh
        body["metadata"].setdefault("annotations", {})[ANNOTATION_ARCHIVED_VERSION] = plan.resource_version
        body["metadata"]["labels"] = dict((plan.refresh.get("metadata") or {}).get("labels") or {})
        try:
            archive = await ex.client.update(lc.ARCHIVE, body)
        except NotFound:
            return Result(requeue_after=RETRY_SOON)
    for child in plan.children:
        kind = CHILD_KINDS[str(child.get("kind"))]
        await ex.client.patch(
            kind, child["metadata"]["name"], adopt_child_patch(child, archive), namespace=ns
        )
    if plan.claim_name:
        mark = {"metadata": {"annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: request.name}}}
        with contextlib.suppress(NotFound):
            await ex.client.patch(SANDBOX_CLAIM, plan.claim_name, mark, namespace=ns)
    try:
        await ex.client.delete(
            SANDBOX,
            request.name,
            namespace=ns,
            propagation_policy="Orphan",
            uid=plan.delete_uid,
            # A resume (or any write) since we decided: 409 (Conflict), decided again: `AbandonArchive`,
            # or the archive's copy refreshed before the next try.
            resource_version=plan.resource_version or None,
        )
    except NotFound:
        return Result()
    # Counted once, by the pass whose delete went through (a later one gets 409 or NotFound): until
    # December 6 only the pass that created the archive counted, and lost it when its delete got 409.
    ex.metrics.hibernations.labels(str(plan.cause)).inc()
    if snap.sandbox is not None:
        note = f"Archived ({plan.cause}); volumes kept"
        ex.events.event(dict(snap.sandbox), "Normal", "Hibernated", "Hibernate", note)
    log.info("hibernated %s (%s)", request, plan.cause)
    return Result()


async def abandon_archive(ex: Executor, request: Request, snap: Snapshot, plan: AbandonArchive) -> Result:
    """The archived Sandbox was resumed before the archiving finished: give the archive up, leaving the
    Sandbox as it was (its children released first, so none is ever left without its owner)."""
    ns = request.namespace
    # The cache may still show a Sandbox whose (Orphan) deletion went through, while the garbage
    # collector already took its reference off the volumes: giving the archive up then would leave
    # them with no owner at all. Asked of the API server (rare: a resume during the archiving).
    try:
        live = await ex.authoritative.get(SANDBOX, request.name, namespace=ns)
    except NotFound:
        live = None
    if (
        live is None
        or live["metadata"].get("uid") != plan.sandbox_uid
        or live["metadata"].get("deletionTimestamp")
    ):
        return Result(requeue_after=RESTORE_POLL)  # archived after all: the cache catches up
    if plan.resume_resource_version is not None:
        requested = lc.restore_requested(snap.archive)
        cause = requested[0] if requested is not None else lc.Cause.OTHER
        patch = lc.resume_patch(cause, snap.now, plan.resume_resource_version)
        await ex.client.patch(SANDBOX, request.name, patch, namespace=ns)
    for child in plan.handover:
        kind = CHILD_KINDS[str(child.get("kind"))]
        patch = handover_child_patch(child, live, plan.archive_uid)
        await ex.client.patch(kind, child["metadata"]["name"], patch, namespace=ns)
    for child in plan.children:
        kind = CHILD_KINDS[str(child.get("kind"))]
        patch = release_child_patch(child, plan.archive_uid)
        await ex.client.patch(kind, child["metadata"]["name"], patch, namespace=ns)
    await end_archive(ex, request, plan.claim_name, plan.archive_uid)
    log.info("%s was resumed while being archived: its archive is given up", request)
    return Result()


async def mark_archive_expired(ex: Executor, request: Request, snap: Snapshot) -> Result:
    """`MarkArchiveExpired`: record `expired-at` on the archive, kept (`shutdownPolicy: Retain`) and never
    restored."""
    mark = {"metadata": {"annotations": {ANNOTATION_EXPIRED_AT: format_rfc3339nano(snap.now)}}}
    with contextlib.suppress(NotFound):
        await ex.client.patch(lc.ARCHIVE, request.name, mark, namespace=request.namespace)
    log.info("hibernated %s expired (shutdownPolicy Retain): kept, never restored", request)
    return Result()


async def expire_archive(ex: Executor, request: Request, snap: Snapshot, plan: ExpireArchive) -> Result:
    """Delete an archive that ends without a restore (`ExpireArchive.why`): the garbage collector deletes
    the volumes and Service whose only owner it is, as it would have with the Sandbox."""
    ns = request.namespace
    if plan.why == "RestoredSandboxDeleted":
        # The cache said the restored Sandbox is gone; the Sandbox informer may only lag behind the
        # archive's (which showed the `restored-uid` we just wrote). Deleting the archive of a Sandbox
        # that exists would take volumes it has not adopted yet: ask the API server.
        try:
            live = await ex.authoritative.get(SANDBOX, request.name, namespace=ns)
        except NotFound:
            pass
        else:
            # Held back for the restored Sandbox only: a newcomer created under the name since does not
            # keep the restore's archive (and its volumes) alive (`decide._with_archive`).
            if restores(live, plan.archive_uid, plan.restored_uid or None):
                return Result(requeue_after=RESTORE_POLL)
        if snap.archive is not None:
            await _hold_ownerless(ex, snap.archive, ns)
    # The claim first: with the archive gone, nothing would lead a later pass back to a claim left marked
    # (a failure between the two steps); the archive still there, the next pass repeats both.
    if plan.claim_name:  # the claim sees its Sandbox gone, as after a live Sandbox's expiry
        unmark = {"metadata": {"annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: None}}}
        with contextlib.suppress(NotFound):
            await ex.client.patch(SANDBOX_CLAIM, plan.claim_name, unmark, namespace=ns)
    with contextlib.suppress(NotFound):
        await ex.client.delete(
            lc.ARCHIVE, request.name, namespace=ns, uid=plan.archive_uid, propagation_policy="Background"
        )
    log.info("deleted the archive %s (%s)", request, plan.why)
    return Result()


async def _hold_ownerless(ex: Executor, archive: ReadOnlyObject, ns: str) -> None:
    """Before a restore's archive is deleted (`RestoredSandboxDeleted`): put the archive's owner reference
    back on each of its children (`spec.children`) left with no owner at all, so that the garbage
    collector deletes it with the archive. Released to the restored Sandbox, which was deleted
    meanwhile, a child loses both references when the pass that saw the deletion failed before it held
    it again (`execute_restore.hold_again`: a 503, 429 or timeout, conflicts): until December 7 the
    archive was deleted anyway and the volume kept with no owner, never deleted (a reviewer's probe). Only
    a child created before the archive (the archived one; not one created under the name since) is taken.
    One released and then orphaned on purpose (`--cascade=orphan` of the restore) looks the same: it is
    deleted too if that pass failed before the archive's deletion - a rare loss, documented
    (docs/lifecycle.md)."""
    archive_meta = archive.get("metadata") or {}
    since = parse_time(archive_meta.get("creationTimestamp"))
    held = {"metadata": {"name": archive_meta.get("name"), "uid": str(archive_meta.get("uid") or "")}}
    for entry in (archive.get("spec") or {}).get("children") or []:
        kind = CHILD_KINDS.get(str(entry.get("kind")))
        if kind is None or not entry.get("name"):
            continue
        try:
            live = await ex.authoritative.get(kind, str(entry["name"]), namespace=ns)
        except NotFound:
            continue
        live_meta = live["metadata"]
        created = parse_time(live_meta.get("creationTimestamp"))
        if live_meta.get("ownerReferences") or live_meta.get("deletionTimestamp"):
            continue
        if since is None or created is None or created > since:
            continue
        # Guarded by its resourceVersion: a 409 (an adoption meanwhile) fails the pass, decided again.
        await ex.client.patch(kind, str(entry["name"]), adopt_child_patch(live, held), namespace=ns)
        log.info("%s %s/%s held again by its archive before its deletion", kind.kind, ns, entry["name"])
