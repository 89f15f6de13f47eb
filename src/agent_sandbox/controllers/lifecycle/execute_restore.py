"""The lifecycle executor's restore steps: creating the archived Sandbox again, handing its children back
from the archive, and the checks against the API server that keep a volume from ever being left without an
owner when the restored Sandbox is deleted during its restore.

`restore_sandbox` carries out `decide`'s `RestoreSteps`; the helpers below it are its uncached reads.
"""

from __future__ import annotations

import contextlib
import logging

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.kinds import KINDS_BY_NAME
from agent_sandbox.api.meta import ReadOnlyObject, controller_ref, parse_time
from agent_sandbox.kube import (
    PVC,
    SANDBOX,
    AlreadyExists,
    Conflict,
    Forbidden,
    KubeError,
    NotFound,
    Object,
    Request,
    Result,
)

from .decide import (
    ANNOTATION_RESTORED_FROM,
    ANNOTATION_RESTORED_UID,
    RESTORE_POLL,
    RestoreSteps,
    Snapshot,
    adopt_child_patch,
    handover_child_patch,
    release_child_patch,
)
from .execute import RETRY_SOON, Executor, end_archive
from .observe import CHILD_KINDS

__all__ = ["hold_again", "restore_sandbox"]

log = logging.getLogger("agent_sandbox.controllers.lifecycle")


async def restore_sandbox(ex: Executor, request: Request, snap: Snapshot, plan: RestoreSteps) -> Result:
    """`RestoreSteps`: create the Sandbox again from its archive (and record it), or hand the children back to
    the restored Sandbox; once none is left with the archive, unmark the claim and delete the archive."""
    ns = request.namespace
    if plan.create is not None:
        # The archive in the cache may not show yet the `restored-uid` our previous pass wrote: with the
        # restored Sandbox deleted meanwhile, a create now would bring it back. Asked of the API server
        # (once per restore: rare).
        try:
            live = await ex.authoritative.get(lc.ARCHIVE, request.name, namespace=ns)
        except NotFound:
            return Result()  # deleted meanwhile: nothing to restore
        live_meta = live["metadata"]
        if live_meta.get("uid") != plan.archive_uid or (live_meta.get("annotations") or {}).get(
            ANNOTATION_RESTORED_UID
        ):
            return Result(requeue_after=RETRY_SOON)  # decided on a stale archive: the cache catches up
        body, gone = await _live_owners(ex, plan.create, ns)
        try:
            created = await ex.client.create(SANDBOX, body, namespace=ns)
        except AlreadyExists:
            return Result(requeue_after=RETRY_SOON)
        # Recorded at once, before anything else that can fail: a Sandbox deleted from here on stays
        # deleted (the next pass sees it gone). Until December 7 an uncached PVC read came first, and a
        # failed one (503, 429, a timeout) ended the pass unrecorded: the restored Sandbox, deleted before
        # the next pass, was created again with an empty volume.
        await _record_restored(ex, request, created["metadata"]["uid"])
        ex.metrics.restore_started(created["metadata"]["uid"], plan.requested_at or snap.now, plan.cause)
        ex.metrics.restores.labels(str(plan.cause)).inc()
        note = f"Restored from its archive ({plan.cause})"
        if gone:
            note += f"; without its deleted owner {', '.join(gone)}"
        ex.events.event(created, "Normal", "Restored", "Restore", note)
        if missing := await _missing_volumes(ex, plan.missing, ns, created):
            names = ", ".join(f"PersistentVolumeClaim {n!r}" for n in missing)
            warning = (
                f"the archived volume {names} was deleted while hibernated: restored without its data, "
                "with a new, empty volume in its place"
            )
            ex.events.event(created, "Warning", "RestoreVolumeMissing", "Restore", warning)
            log.warning("restored %s without its deleted volume %s", request, names)
        log.info("restored %s (%s)%s", request, plan.cause, f" without {', '.join(gone)}" if gone else "")
        # The volumes stay the archive's until the Sandbox controller has taken them back (next passes).
        return Result(requeue_after=RESTORE_POLL)
    if plan.record_uid:
        await _record_restored(ex, request, plan.record_uid)
    if plan.mark is not None and plan.sandbox is not None:
        # A restore an older controller created (no `restored-from`): marked as the restore for the
        # Sandbox controller (which then adopts the volumes itself) and `lifecycle resume`. The
        # resourceVersion guards against marking a newcomer that replaced it (409: decided again).
        meta: dict[str, object] = {"annotations": {ANNOTATION_RESTORED_FROM: plan.archive_uid}}
        if plan.mark:
            meta["resourceVersion"] = plan.mark
        mark = {"metadata": meta}
        try:
            await ex.client.patch(SANDBOX, request.name, mark, namespace=ns)
        except NotFound:
            return Result(requeue_after=RESTORE_POLL)  # deleted meanwhile: ended by the next pass
        log.info("marked %s as the restore of its archive (created by an older controller)", request)
    if plan.sandbox is not None:
        for child in plan.handover:
            kind = CHILD_KINDS[str(child.get("kind"))]
            patch = handover_child_patch(child, plan.sandbox, plan.archive_uid)
            await ex.client.patch(kind, child["metadata"]["name"], patch, namespace=ns)
    if plan.children and plan.sandbox is not None and not await _alive(ex, plan.sandbox, ns):
        # Deleted (or being deleted) since the cache showed it: the archive's reference stays, and the
        # next pass ends the archive as a restore whose Sandbox was deleted (`_alive`).
        return Result(requeue_after=RESTORE_POLL)
    for child in plan.children:
        kind = CHILD_KINDS[str(child.get("kind"))]
        patch = release_child_patch(child, plan.archive_uid)
        await ex.client.patch(kind, child["metadata"]["name"], patch, namespace=ns)
    if plan.children and plan.sandbox is not None and not await _alive(ex, plan.sandbox, ns):
        # Deleted between the read above and the releases: the collector's unguarded removal of its
        # reference may land after ours and leave a volume with no owner (`_alive`). The archive takes
        # the volumes back, and the next pass ends it as a restore whose Sandbox was deleted.
        await hold_again(ex, plan.children, request.name, plan.archive_uid, ns)
        return Result(requeue_after=RESTORE_POLL)
    if plan.waiting or plan.handover:
        return Result(requeue_after=RESTORE_POLL)  # finished once every child has left the archive
    await end_archive(ex, request, plan.claim_name, plan.archive_uid)
    return Result()


