"""Lifecycle decisions (ours, docs/lifecycle.md): idle auto-suspend, hibernation, restore. Pure.

One object name, three possible states, one decision per pass:

| Sandbox | SandboxArchive | decision |
|---|---|---|
| Running, idle timeout set | - | idle for the timeout (and the runtime agrees) -> suspend (`Idle`); else look again at the deadline |
| Running, `hibernate: "true"` | - | suspend (`Hibernate`) |
| Suspended and its Pod gone, `hibernate-after` due or `hibernate: "true"` | - | archive: create the archive, hand the volumes (and Service) to it, mark the claim, delete the Sandbox keeping its children (`Orphan`) |
| the archived one (same UID), still Suspended and its hibernation still asked for or due, no restore asked for (or one under an expired claim) | exists | archiving in progress: finish it (idempotent steps; the archive's copy taken again if the Sandbox changed since; the delete is guarded by the resourceVersion decided on) |
| the archived one (same UID), resumed meanwhile (Running, `hibernate` withdrawn, or a restore asked for) | exists | the resume wins, once an uncached read confirms the Sandbox: drop the archive's references (a child it alone holds is handed to the Sandbox), unmark the claim, delete the archive (and resume the Sandbox if a restore was asked of the archive, its claim not expired) |
| - | restore asked for | restore: create the Sandbox (Running, same name; without archived owners that are gone; `restored-from`: the archive's UID), then at once record its UID on the archive (`restored-uid`); an archived volume gone meanwhile is reported (`RestoreVolumeMissing`) |
| the restore (`restored-from` the archive's UID, or the `restored-uid`, or an older controller's unrecorded one: `owners.legacy_restore`) | restore asked for | restore in progress: once the Sandbox controller has taken each volume back (its controller reference), drop the archive's reference; then unmark the claim, delete the archive. A restore without `restored-from` gets it (and its UID recorded), and its volumes handed over by us |
| - or a newcomer | restore asked for, `restored-uid` recorded | the restored Sandbox was deleted (by a user, its claim) during the restore: it stays deleted; the archive is deleted, its volumes go as a deleted Sandbox's would |
| a newcomer (another UID, not the restore) | exists | someone created a Sandbox with an archived name: the archive's expiry (below) still ends it; otherwise reported on the newcomer, both left alone (looked at again at the archive's deadline); it does not get the archived volumes (the Sandbox controller refuses them, `owners.restores`), and a restore asked for waits until it is deleted |
| - | exists, no restore | hibernated: nothing (until its `shutdownTime`, or its claim's expiry) |
| - | exists, archived `shutdownTime` passed | expired while hibernated: `shutdownPolicy: Delete` -> delete the archive (its volumes go with it, as with the Sandbox), unmark the claim; `Retain` -> keep it, marked `expired-at`; never restored |
| - | exists, its claim expired | as the claim controller does to a live Sandbox at expiry: the archive is deleted (volumes with it), the claim unmarked; never restored |

The archive keeps its reference on a volume until the restored Sandbox controls it: dropped earlier, a
Sandbox that never takes it back (expired, being deleted) would leave it with no owner, never deleted; and
the Sandbox controller's adoption patch and ours, racing on the same resourceVersion, made one of them fail
(the Sandbox controller's failure showed as a `ReconcilerError` that routers took for final). Until
December 6 both happened. A child the Sandbox controller will not take (the Sandbox expired or being
deleted, or a Service it does not ask for) is handed to it by us, in one patch.

Activity, for the idle clock, is the latest of: the Sandbox's creation, its last Ready transition (a resume
ends with one), the routers' `last-activity` record, our `resumed-at`, and its claim's creation (a warm
member is adopted long after it was created). A start (creation or resume) is not over until the Sandbox is
Ready: while it is not Ready yet (for up to `START_GRACE` after the start) it is not suspended, however short
its timeout; requests a router holds for it would otherwise wait for a pod that never comes. Before suspending, the runtime is asked (`Probe`): running
commands or newer activity (traffic that bypassed the router) postpone the suspend. The suspend patch
carries the Sandbox's resourceVersion, so a router that records activity in between wins (409, decided
again).

Never touched: Sandboxes being deleted, unclaimed warm-pool members (the pool owns their lifecycle; a
`hibernate` request on one is only removed, so that it does not hit whoever claims it), and Sandboxes whose
`shutdownTime` has passed (expiry owns them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.kinds import SANDBOX_CLAIM, SANDBOX_WARM_POOL
from agent_sandbox.api.lifecycle import ANNOTATION_EXPIRED_AT, ANNOTATION_RESTORED_UID, claim_expired
from agent_sandbox.api.meta import (
    ReadOnlyObject,
    controlled_by,
    controller_name,
    controller_ref,
    deadline_after,
    is_ready,
    parse_time,
    status_condition,
)

from .owners import (
    ANNOTATION_RESTORED_FROM,
    adopt_child_patch,
    archive_owner_ref,
    handover_child_patch,
    legacy_restore,
    release_child_patch,
    restores,
)
from .plan import (
    AbandonArchive,
    ArchiveSteps,
    DropHibernate,
    ExpireArchive,
    MarkArchiveExpired,
    Nothing,
    Plan,
    Probe,
    RestoreSteps,
    RuntimeActivity,
    Snapshot,
    Suspend,
)

__all__ = [
    "ANNOTATION_ARCHIVED_VERSION",
    "ANNOTATION_EXPIRED_AT",
    "ANNOTATION_RESTORED_FROM",
    "ANNOTATION_RESTORED_UID",
    "AbandonArchive",
    "ArchiveSteps",
    "DropHibernate",
    "ExpireArchive",
    "MarkArchiveExpired",
    "Nothing",
    "Plan",
    "Probe",
    "RestoreSteps",
    "RuntimeActivity",
    "Snapshot",
    "Suspend",
    "adopt_child_patch",
    "archive_owner_ref",
    "claim_expired",
    "decide",
    "handover_child_patch",
    "idle_since",
    "release_child_patch",
    "restores",
]

ANNOTATION_ARCHIVED_VERSION = f"{lc.LIFECYCLE_GROUP}/sandbox-resource-version"
"""On a SandboxArchive while its Sandbox still exists: the Sandbox's resourceVersion its `spec.sandbox` was
copied from. The Sandbox is deleted only at that resourceVersion (delete precondition), so what the archive
keeps is what was deleted; a Sandbox changed since is copied again first."""

RESTORE_POLL = 0.5
"""Seconds between looks while an archived Sandbox is still being deleted (its children being orphaned), and
while a restored Sandbox's controller has not taken its volumes back yet (no PVC watch of ours)."""
BUSY_RECHECK = 60.0
"""Longest wait before asking a busy runtime again."""
START_GRACE = 300.0
"""Seconds after creation or `resumed-at` during which a Sandbox that is not Ready yet is not idle-suspended."""


