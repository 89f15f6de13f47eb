"""The lifecycle controller's inputs and decisions (ours, docs/lifecycle.md): what one pass observed
(`Snapshot`, the runtime's `RuntimeActivity`) and the `Plan` `decide.decide` returns - one typed step each,
carried out by the reconciler. Plain data; the table of which plan when is in `decide.py`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import ReadOnlyObject

__all__ = [
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
]


@dataclass(frozen=True, slots=True)
class RuntimeActivity:
    """What the sandbox's runtime said (`GET /v1/activity`), or that it could not be asked."""

    reachable: bool
    idle_seconds: float = 0.0
    running_commands: int = 0
    inflight_requests: int = 0

    @property
    def busy(self) -> bool:
        return self.running_commands > 0 or self.inflight_requests > 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one pass observed (cache reads, plus the runtime's answer when asked)."""

    now: datetime
    sandbox: ReadOnlyObject | None = None
    archive: ReadOnlyObject | None = None
    template_annotations: Mapping[str, str] | None = None
    """The annotations of the Sandbox's (or archived Sandbox's) SandboxTemplate, if any."""
    claim: ReadOnlyObject | None = None
    """The SandboxClaim controlling the Sandbox (or named by the archive), if cached."""
    children: tuple[ReadOnlyObject, ...] = ()
    """The Sandbox's PVCs and Service (cached), or the archive's while hibernated."""
    activity: RuntimeActivity | None = None
    probe_enabled: bool = True


@dataclass(frozen=True, slots=True)
class Nothing:
    """Nothing to do now; look again after `requeue_after` seconds (None: only on events)."""

    requeue_after: float | None = None
    problems: tuple[str, ...] = ()
    conflict: str = ""
    """An archived name taken by a new Sandbox (reported once as an Event)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask the runtime at `ip` for its activity, then decide again."""

    ip: str


@dataclass(frozen=True, slots=True)
class Suspend:
    """Suspend the Sandbox (guarded by `resource_version`)."""

    cause: lc.Cause
    resource_version: str
    idle_for: float | None = None


@dataclass(frozen=True, slots=True)
class DropHibernate:
    """Remove a `hibernate` request from an unclaimed warm-pool member (guarded by `resource_version`)."""

    resource_version: str


@dataclass(frozen=True, slots=True)
class ArchiveSteps:
    """Archive a suspended Sandbox, in order; each step is skipped when already done."""

    cause: lc.Cause
    archive: dict[str, Any] | None
    """The archive to create (None: it exists)."""
    children: tuple[ReadOnlyObject, ...]
    """Children still to be handed to the archive (owner reference added)."""
    claim_name: str | None
    """Claim to mark `hibernated-sandbox` (None: no claim, or already marked)."""
    delete_uid: str
    """The Sandbox UID to delete with propagation Orphan."""
    resource_version: str = ""
    """The Sandbox's resourceVersion decided on: the delete is guarded by it too, so a resume that lands
    between the archive's creation and the delete makes the delete fail (409) and the pass decide again.
    Until December 6 only the UID guarded it: the resumed Sandbox was deleted, its new Pod orphaned."""
    refresh: dict[str, Any] | None = None
    """The Sandbox changed since the archive copied it (`ANNOTATION_ARCHIVED_VERSION` differs from
    `resource_version`, and so does the copy: an edit that is no resume, such as a later `shutdownTime`):
    the archive's new `spec.sandbox`, written (guarded by the archive's resourceVersion) before the delete.
    Until December 6 the old copy was kept and the edit lost."""


@dataclass(frozen=True, slots=True)
class AbandonArchive:
    """The archived Sandbox was resumed before its archiving finished: the resume wins. Drop the archive's
    owner reference from `children`, unmark the claim, delete the archive (UID precondition); with
    `resume_resource_version`, first resume the Sandbox (a restore was asked of the archive meanwhile).

    Carried out only once an uncached read shows the Sandbox `sandbox_uid` still there and not being
    deleted: the Sandbox informer may lag behind the PVCs', and giving the archive up after the Sandbox's
    (Orphan) deletion went through would leave its volumes with no owner at all."""

    archive_uid: str
    children: tuple[ReadOnlyObject, ...]
    claim_name: str | None
    resume_resource_version: str | None = None
    handover: tuple[ReadOnlyObject, ...] = ()
    """Children the archive alone holds (the Sandbox's controller reference gone or never there): given to
    the Sandbox in one patch, never released to no owner."""
    sandbox_uid: str = ""


@dataclass(frozen=True, slots=True)
class RestoreSteps:
    """Restore an archived Sandbox, in order; each step is skipped when already done.

    With `create`, that is the whole pass (the next one, on the new Sandbox's events, goes on). The claim is
    unmarked and the archive deleted only when `waiting` is False: no child is held by the archive any more.
    """

    cause: lc.Cause
    requested_at: datetime | None
    create: dict[str, Any] | None
    """The Sandbox to create (None: it exists)."""
    children: tuple[ReadOnlyObject, ...]
    """Children the restored Sandbox controls, whose archive owner reference is to be removed (once an
    uncached read confirms the Sandbox is still there: docs/design/lifecycle-archive.md)."""
    claim_name: str | None
    """Claim whose `hibernated-sandbox` mark is to be removed."""
    archive_uid: str
    handover: tuple[ReadOnlyObject, ...] = ()
    """Children the Sandbox controller will not take back: given to the restored Sandbox by us."""
    sandbox: ReadOnlyObject | None = None
    """The restored Sandbox (for `handover`)."""
    waiting: bool = False
    """Some child is still to be taken back by the Sandbox controller: look again in `RESTORE_POLL`."""
    record_uid: str | None = None
    """The restored Sandbox's UID, to record on the archive (`restored-uid`; None: recorded already)."""
    missing: tuple[str, ...] = ()
    """With `create`: names of the archived PVCs the cache does not have (deleted while hibernated). Those an
    uncached read confirms gone are reported (`RestoreVolumeMissing` Event on the restored Sandbox): it gets
    new, empty ones. Until December 7 nothing said so."""
    mark: str | None = None
    """The restored Sandbox's resourceVersion when it lacks `restored-from` (a restore an older controller
    created): the annotation is written on it (guarded by that resourceVersion: the Sandbox decided on, not
    a newcomer that replaced it), so the Sandbox controller and `lifecycle resume` know it as the restore.
    None: it carries it."""


@dataclass(frozen=True, slots=True)
class ExpireArchive:
    """Unmark the claim, then delete the archive (the volumes it alone keeps go with it, as with the
    Sandbox): the hibernated Sandbox's `shutdownTime` passed with `shutdownPolicy: Delete`, its claim
    expired, or the Sandbox its restore created was deleted (`why`)."""

    archive_uid: str
    claim_name: str | None
    why: str = "SandboxExpired"
    """`SandboxExpired`, `ClaimExpired` or `RestoredSandboxDeleted` (logs; the last is confirmed by an
    uncached read before the delete: the Sandbox informer may lag behind the archive's)."""
    restored_uid: str = ""
    """For `RestoredSandboxDeleted`: the restored Sandbox's UID (`restored-uid`). The uncached read holds the
    delete back only while that Sandbox (or one `restored-from` the archive) exists, not for a newcomer."""


@dataclass(frozen=True, slots=True)
class MarkArchiveExpired:
    """An expired hibernated Sandbox with `shutdownPolicy: Retain`: record `expired-at` on its archive."""

    archive_uid: str


Plan: TypeAlias = (
    Nothing
    | Probe
    | Suspend
    | DropHibernate
    | ArchiveSteps
    | AbandonArchive
    | RestoreSteps
    | ExpireArchive
    | MarkArchiveExpired
)