async def _alive(ex: Executor, sandbox: ReadOnlyObject, ns: str) -> bool:
    """Whether the API server (not the cache) has `sandbox` (same UID), not being deleted - or being
    deleted with its children orphaned, which asks for the same release.

    Asked before the archive's reference is removed from a child the restored Sandbox controls, and
    again after. A Sandbox deleted meanwhile (the cache lags by milliseconds) would make that removal
    race the garbage collector's removal of the deleted Sandbox's reference - decided while the
    archive's was there, and sent unguarded (a strategic merge patch deleting it by UID: no
    resourceVersion of ours can make it fail) - and the volume was left with no owner, never deleted
    (until December 6: 2 of 6 runs of `test_a_sandbox_deleted_during_its_restore_stays_deleted` under
    load; the audit log showed the two writes 2 ms apart). A deletion landing between the first read and
    the patch did it still (until December 7: once under load); the second read catches it, and the
    archive's reference is put back (`hold_again`). A deletion after the second read is harmless: the
    collector then reads the child released, with the Sandbox as its only owner, and deletes it with the
    Sandbox. Letting the collector drop the archive's reference after the archive's deletion instead was
    tried and rejected: an orphaning delete of the Sandbox before the collector got to it deleted the
    volume."""
    meta = sandbox.get("metadata") or {}
    try:
        live = await ex.authoritative.get(SANDBOX, str(meta.get("name")), namespace=ns)
    except NotFound:
        return False
    live_meta = live["metadata"]
    if live_meta.get("uid") != meta.get("uid"):
        return False
    if live_meta.get("deletionTimestamp"):
        # An orphaning delete (`--cascade=orphan`) asks to keep the children: released, the volume ends
        # with no owner, as asked. Kept, the collector would leave it to the archive alone, and the
        # archive's ending would delete it (a reviewer's interleaving).
        return "orphan" in (live_meta.get("finalizers") or [])
    return True