# --------------------------------------------------------------------------- small readers


def _meta(obj: ReadOnlyObject) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _annotations(obj: ReadOnlyObject | None) -> Mapping[str, str]:
    return (_meta(obj).get("annotations") or {}) if obj is not None else {}


def _mode(sandbox: ReadOnlyObject) -> str:
    return str((sandbox.get("spec") or {}).get("operatingMode") or c.OperatingMode.RUNNING)


def _condition_time(obj: ReadOnlyObject, type_: str, status: str = "True") -> datetime | None:
    cond = status_condition(obj, type_)
    if cond is None or cond.get("status") != status:
        return None
    return parse_time(cond.get("lastTransitionTime"))


def _has_owner_uid(obj: ReadOnlyObject, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in _meta(obj).get("ownerReferences") or [])


def idle_since(sandbox: ReadOnlyObject, claim: ReadOnlyObject | None) -> datetime | None:
    """The latest activity the control plane knows of (module docstring); None without any time."""
    meta = _meta(sandbox)
    ann = meta.get("annotations") or {}
    times = [
        parse_time(meta.get("creationTimestamp")),
        _condition_time(sandbox, c.CONDITION_READY),
        parse_time(ann.get(lc.ANNOTATION_LAST_ACTIVITY)),
        parse_time(ann.get(lc.ANNOTATION_RESUMED_AT)),
    ]
    if claim is not None:
        cmeta = _meta(claim)
        times += [
            parse_time(cmeta.get("creationTimestamp")),
            parse_time((cmeta.get("annotations") or {}).get(c.ANNOTATION_CLAIM_FIRST_READY_AT)),
        ]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def _suspended_since(sandbox: ReadOnlyObject) -> datetime | None:
    """When the Pod was confirmed gone (Suspended=True), or our own suspend time if later."""
    confirmed = _condition_time(sandbox, c.CONDITION_SUSPENDED)
    if confirmed is None:
        return None
    ours = parse_time(_annotations(sandbox).get(lc.ANNOTATION_SUSPENDED_AT))
    return max(confirmed, ours) if ours else confirmed


