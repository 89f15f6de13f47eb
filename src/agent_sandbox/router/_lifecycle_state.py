"""What a lifecycle router knows about Sandboxes (`--sandbox-lifecycle`, docs/lifecycle.md).

Owns three informers, each keeping only what the router reads (a few hundred bytes per object):

- Sandboxes: operatingMode, shutdownTime, generation, resourceVersion, being deleted, our
  `lifecycle.agents.x-k8s.io/*` annotations and the template reference, whether it is an unclaimed warm-pool
  member (its `agents.x-k8s.io/warm-pool-sandbox` label), and why a resumed Sandbox cannot
  start (a PodScheduled=False `Unschedulable`, a Ready=False `ReconcilerError` such as a quota refusal, or
  `SandboxExpired`) for its current generation;
- SandboxTemplates: our annotations (template-level settings);
- SandboxArchives: our annotations of the archived Sandbox, its template, its shutdownTime, and whether a
  restore was asked.

Views are rebuilt on every event, so a request pays a dict lookup; `wait_changed` wakes waiters on any
change (a request held for a resume watches the Sandbox's conditions through it).

Failure modes: the informers must sync within the router's 60 s start-up bound; the archive kind only exists
with the lifecycle component installed, hence `SYNC_ERROR` names both the CRD and the grant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import constants as c
from ..api import lifecycle as lc
from ..api.meta import parse_time
from ..kube import SANDBOX, SANDBOX_TEMPLATE, HandlerFuncs, Informer, ListWatcher, Object
from ._changes import Changes

__all__ = ["SYNC_ERROR", "ArchiveView", "LifecycleState", "SandboxView"]

SYNC_ERROR = (
    "sandbox lifecycle state failed initial sync (is the SandboxArchive CRD installed (k8s/lifecycle)? "
    "check RBAC: k8s/router/lifecycle grants get/list/watch on sandboxes, sandboxtemplates, sandboxarchives)"
)
_OURS = f"{lc.LIFECYCLE_GROUP}/"


def _ours(annotations: Mapping[str, Any] | None) -> dict[str, str]:
    out = {k: str(v) for k, v in (annotations or {}).items() if k.startswith(_OURS)}
    ref = (annotations or {}).get(c.ANNOTATION_SANDBOX_TEMPLATE_REF)
    if ref:
        out[c.ANNOTATION_SANDBOX_TEMPLATE_REF] = str(ref)
    return out


def _diet_sandbox(obj: Object) -> Object:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp")
    pool = (meta.get("labels") or {}).get(c.LABEL_WARM_POOL_SANDBOX)
    return {
        "metadata": {
            **{k: meta[k] for k in keep if k in meta},
            "annotations": _ours(meta.get("annotations")),
            **({"labels": {c.LABEL_WARM_POOL_SANDBOX: pool}} if pool is not None else {}),
        },
        "spec": {
            "operatingMode": (obj.get("spec") or {}).get("operatingMode"),
            "shutdownTime": (obj.get("spec") or {}).get("shutdownTime"),
        },
        "status": {
            "conditions": [
                cond
                for cond in status.get("conditions") or []
                if cond.get("type") in (c.CONDITION_READY, c.CONDITION_POD_SCHEDULED)
            ]
        },
    }


def _diet_template(obj: Object) -> Object:
    meta = obj.get("metadata") or {}
    keep = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {"metadata": {**keep, "annotations": _ours(meta.get("annotations"))}}


def _diet_archive(obj: Object) -> Object:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    kept = ((spec.get("sandbox") or {}).get("metadata") or {}).get("annotations")
    shutdown = ((spec.get("sandbox") or {}).get("spec") or {}).get("shutdownTime")
    keep = {
        k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp") if k in meta
    }
    recorded = (meta.get("annotations") or {}).get(lc.ANNOTATION_TEMPLATE_AUTO_RESUME)
    if recorded is not None:
        keep["annotations"] = {lc.ANNOTATION_TEMPLATE_AUTO_RESUME: recorded}
    return {
        "metadata": keep,
        "spec": {
            "sandbox": {"metadata": {"annotations": _ours(kept)}, "spec": {"shutdownTime": shutdown}},
            "restore": spec.get("restore"),
        },
    }


@dataclass(frozen=True, slots=True)
class SandboxView:
    """One Sandbox as the router needs it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    generation: int
    suspended: bool
    deleting: bool
    annotations: Mapping[str, str]
    last_activity: float | None
    """`last-activity` as epoch seconds."""
    blocker: str
    """Why the current generation cannot start ("" when nothing says so)."""
    ready: bool = False
    """The controller reports the current generation Ready (it has a Ready pod for this spec)."""
    shutdown_time: float | None = None
    """`spec.shutdownTime` as epoch seconds: past it, the Sandbox is expired and never resumed."""
    unclaimed_pool_member: bool = False
    """It carries `agents.x-k8s.io/warm-pool-sandbox`: a warm-pool member no claim has taken yet (the claim's
    takeover removes the label before the claim is Ready). The same test as the resolver's `ClaimedCheck`."""

    @property
    def template(self) -> str | None:
        return self.annotations.get(c.ANNOTATION_SANDBOX_TEMPLATE_REF)


@dataclass(frozen=True, slots=True)
class ArchiveView:
    """One SandboxArchive as the router needs it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    annotations: Mapping[str, str]
    restore_requested: bool
    deleting: bool
    shutdown_time: float | None = None
    """The archived Sandbox's `spec.shutdownTime` as epoch seconds: past it, it is never restored."""
    template_auto_resume: str | None = None
    """Its template's `auto-resume` when it was archived (`lc.ANNOTATION_TEMPLATE_AUTO_RESUME`): applies once
    the template is gone."""

    @property
    def template(self) -> str | None:
        return self.annotations.get(c.ANNOTATION_SANDBOX_TEMPLATE_REF)


