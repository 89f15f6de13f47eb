"""Owner-reference patches on a hibernated Sandbox's children (PVCs, Service): the archive's hold, and its
handing back to the restored Sandbox (docs/design/lifecycle-archive.md "Mechanics"). Pure.

Every patch carries the child's resourceVersion: a concurrent writer (the Sandbox controller adopting the
same child) makes one of the two fail (409) instead of one silently undoing the other.

Which Sandbox a held child goes back to: only the archive's restore, told by `ANNOTATION_RESTORED_FROM`
(written on the Sandbox the lifecycle controller creates) or by the archive's `restored-uid`. The Sandbox
controller (`controllers/sandbox/children.py`), the lifecycle controller and `agent-sandbox lifecycle
resume` all go by `archive_hold` and `restores`. Any other Sandbox of the name (created by a user while the
name is hibernated) is a newcomer: never given the archived data (until December 7 the Sandbox controller
adopted the PVC for it, as any unowned PVC carrying its tracking label, and its Pod mounted the data).

A restore created by a controller from before `restored-from` and stopped (an upgrade) before it recorded
`restored-uid` carries neither marker: `legacy_restore` knows it by what that controller wrote on it (and
clients do not), and the lifecycle controller then records its UID and writes `restored-from` on it, after
which it is told as any restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import ReadOnlyObject, new_controller_ref, parse_time

__all__ = [
    "ANNOTATION_RESTORED_FROM",
    "LEGACY_RESTORE_AFTER",
    "LEGACY_RESTORE_SLACK",
    "adopt_child_patch",
    "archive_hold",
    "archive_owner_ref",
    "handover_child_patch",
    "legacy_restore",
    "release_child_patch",
    "restores",
]

ANNOTATION_RESTORED_FROM = f"{lc.LIFECYCLE_GROUP}/restored-from"
"""On a Sandbox a restore created: the UID of the SandboxArchive it was restored from. The Sandbox
controller adopts a child that archive holds for this Sandbox only; it stays on the Sandbox afterwards
(a record, as `resumed-at`; a later hibernation's archive has another UID, and the restore writes it anew)."""


def _meta(obj: ReadOnlyObject) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def archive_owner_ref(archive: ReadOnlyObject) -> dict[str, Any]:
    """The owner reference the archive puts on the children it keeps (not a controller reference)."""
    return {
        "apiVersion": lc.ARCHIVE.api_version,
        "kind": lc.ARCHIVE.kind,
        "name": _meta(archive)["name"],
        "uid": _meta(archive).get("uid", ""),
        "controller": False,
        "blockOwnerDeletion": False,
    }


def adopt_child_patch(child: ReadOnlyObject, archive: ReadOnlyObject) -> dict[str, Any]:
    """Merge patch adding the archive's (non-controller) owner reference to a child."""
    refs = [dict(r) for r in _meta(child).get("ownerReferences") or []]
    refs.append(archive_owner_ref(archive))
    return {"metadata": {"resourceVersion": _meta(child).get("resourceVersion"), "ownerReferences": refs}}


def handover_child_patch(child: ReadOnlyObject, sandbox: ReadOnlyObject, archive_uid: str) -> dict[str, Any]:
    """Merge patch giving a child the archive keeps to the restored Sandbox (its controller reference, as
    the Sandbox controller's adoption writes it) and dropping the archive's, in one guarded write."""
    refs = [
        dict(r)
        for r in _meta(child).get("ownerReferences") or []
        if r.get("uid") != archive_uid and not r.get("controller")
    ]
    meta = _meta(sandbox)
    refs.append(
        new_controller_ref(
            api_version=c.SANDBOX_API_VERSION, kind=c.KIND_SANDBOX, name=meta["name"], uid=meta.get("uid", "")
        )
    )
    return {"metadata": {"resourceVersion": _meta(child).get("resourceVersion"), "ownerReferences": refs}}


def release_child_patch(child: ReadOnlyObject, archive_uid: str) -> dict[str, Any]:
    """Merge patch removing the archive's owner reference from a child (the restored Sandbox adopts it)."""
    refs = [dict(r) for r in _meta(child).get("ownerReferences") or [] if r.get("uid") != archive_uid]
    return {
        "metadata": {"resourceVersion": _meta(child).get("resourceVersion"), "ownerReferences": refs or None}
    }


def archive_hold(child: ReadOnlyObject) -> Mapping[str, Any] | None:
    """The owner reference of the SandboxArchive keeping `child` (a hibernated Sandbox's PVC or Service),
    if any (`archive_owner_ref`: kind and API group compared, the version not)."""
    for ref in _meta(child).get("ownerReferences") or []:
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if ref.get("kind") == lc.ARCHIVE.kind and group == lc.ARCHIVE.group:
            held: Mapping[str, Any] = ref
            return held
    return None


def restores(sandbox: ReadOnlyObject, archive_uid: str, restored_uid: str | None = None) -> bool:
    """Whether `sandbox` is the restore of the archive `archive_uid`: it carries `ANNOTATION_RESTORED_FROM`
    with that UID, or it is the Sandbox the archive's `restored-uid` names (`restored_uid`: a restore
    created by a controller from before the annotation). Anything else of the name is a newcomer."""
    meta = _meta(sandbox)
    if archive_uid and (meta.get("annotations") or {}).get(ANNOTATION_RESTORED_FROM) == archive_uid:
        return True
    return bool(restored_uid) and meta.get("uid") == restored_uid


LEGACY_RESTORE_SLACK = 60.0
"""Seconds of clock difference `legacy_restore` allows between the times it compares: the restore request's
(the requester's clock) before the restored Sandbox's `resumed-at` (the controller's), and that stamp before
the Sandbox's `creationTimestamp` (the API server's, whole seconds; the create may be slow)."""

LEGACY_RESTORE_AFTER = 2.0
"""Seconds `legacy_restore` allows `resumed-at` to be after `creationTimestamp`: the older controller stamped
it before its create, so only the API server's whole seconds (under 1 s) and clocks a little apart put it
after. A client's resume of a Sandbox (the SDK's, a router's) stamps it later than that."""


def legacy_restore(sandbox: ReadOnlyObject, archive: ReadOnlyObject) -> bool:
    """Whether `sandbox`, which carries no `restored-from`, is the restore of `archive` that a controller from
    before that annotation created and did not get to record (`restored-uid`) before it was stopped.

    Told by what that controller wrote and clients do not: a restore is asked of the archive and none
    recorded; the Sandbox is not the archived one; it is `lc.archived_sandbox(archive)` - the archived spec
    (apart from `operatingMode`) and labels, `resume-reason` the request's cause, `last-activity` the very
    stamp of `resumed-at` - and that stamp is from just before its creation (`LEGACY_RESTORE_AFTER`,
    `LEGACY_RESTORE_SLACK`) and not before the request (or, without a request time, the archiving).

    Clients write `resume-reason` and `resumed-at` too (the Python SDK's `resume()` on a Sandbox in any
    mode, with no `last-activity`; a router's resume of a Suspended one, with it): until December 7 those
    alone were compared, and a newcomer resumed within a minute of its creation while a restore was asked
    (the controller down) was taken for the restore and handed the archived volumes. A newcomer copied from
    the hibernated Sandbox carries that Sandbox's stamps, older than the archive. Missed (a false negative:
    a restore whose `last-activity` a router moved on before the upgraded controller saw it), the restore
    is treated as a newcomer: deleting it and resuming again restores (docs/lifecycle.md). Until December 7
    every such restore was taken for a newcomer after an upgrade.
    """
    meta = _meta(sandbox)
    annotations = meta.get("annotations") or {}
    archive_meta = _meta(archive)
    requested = lc.restore_requested(archive)
    spec = archive.get("spec") or {}
    if (
        requested is None
        or (archive_meta.get("annotations") or {}).get(lc.ANNOTATION_RESTORED_UID)
        or ANNOTATION_RESTORED_FROM in annotations
        or not meta.get("uid")
        or meta.get("uid") == spec.get("sandboxUID")
    ):
        return False
    cause, requested_at = requested
    stamp = annotations.get(lc.ANNOTATION_RESUMED_AT)
    if annotations.get(lc.ANNOTATION_RESUME_REASON) != str(cause) or not stamp:
        return False
    if annotations.get(lc.ANNOTATION_LAST_ACTIVITY) != stamp:
        return False
    kept = spec.get("sandbox") or {}
    if dict((kept.get("metadata") or {}).get("labels") or {}) != dict(meta.get("labels") or {}):
        return False
    if _without_mode(kept.get("spec")) != _without_mode(sandbox.get("spec")):
        return False
    resumed = parse_time(stamp)
    created = parse_time(meta.get("creationTimestamp"))
    since = requested_at or parse_time(spec.get("archivedAt"))
    if resumed is None or created is None or since is None:
        return False
    after_creation = (resumed - created).total_seconds()
    return (
        -LEGACY_RESTORE_SLACK <= after_creation <= LEGACY_RESTORE_AFTER
        and (resumed - since).total_seconds() >= -LEGACY_RESTORE_SLACK
    )


def _without_mode(spec: Any) -> dict[str, Any]:
    """A Sandbox spec without `operatingMode` (the restore is created Running; a lifecycle write may change
    it since)."""
    return {k: v for k, v in (spec or {}).items() if k != "operatingMode"}