def _expired(sandbox: ReadOnlyObject, now: datetime) -> bool:
    deadline = parse_time((sandbox.get("spec") or {}).get("shutdownTime"))
    return deadline is not None and now >= deadline


def _claim_name(obj: ReadOnlyObject) -> str | None:
    return controller_name(obj, SANDBOX_CLAIM) or None


def _seconds(delta: timedelta) -> float:
    return max(delta.total_seconds(), 0.001)


# --------------------------------------------------------------------------- decide


def decide(s: Snapshot) -> Plan:
    """The one thing to do for this name now (module docstring)."""
    sb, archive = s.sandbox, s.archive
    if archive is not None:
        return _with_archive(s, archive)
    if sb is None:
        return Nothing()
    if _meta(sb).get("deletionTimestamp") or _expired(sb, s.now):
        return Nothing()
    if controlled_by(sb, SANDBOX_WARM_POOL):
        if lc.ANNOTATION_HIBERNATE in _annotations(sb):
            # Never for a pool member: dropped before a claim adopts it, or it would hibernate the claimer
            # (until December 6 it did; `agent-sandbox lifecycle hibernate` refuses pool members now).
            return DropHibernate(_meta(sb).get("resourceVersion", ""))
        return Nothing()
    policy = lc.lifecycle_policy(_annotations(sb), s.template_annotations)
    hibernate_now = _annotations(sb).get(lc.ANNOTATION_HIBERNATE) == "true"
    if _mode(sb) == c.OperatingMode.SUSPENDED:
        return _suspended(s, sb, policy, hibernate_now)
    if hibernate_now:
        return Suspend(lc.Cause.HIBERNATE, _meta(sb).get("resourceVersion", ""))
    if policy.idle_timeout is None:
        return Nothing(problems=policy.problems)
    return _running(s, sb, policy.idle_timeout, policy.problems)


def _start_grace_left(sb: ReadOnlyObject, now: datetime) -> float | None:
    """Seconds left during which a created or resumed Sandbox not Ready yet is still starting (None: not)."""
    if is_ready(sb):
        return None
    starts = [
        parse_time(_meta(sb).get("creationTimestamp")),
        parse_time(_annotations(sb).get(lc.ANNOTATION_RESUMED_AT)),
    ]
    started = max((t for t in starts if t is not None), default=None)
    if started is None:
        return None
    grace_end = deadline_after(started, START_GRACE)  # None: a resumed-at past year 9999, still starting
    left = (grace_end - now).total_seconds() if grace_end is not None else START_GRACE
    return left if left > 0 else None


def _running(s: Snapshot, sb: ReadOnlyObject, timeout: float, problems: tuple[str, ...]) -> Plan:
    starting = _start_grace_left(sb, s.now)
    if starting is not None:
        # Its Ready transition (an event) restarts the idle clock; the requeue bounds a Sandbox never Ready.
        return Nothing(starting, problems)
    since = idle_since(sb, s.claim) or s.now
    due = deadline_after(since, timeout)
    if due is None:
        # Past year 9999 (a `last-activity` in the far future): never idle, nothing to requeue for.
        return Nothing(problems=problems)
    if s.now < due:
        return Nothing(_seconds(due - s.now), problems)
    act = s.activity
    if act is None:
        ips = (sb.get("status") or {}).get("podIPs") or []
        if s.probe_enabled and ips:
            return Probe(str(ips[0]))
    elif act.reachable:
        if act.busy:
            return Nothing(min(timeout, BUSY_RECHECK), problems)
        if act.idle_seconds < timeout:
            return Nothing(max(timeout - act.idle_seconds, 0.001), problems)
    idle_for = (s.now - since).total_seconds()
    if act is not None and act.reachable:
        idle_for = min(idle_for, act.idle_seconds)
    return Suspend(lc.Cause.IDLE, _meta(sb).get("resourceVersion", ""), idle_for)