async def hold_again(
    ex: Executor, children: tuple[ReadOnlyObject, ...], name: str, archive_uid: str, ns: str
) -> None:
    """Put the archive's owner reference back on `children` (released to a Sandbox deleted meanwhile),
    each read afresh and patched guarded by its resourceVersion: a concurrent change (the collector
    removing the deleted Sandbox's reference) fails it with 409 and it is read and written again. A
    child gone (the collector deleted it with the Sandbox) or held already is left as it is. Any failure
    fails the pass; the next one ends the archive (`RestoredSandboxDeleted`) and holds again first what
    was left with no owner (`execute_archive.expire_archive`)."""
    archive = {"metadata": {"name": name, "uid": archive_uid}}
    for child in children:
        kind = CHILD_KINDS[str(child.get("kind"))]
        child_name = str(child["metadata"]["name"])
        for attempt in range(5):
            try:
                live = await ex.authoritative.get(kind, child_name, namespace=ns)
                if any(r.get("uid") == archive_uid for r in live["metadata"].get("ownerReferences") or []):
                    break
                await ex.client.patch(kind, child_name, adopt_child_patch(live, archive), namespace=ns)
            except NotFound:
                break
            except Conflict:
                if attempt == 4:
                    raise  # the pass fails (retried); until December 7 it went on as if held
                continue
            log.info(
                "%s %s/%s held again by its archive: its restored Sandbox was deleted",
                kind.kind,
                ns,
                child_name,
            )
            break


async def _live_owners(ex: Executor, sandbox: Object, ns: str) -> tuple[Object, list[str]]:
    """`sandbox` without the archived owner references whose owner is gone (asked of the API server),
    and those owners (`Kind/name`).

    The garbage collector deletes an object whose owners are all gone: a Sandbox restored under a claim
    deleted meanwhile (`--cascade=orphan` keeps the archive; or deleted and created again under the
    name) would go at once, and its archive, its volumes with it, as a restored Sandbox deleted during
    its restore. Until December 6 that happened. It is restored as an ordinary unowned Sandbox instead,
    as the live one would be after such a deletion of its claim. Owners of kinds other than ours are
    kept as they are (no grant to read them)."""
    refs = (sandbox.get("metadata") or {}).get("ownerReferences") or []
    kept: list[Object] = []
    gone: list[str] = []
    for ref in refs:
        kind = KINDS_BY_NAME.get(str(ref.get("kind")))
        if kind is None or str(ref.get("apiVersion") or "").rpartition("/")[0] != kind.group:
            kept.append(ref)
            continue
        try:
            owner = await ex.authoritative.get(kind, str(ref.get("name")), namespace=ns)
        except NotFound:
            owner = None
        except Forbidden:
            kept.append(ref)  # cannot tell (no grant without `--extensions`): kept as archived
            continue
        if owner is not None and owner["metadata"].get("uid") == ref.get("uid"):
            kept.append(ref)
        else:
            gone.append(f"{ref.get('kind')}/{ref.get('name')}")
    if not gone:
        return sandbox, gone
    meta = {k: v for k, v in sandbox["metadata"].items() if k != "ownerReferences"}
    if kept:
        meta["ownerReferences"] = kept
    return {**sandbox, "metadata": meta}, gone


async def _missing_volumes(ex: Executor, names: tuple[str, ...], ns: str, restored: Object) -> list[str]:
    """Those of `names` (archived PVCs the cache does not have) that the API server has not either - or
    has only as the new, empty one the Sandbox controller created for `restored` already (controlled
    by it, created no earlier than it: it sees the restore at once, and the read below comes after the
    restore's record). A PVC created again under the name before the restore (a backup; the cache
    lagging behind) is not reported. A read that fails (503, 429, a timeout) reports nothing of that
    PVC: the warning is not worth failing the pass for (the restore is created and recorded already;
    it would not be tried again)."""
    since = parse_time(restored["metadata"].get("creationTimestamp"))
    uid = restored["metadata"].get("uid")
    missing = []
    for name in names:
        try:
            pvc = await ex.authoritative.get(PVC, name, namespace=ns)
        except NotFound:
            missing.append(name)
            continue
        except (KubeError, TimeoutError, ConnectionError) as exc:
            log.warning("could not tell whether the archived volume %s/%s is gone: %s", ns, name, exc)
            continue
        ref = controller_ref(pvc["metadata"]) or {}
        created = parse_time(pvc["metadata"].get("creationTimestamp"))
        if ref.get("uid") == uid and since is not None and created is not None and created >= since:
            missing.append(name)
    return missing


async def _record_restored(ex: Executor, request: Request, uid: str) -> None:
    mark = {"metadata": {"annotations": {ANNOTATION_RESTORED_UID: uid}}}
    with contextlib.suppress(NotFound):
        await ex.client.patch(lc.ARCHIVE, request.name, mark, namespace=request.namespace)