def _ready(obj: Object, generation: int) -> bool:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == c.CONDITION_READY:
            return bool(cond.get("status") == "True" and cond.get("observedGeneration") in (None, generation))
    return False


# A write that lost an optimistic-concurrency race (409 Conflict, apiserver's wording): the Sandbox controller
# reports it as a ReconcilerError and retries on its next pass, so it is no reason to give up on a resume.
# Until December 6 a restore's PVC hand-over raced this way and the held request got an immediate 503.
_TRANSIENT = ("the object has been modified", "Operation cannot be fulfilled")


def _blocker(obj: Object, generation: int) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("observedGeneration") not in (None, generation):
            continue
        kind, status, reason = cond.get("type"), cond.get("status"), cond.get("reason") or ""
        message = str(cond.get("message") or "")
        if kind == c.CONDITION_POD_SCHEDULED and status == "False" and reason == "Unschedulable":
            return f"{reason}: {message}".rstrip(": ")
        if kind == c.CONDITION_READY and status == "False" and reason == c.REASON_SANDBOX_EXPIRED:
            return f"{reason}: {message}".rstrip(": ")
        if kind == c.CONDITION_READY and status == "False" and reason == c.REASON_RECONCILER_ERROR:
            if any(marker in message for marker in _TRANSIENT):
                continue
            return f"{reason}: {message}".rstrip(": ")
    return ""


def _epoch(value: Any) -> float | None:
    when = parse_time(value)
    return when.timestamp() if when is not None else None


def sandbox_view(obj: Object) -> SandboxView:
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    generation = int(meta.get("generation") or 0)
    activity = parse_time(annotations.get(lc.ANNOTATION_LAST_ACTIVITY))
    return SandboxView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        generation=generation,
        suspended=(obj.get("spec") or {}).get("operatingMode") == c.OperatingMode.SUSPENDED,
        deleting=bool(meta.get("deletionTimestamp")),
        annotations=annotations,
        last_activity=activity.timestamp() if activity else None,
        blocker=_blocker(obj, generation),
        ready=_ready(obj, generation),
        shutdown_time=_epoch((obj.get("spec") or {}).get("shutdownTime")),
        unclaimed_pool_member=c.LABEL_WARM_POOL_SANDBOX in (meta.get("labels") or {}),
    )


def archive_view(obj: Object) -> ArchiveView:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return ArchiveView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        annotations=((spec.get("sandbox") or {}).get("metadata") or {}).get("annotations") or {},
        restore_requested=bool(spec.get("restore")),
        deleting=bool(meta.get("deletionTimestamp")),
        shutdown_time=_epoch(((spec.get("sandbox") or {}).get("spec") or {}).get("shutdownTime")),
        template_auto_resume=(meta.get("annotations") or {}).get(lc.ANNOTATION_TEMPLATE_AUTO_RESUME),
    )


class LifecycleState:
    """Sandboxes, templates and archives, as views; run with `await state.run()`."""

    def __init__(self, lw: ListWatcher, *, namespace: str | None = None) -> None:
        self.sandboxes: dict[tuple[str, str], SandboxView] = {}
        self.archives: dict[tuple[str, str], ArchiveView] = {}
        self.templates: dict[tuple[str, str], Mapping[str, str]] = {}
        self._changes = Changes()
        ns = namespace or None
        self._informers = [
            self._informer(lw, SANDBOX, ns, _diet_sandbox, self.sandboxes, sandbox_view),
            self._informer(lw, SANDBOX_TEMPLATE, ns, _diet_template, self.templates, _template_annotations),
            self._informer(lw, lc.ARCHIVE, ns, _diet_archive, self.archives, archive_view),
        ]

    def _informer(
        self, lw: ListWatcher, kind: Any, ns: str | None, diet: Any, into: dict[Any, Any], view: Any
    ) -> Informer:
        informer = Informer(lw, kind, namespace=ns, transform=diet)

        def upsert(obj: Object) -> None:
            meta = obj["metadata"]
            into[(meta.get("namespace", ""), meta["name"])] = view(obj)
            self._changes.notify()

        def delete(obj: Object) -> None:
            meta = obj["metadata"]
            into.pop((meta.get("namespace", ""), meta["name"]), None)
            self._changes.notify()

        informer.add_handler(HandlerFuncs(add=upsert, update=lambda _old, new: upsert(new), delete=delete))
        return informer

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in self._informers:
                tg.create_task(informer.run())

    async def wait_synced(self) -> None:
        for informer in self._informers:
            await informer.wait_for_sync()

    async def wait_changed(self) -> None:
        """Return at the next change of any view (bound it with `asyncio.timeout`)."""
        await self._changes.wait()

    def policy(self, namespace: str, own: Mapping[str, str], template: str | None) -> lc.LifecyclePolicy:
        """The effective settings of a Sandbox (or archive) in `namespace`: its own, else its template's."""
        inherited = self.templates.get((namespace, template)) if template else None
        return lc.lifecycle_policy(own, inherited)

    def archive_policy(self, archive: ArchiveView) -> lc.LifecyclePolicy:
        """The effective settings of a hibernated Sandbox: its own, else its template's as it is now, else
        (the template deleted meanwhile) the template's `auto-resume` recorded when it was archived."""
        key = (archive.namespace, archive.template or "")
        template = self.templates.get(key) if archive.template else None
        inherited = lc.archived_template_settings(template, archive.template_auto_resume)
        return lc.lifecycle_policy(archive.annotations, inherited)


def _template_annotations(obj: Object) -> Mapping[str, str]:
    annotations: Mapping[str, str] = (obj.get("metadata") or {}).get("annotations") or {}
    return annotations