def _hibernation_due(
    s: Snapshot, sb: ReadOnlyObject, policy: lc.LifecyclePolicy, hibernate_now: bool
) -> lc.Cause | Nothing:
    """Why a Suspended Sandbox is to be archived now, or what to wait for."""
    since = _suspended_since(sb)
    if since is None:
        return Nothing(problems=policy.problems)  # the Pod is still going away; its events wake us
    if hibernate_now:
        return lc.Cause.REQUESTED
    if policy.hibernate_after is not None:
        due = deadline_after(since, policy.hibernate_after)
        if due is None:  # past year 9999: never
            return Nothing(problems=policy.problems)
        if s.now < due:
            return Nothing(_seconds(due - s.now), policy.problems)
        return lc.Cause.AFTER
    return Nothing(problems=policy.problems)


def _suspended(s: Snapshot, sb: ReadOnlyObject, policy: lc.LifecyclePolicy, hibernate_now: bool) -> Plan:
    cause = _hibernation_due(s, sb, policy, hibernate_now)
    if isinstance(cause, Nothing):
        return cause
    body = lc.archive_body(
        sb,
        cause=cause,
        now=s.now,
        children=[{"kind": str(ch.get("kind", "")), "name": _meta(ch)["name"]} for ch in s.children],
    )
    meta = _meta(sb)
    body["metadata"]["annotations"] = {
        ANNOTATION_ARCHIVED_VERSION: meta.get("resourceVersion", ""),
        # So a restore on request does not depend on a template that may be deleted while it is hibernated.
        **lc.template_auto_resume_record(s.template_annotations),
    }
    return ArchiveSteps(
        cause, body, s.children, _claim_name(sb), meta.get("uid", ""), meta.get("resourceVersion", "")
    )


def _archived_spec(archive: ReadOnlyObject) -> Mapping[str, Any]:
    spec: Mapping[str, Any] = ((archive.get("spec") or {}).get("sandbox") or {}).get("spec") or {}
    return spec


def _sandbox_takes_back(sb: ReadOnlyObject, child: ReadOnlyObject, now: datetime) -> bool:
    """Whether the Sandbox controller adopts `child` for `sb` by itself (as any Sandbox's unowned, tracked
    PVC or Service): not for a Sandbox being deleted or expired (it only tears down), nor a Service the
    Sandbox does not ask for (`spec.service`)."""
    if _meta(sb).get("deletionTimestamp") or _expired(sb, now):
        return False
    return str(child.get("kind")) != "Service" or bool((sb.get("spec") or {}).get("service"))


def _still_archiving(s: Snapshot, sb: ReadOnlyObject, requested: bool) -> bool:
    """Whether the archived Sandbox (same UID, not deleted yet) is still to be archived: Suspended, its
    hibernation still asked for or due, and no restore asked of the archive. Anything else is a resume that
    landed while it was being archived (or while the controller was down): the resume wins. Until December 6
    the archiving went on whatever the Sandbox had become, deleting a resumed one and orphaning its Pod."""
    if requested or _mode(sb) != c.OperatingMode.SUSPENDED:
        return False
    policy = lc.lifecycle_policy(_annotations(sb), s.template_annotations)
    hibernate_now = _annotations(sb).get(lc.ANNOTATION_HIBERNATE) == "true"
    return isinstance(_hibernation_due(s, sb, policy, hibernate_now), lc.Cause)


def _being_archived(s: Snapshot, archive: ReadOnlyObject, sb: ReadOnlyObject, claim_mark: str | None) -> Plan:
    """The archived Sandbox (same UID) still exists: finish archiving it, or give the archive up."""
    spec = archive.get("spec") or {}
    archive_uid = str(_meta(archive).get("uid") or "")
    # A restore under an expired claim is never carried out, nor is this resume (until December 6 it was):
    # the archiving goes on if still due, and the archive then ends as any under an expired claim.
    requested = lc.restore_requested(archive) is not None and not claim_expired(s.claim, s.now)[0]
    if _meta(sb).get("deletionTimestamp"):
        # Its children are being orphaned; a restore must wait until the old object is gone.
        return Nothing(RESTORE_POLL if requested else None)
    meta = _meta(sb)
    sb_uid, sb_version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
    if not _still_archiving(s, sb, requested):
        held = [ch for ch in s.children if _has_owner_uid(ch, archive_uid)]
        # A child the Sandbox no longer controls would be left with no owner by a release: handed over.
        handover = tuple(ch for ch in held if _controller_uid(ch) != sb_uid)
        release = tuple(ch for ch in held if _controller_uid(ch) == sb_uid)
        resume = sb_version if requested and _mode(sb) == c.OperatingMode.SUSPENDED else None
        return AbandonArchive(archive_uid, release, claim_mark, resume, handover, sb_uid)
    try:
        cause = lc.Cause(str(spec.get("reason") or lc.Cause.AFTER))
    except ValueError:
        cause = lc.Cause.AFTER
    pending = tuple(ch for ch in s.children if not _has_owner_uid(ch, archive_uid))
    refresh = None
    if _annotations(archive).get(ANNOTATION_ARCHIVED_VERSION) != sb_version:
        fresh = lc.archive_body(sb, cause=cause, now=s.now, children=[])["spec"]["sandbox"]
        # A write that left the copy as it was (the Sandbox controller's status) needs no new copy.
        refresh = fresh if fresh != spec.get("sandbox") else None
    return ArchiveSteps(
        cause,
        None,
        pending,
        None if claim_mark else _claim_name(sb),
        sb_uid,
        sb_version,
        refresh=refresh,
    )


def _controller_uid(obj: ReadOnlyObject) -> str | None:
    ref = controller_ref(_meta(obj))
    return str(ref.get("uid") or "") if ref is not None else None


def _hibernated(s: Snapshot, archive: ReadOnlyObject, claim_mark: str | None) -> Plan | None:
    """Only the archive exists: what ends it other than a restore (None: nothing does, restore if asked)."""
    archive_uid = str(_meta(archive).get("uid") or "")
    if _meta(archive).get("deletionTimestamp"):
        return Nothing()
    if restored_uid := _annotations(archive).get(ANNOTATION_RESTORED_UID):
        # Its restore created the Sandbox, which is gone: deleted (a user, its claim's expiry) during the
        # restore. It stays deleted; the volumes go as that Sandbox's would (the archive alone keeps them).
        return ExpireArchive(archive_uid, claim_mark, "RestoredSandboxDeleted", restored_uid)
    ended = _expiry(s, archive, claim_mark)
    if not isinstance(ended, _Left):
        return ended
    if lc.restore_requested(archive) is None:
        return Nothing(ended.seconds)  # looked at again at the earliest deadline
    return None


@dataclass(frozen=True, slots=True)
class _Left:
    """An archive not expired: seconds until its earliest deadline (None: it has none)."""

    seconds: float | None


def _expiry(s: Snapshot, archive: ReadOnlyObject, claim_mark: str | None) -> Plan | _Left:
    """The ending of a hibernated Sandbox's archive by expiry - its claim's, or its own `shutdownTime` - or
    how long until the earliest (`_Left`). An expired one is never restored (the Sandbox would only be torn
    down again), with a newcomer under its name too: the newcomer does not keep it alive."""
    archive_uid = str(_meta(archive).get("uid") or "")
    claim_gone, claim_left = claim_expired(s.claim, s.now)
    if claim_gone:
        # As the claim controller does to a live Sandbox at its claim's expiry (deleted: `Retain` keeps the
        # claim only; `Delete` deletes the claim, and the archive with it). Until December 6 the archive and
        # its volumes stayed, and a restore brought back a Sandbox under an expired claim.
        return ExpireArchive(archive_uid, claim_mark, "ClaimExpired")
    # Expiry of its own still applies (until December 6 it never did, and the archive kept the volumes
    # forever).
    archived = _archived_spec(archive)
    deadline = parse_time(archived.get("shutdownTime"))
    if deadline is not None and s.now >= deadline:
        if archived.get("shutdownPolicy") == c.ShutdownPolicy.DELETE:
            return ExpireArchive(archive_uid, claim_mark)
        if not _annotations(archive).get(ANNOTATION_EXPIRED_AT):
            return MarkArchiveExpired(archive_uid)
        return Nothing()  # Retain: kept, volumes and all, until someone deletes the archive
    own_left = (deadline - s.now).total_seconds() if deadline is not None else None
    lefts = [t for t in (claim_left, own_left) if t is not None]
    return _Left(max(min(lefts), 0.001) if lefts else None)


def _newcomer(s: Snapshot, archive: ReadOnlyObject, claim_mark: str | None, restore_asked: bool) -> Plan:
    """A Sandbox created under the name while it is hibernated (not the archived one, not its restore).

    It does not keep the archive from ending: the archive's expiry is carried out as when the name is free,
    and looked for again at its deadline (until December 7 a newcomer stopped both, and an expired archive
    kept the name - and the volumes the newcomer is refused - for good). Otherwise both are left alone and
    the newcomer is told what keeps it from its volumes (`_conflict`)."""
    if _meta(archive).get("deletionTimestamp"):
        return Nothing()  # going, its volumes with it: the newcomer then creates its own
    ended = _expiry(s, archive, claim_mark)
    if isinstance(ended, _Left):
        return Nothing(ended.seconds, conflict=_conflict(archive, restore_asked=restore_asked))
    if isinstance(ended, Nothing):  # expired and kept (`Retain`): never restored
        return Nothing(conflict=_conflict(archive, expired=True))
    return ended


def _archived_claim(claim: ReadOnlyObject | None, archive: ReadOnlyObject) -> ReadOnlyObject | None:
    """The cached claim (read by name) if it is the archived Sandbox's (same UID); None for one deleted
    and created again under the name: its expiry, and its mark, are not this archive's."""
    if claim is None:
        return None
    kept_meta = ((archive.get("spec") or {}).get("sandbox") or {}).get("metadata") or {}
    ref = controller_ref(kept_meta)
    uid = _meta(claim).get("uid")
    if ref is not None and ref.get("uid") and uid and ref.get("uid") != uid:
        return None
    return claim


def _with_archive(s: Snapshot, archive: ReadOnlyObject) -> Plan:
    spec = archive.get("spec") or {}
    archived_uid = str(spec.get("sandboxUID") or "")
    archive_uid = str(_meta(archive).get("uid") or "")
    sb = s.sandbox
    requested = lc.restore_requested(archive)
    claim = _archived_claim(s.claim, archive)
    if claim is not s.claim:
        s = replace(s, claim=claim)
    claim_marked = claim is not None and bool(_annotations(claim).get(lc.ANNOTATION_HIBERNATED_SANDBOX))
    claim_name = _meta(claim)["name"] if claim is not None else None
    claim_mark = claim_name if claim_marked else None
    if sb is not None and _meta(sb).get("uid") == archived_uid:
        return _being_archived(s, archive, sb, claim_mark)
    restored_uid = _annotations(archive).get(ANNOTATION_RESTORED_UID)
    if (
        sb is not None
        and legacy_restore(sb, archive)
        and not _meta(archive).get("deletionTimestamp")
        and isinstance(_expiry(s, archive, claim_mark), _Left)
    ):
        # The restore an older controller created and did not record (stopped by an upgrade): recorded now,
        # and given `restored-from` so that the Sandbox controller takes its volumes back (below). Only of an
        # archive not expired (nor going): an expired one ends (`_newcomer`), its volumes given to no one
        # (until December 7 the check came first, and such a Sandbox got an expired archive's volumes).
        restored_uid = str(_meta(sb).get("uid") or "")
    if sb is not None and (requested is None or not restores(sb, archive_uid, restored_uid)):
        # A newcomer: created under the name while it is hibernated, not by the restore. Until December 7
        # a restore asked for meanwhile took it for the restored one and handed it the archived volumes.
        if restored_uid:
            sb = None  # the restore's own Sandbox is gone: ended as when the name is free (`_hibernated`)
        else:
            return _newcomer(s, archive, claim_mark, requested is not None)
    if sb is None and (ended := _hibernated(s, archive, claim_mark)) is not None:
        return ended
    assert requested is not None
    cause, requested_at = requested
    if sb is None:
        create = lc.archived_sandbox(archive, cause=cause, now=s.now)
        # How the Sandbox controller tells the restore from a newcomer (`owners.restores`).
        create["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] = archive_uid
        return RestoreSteps(cause, requested_at, create, (), None, archive_uid, missing=_missing(s, archive))
    sb_uid = str(_meta(sb).get("uid") or "")
    # A restore created before `restored-from` existed (known by `restored-uid`, or by `legacy_restore`): the
    # Sandbox controller refuses it the volumes until it carries the annotation, so they are handed over by
    # us, and the annotation written (`mark`) - the Sandbox controller and `lifecycle resume` go by it.
    marked = _annotations(sb).get(ANNOTATION_RESTORED_FROM) == archive_uid
    release: list[ReadOnlyObject] = []
    handover: list[ReadOnlyObject] = []
    waiting = False
    for ch in s.children:
        if not _has_owner_uid(ch, archive_uid):
            continue
        ref = controller_ref(_meta(ch))
        if ref is not None and ref.get("uid") == sb_uid:
            release.append(ch)  # taken back: the archive's reference can go
        elif ref is None and not (marked and _sandbox_takes_back(sb, ch, s.now)):
            handover.append(ch)
        else:
            waiting = True  # the Sandbox controller adopts it (or reports why not): ours stays till then
    done = not waiting and not handover
    return RestoreSteps(
        cause,
        requested_at,
        None,
        tuple(release),
        claim_mark if done else None,
        archive_uid,
        handover=tuple(handover),
        sandbox=sb,
        waiting=waiting,
        # Recorded by the pass that created it; this one covers a pass interrupted right after the create,
        # and a restore an older controller created (`legacy_restore`).
        record_uid=None if _annotations(archive).get(ANNOTATION_RESTORED_UID) else sb_uid,
        mark=None
        if marked or _meta(sb).get("deletionTimestamp")
        else str(_meta(sb).get("resourceVersion") or ""),
    )


def _conflict(archive: ReadOnlyObject, *, restore_asked: bool = False, expired: bool = False) -> str:
    """The `HibernationConflict` note on a newcomer: what keeps the name, what it does not get, what to do.

    Deleting the newcomer to restore the hibernated Sandbox is offered only while a restore can happen: an
    archive expired and kept (`shutdownPolicy: Retain`) is never restored, only deleted (until December 7
    the note offered the restore all the same)."""
    name = str(_meta(archive).get("name") or "")
    spec = archive.get("spec") or {}
    kept = ", ".join(f"{ch.get('kind')} {ch.get('name')}" for ch in spec.get("children") or [])
    note = (
        f"a new Sandbox named {name!r} exists while it is hibernated: SandboxArchive {name!r} keeps the "
        f"hibernated Sandbox (UID {spec.get('sandboxUID') or '?'})"
        + (f" and its {kept}, which this Sandbox does not get" if kept else "")
    )
    if expired:
        return note + (
            "; the hibernated Sandbox has expired (shutdownPolicy Retain): it is never restored; delete the "
            f"archive (kubectl delete sandboxarchive {name}; its volumes go with it) for this Sandbox to get "
            "new ones"
        )
    note += (
        f"; delete this Sandbox to restore the hibernated one (agent-sandbox lifecycle resume {name}), or "
        f"delete the archive (kubectl delete sandboxarchive {name}; its volumes go with it) to keep this one"
    )
    return note + ("; the restore asked for waits until this Sandbox is deleted" if restore_asked else "")


def _missing(s: Snapshot, archive: ReadOnlyObject) -> tuple[str, ...]:
    """The archived PVCs that are gone (deleted while hibernated): the restored Sandbox gets new, empty ones
    in their place (the Sandbox controller creates what is missing). Reported, not refused (docs/lifecycle.md
    "Deep hibernation"): the data is gone either way, and a router's restore on request must not hang."""
    found = {(str(ch.get("kind")), str(_meta(ch).get("name"))) for ch in s.children}
    return tuple(
        str(ch.get("name"))
        for ch in (archive.get("spec") or {}).get("children") or []
        if ch.get("kind") == "PersistentVolumeClaim"
        and (str(ch.get("kind")), str(ch.get("name"))) not in found
    )
