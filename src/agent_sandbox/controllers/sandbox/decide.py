"""The Sandbox controller's decisions: `decide(snapshot, now) -> Plan` (controllers spec §1.2-§1.10).

Pure: no await, no clock, no client. Everything a pass needs to know arrives in the `Snapshot`; everything it
wants done leaves as typed actions in the `Plan`. The branch structure mirrors upstream's Reconcile:

* being deleted -> nothing (children go through garbage collection, §1.13);
* expired (`now >= shutdownTime`) -> pass 1 marks Ready=SandboxExpired, pass 2 tears down (§1.10);
* our own creations not yet in the cache -> wait for their watch events (expectations; see `reconciler`);
* otherwise child reconciliation: PVCs (§1.4), then the Pod (§1.5-§1.7), then the Service (§1.8).

How status follows from the plan and from what actually happened is `conclude` (in `status`), also pure.
`plan_existing_pod` is public because the executor needs it when a create hits AlreadyExists (§1.5.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agent_sandbox.api.constants import (
    ANNOTATION_POD_NAME,
    ANNOTATION_TRACE_CONTEXT,
    CONDITION_READY,
    EVENT_MULTIPLE_PODS,
    LABEL_SANDBOX_NAME_HASH,
    REASON_MULTIPLE_PODS,
    REASON_SANDBOX_EXPIRED,
    OperatingMode,
    ShutdownPolicy,
)
from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV
from agent_sandbox.api.meta import (
    Ownership,
    classify_ownership,
    parse_time,
    reset_managed_fields,
    server_side_applied,
    status_condition,
)
from agent_sandbox.api.naming import name_hash
from agent_sandbox.kube import POD, PVC, SERVICE, Object, create_merge_patch

from .children import (
    adoption_allowed,
    adoption_refusal,
    archive_refusal,
    build_pod,
    build_pvc,
    build_service,
    foreign_owner_error,
    owned_by_predecessor,
    owner_refs_with_controller,
    pvc_name,
    repair_pod_metadata,
    service_ports,
    service_ports_equal,
)
from .plan import (
    Action,
    CreateObject,
    DeleteObject,
    DeleteSandbox,
    EmitEvent,
    PatchObject,
    PatchSandboxMetadata,
    Plan,
    PlanMode,
    PodPlan,
    ServiceFields,
    ServicePlan,
    Snapshot,
    StepPlan,
)

__all__ = [
    "ARCHIVE_RETRY",
    "EXPIRY_REQUEUE",
    "MIN_EXPIRY_REQUEUE",
    "check_expiry",
    "decide",
    "deferral",
    "multiple_pods_message",
    "plan_existing_pod",
    "shutdown_time",
]

EXPIRY_REQUEUE = 0.001
"""Requeue delay after marking a Sandbox expired (upstream `immediateRequeueDelay`, 1 ms)."""
MIN_EXPIRY_REQUEUE = 2.0
"""Floor of the requeue while waiting for `shutdownTime` (§1.10)."""
ARCHIVE_RETRY = 30.0
"""Seconds between passes of a Sandbox refused a hibernated Sandbox's PVC or Service (ours:
`children.archive_refusal`). What ends the refusal - the archive deleted (by a user, its expiry), then the
child collected - is no event this controller watches (PVCs are not watched; a Service the archive alone
holds maps to no Sandbox): with the error backoff, the Sandbox waited up to 1000 s for its new volumes
(until December 7)."""


# --------------------------------------------------------------------------- small pure helpers


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    ann: Mapping[str, str] = _meta(obj).get("annotations") or {}
    return ann


def shutdown_time(sandbox: Object) -> datetime | None:
    """`spec.shutdownTime` as an aware datetime, or None.

    `parse_time`, as every other reader of the field (claims, the lifecycle controller, the router, the CLI):
    the CRD's date-time format admits a lowercase `z` and Go's nine fraction digits, which
    `datetime.fromisoformat` refuses - until December 6 such a Sandbox failed every pass (no Pod, no status).
    """
    return parse_time((sandbox.get("spec") or {}).get("shutdownTime"))


def check_expiry(deadline: datetime | None, now: datetime) -> tuple[bool, float | None]:
    """§1.10 timing: (expired, requeue_after). Exactly `now` counts as expired; the wait is >= 2 s."""
    if deadline is None:
        return False, None
    if now >= deadline:
        return True, None
    return False, max((deadline - now).total_seconds(), MIN_EXPIRY_REQUEUE)


def multiple_pods_message(count: int) -> str:
    """Text of the multiple-owned-Pods invariant violation (§1.5 step 5)."""
    return f"multiple Pods ({count}) are controlled by this Sandbox; refusing to choose or create a Pod"


def deferral(window: float, since: datetime | None, now: datetime) -> float | None:
    """§1.12 write site: seconds to keep deferring the Pod metadata patch, or None to write now.

    The window never re-arms: the first observation time is kept until the write happens.
    """
    if window <= 0:
        return None
    if since is None:
        return window
    remaining = window - (now - since).total_seconds()
    return remaining if remaining > 0 else None


def _owned(obj: Object, uid: str) -> bool:
    return classify_ownership(_meta(obj), uid) is Ownership.OWNED


def _deleting(pod: Object, snapshot: Snapshot) -> bool:
    meta = _meta(pod)
    return bool(meta.get("deletionTimestamp")) or meta.get("uid", "") in snapshot.deleting_pod_uids


def _sandbox_annotation_patch(value: str | None) -> Object:
    return {"metadata": {"annotations": {ANNOTATION_POD_NAME: value}}}


def _remove_pod_name(*, keeps_pod: bool = False) -> PatchSandboxMetadata:
    return PatchSandboxMetadata(
        patch=_sandbox_annotation_patch(None), what="failed to clear pod name annotation", keeps_pod=keeps_pod
    )


def _ensure_pod_name(sandbox: Object, current: str, pod_name: str) -> list[Action]:
    """§1.5.2: set the annotation only when it is empty; a different non-empty value is left alone.

    Unless someone server-side applied the Sandbox, the same patch drops its `managedFields`: nothing reads
    entries of plain creates and patches, and with none kube-apiserver tracks no further updates until an
    apply (docs/design/managed-fields.md). The Sandbox cache keeps the entries of applied Sandboxes only
    (`api.meta.drop_unapplied_managed_fields`, set up by `watches.setup`), which is what this reads.
    """
    if current:
        return []
    patch = _sandbox_annotation_patch(pod_name)
    if not server_side_applied(sandbox):
        reset_managed_fields(patch["metadata"])
    return [PatchSandboxMetadata(patch=patch, what="failed to set pod name annotation")]


# --------------------------------------------------------------------------- PVCs (§1.4)


def _plan_pvcs(snapshot: Snapshot, hash_: str) -> StepPlan:
    sandbox = snapshot.sandbox
    name, uid = _meta(sandbox)["name"], _meta(sandbox).get("uid", "")
    actions: list[Action] = []
    for template in (sandbox.get("spec") or {}).get("volumeClaimTemplates") or ():
        claim = pvc_name(template, name)
        pvc = snapshot.pvcs.get(claim)
        if pvc is None:
            actions.append(
                CreateObject(kind=PVC, obj=build_pvc(template, sandbox, hash_), what="failed to create PVC")
            )
            continue
        ownership = classify_ownership(_meta(pvc), uid)
        if ownership is Ownership.OWNED:
            continue
        if ownership is Ownership.FOREIGN:
            return StepPlan(
                tuple(actions), foreign_owner_error("PVC", pvc, name), waiting=owned_by_predecessor(pvc, name)
            )
        if (held := archive_refusal("PVC", pvc, sandbox)) is not None:
            # A hibernated Sandbox's volume (ours: `archive_refusal`), retried at `ARCHIVE_RETRY`.
            return StepPlan(tuple(actions), held, retry_after=ARCHIVE_RETRY)
        if not adoption_allowed(pvc, hash_):
            return StepPlan(tuple(actions), adoption_refusal("PVC", claim))
        # resourceVersion makes the adoption optimistic: never overwrite an owner set concurrently.
        patch = {
            "metadata": {
                "ownerReferences": owner_refs_with_controller(pvc, sandbox),
                "resourceVersion": _meta(pvc).get("resourceVersion"),
            }
        }
        actions.append(
            PatchObject(kind=PVC, name=claim, patch=patch, what="failed to patch PVC with owner reference")
        )
    return StepPlan(tuple(actions))


# --------------------------------------------------------------------------- Pod (§1.5-§1.7)


def _plan_suspend(
    pod: Object | None, uid: str, actions: list[Action], annotated: bool, snapshot: Snapshot
) -> PodPlan:
    """§1.7: delete an owned Pod (reporting it until it is gone); never touch anyone else's Pod."""
    if pod is not None and _owned(pod, uid):
        if not _deleting(pod, snapshot):
            meta = _meta(pod)
            actions.append(
                DeleteObject(
                    kind=POD,
                    name=meta["name"],
                    uid=meta.get("uid", ""),
                    what="failed to delete pod",
                    keeps_pod=True,
                )
            )
        return PodPlan(tuple(actions), pod=pod, owned=True)
    if annotated:
        actions.append(_remove_pod_name(keeps_pod=True))
    return PodPlan(tuple(actions), pod=pod, owned=False)


def plan_existing_pod(
    snapshot: Snapshot,
    pod: Object,
    now: datetime,
    *,
    annotated: bool = False,
    current_annotation: str = "",
    prior: tuple[Action, ...] = (),
) -> PodPlan:
    """§1.6: adopt (if authorised) or repair an existing Pod, then ensure the pod-name annotation.

    Args:
        snapshot: the pass's snapshot.
        pod: the existing Pod (cached, or just read after a create returned AlreadyExists).
        now: decision time (write-behind arithmetic).
        annotated: whether the pod-name annotation key is present once earlier actions of the step ran.
        current_annotation: its value then ("" when absent or empty).
        prior: actions of the step that precede this part (resolution's annotation repairs).
    """
    sandbox = snapshot.sandbox
    sb_name, uid = _meta(sandbox)["name"], _meta(sandbox).get("uid", "")
    hash_ = name_hash(sb_name)
    actions = list(prior)
    meta = _meta(pod)
    ownership = classify_ownership(meta, uid)
    if ownership is Ownership.FOREIGN:
        if annotated:
            actions.append(_remove_pod_name())
        return PodPlan(
            tuple(actions),
            error=foreign_owner_error("pod", pod, sb_name),
            waiting=owned_by_predecessor(pod, sb_name),
        )
    adopting = ownership is Ownership.UNOWNED
    if adopting and not adoption_allowed(pod, hash_):
        return PodPlan(tuple(actions), error=adoption_refusal("pod", meta["name"]))

    labels, annotations, changed = repair_pod_metadata(pod, sandbox, hash_)
    deferred_wait: float | None = None
    if changed or adopting:
        old = {"labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {})}
        patch_meta = create_merge_patch(old, {"labels": labels, "annotations": annotations})
        if adopting:
            # Ownership changes are never deferred and are optimistic (resourceVersion precondition).
            patch_meta["ownerReferences"] = owner_refs_with_controller(pod, sandbox)
            patch_meta["resourceVersion"] = meta.get("resourceVersion")
        elif ANNOTATION_CLAIM_ENV not in (patch_meta.get("annotations") or {}):
            # A claim's env (ours) is on the claim's critical path: never deferred.
            deferred_wait = deferral(snapshot.write_behind_window, snapshot.deferral_since, now)
        if deferred_wait is None:
            actions.append(
                PatchObject(
                    kind=POD, name=meta["name"], patch={"metadata": patch_meta}, what="failed to patch pod"
                )
            )
    actions.extend(_ensure_pod_name(snapshot.sandbox, current_annotation, meta["name"]))
    return PodPlan(tuple(actions), pod=pod, owned=True, deferred_wait=deferred_wait)


def _archived_volume(snapshot: Snapshot) -> bool:
    """Whether a PVC this Sandbox's Pod would mount is a hibernated Sandbox's, refused to it
    (`archive_refusal`): its Pod is then not created (ours; upstream creates the Pod even when its PVC step
    failed, §1.3, and a Pod mounts its claim by name, whoever owns it)."""
    sandbox = snapshot.sandbox
    uid = _meta(sandbox).get("uid", "")
    for template in (sandbox.get("spec") or {}).get("volumeClaimTemplates") or ():
        pvc = snapshot.pvcs.get(pvc_name(template, _meta(sandbox)["name"]))
        if pvc is None or classify_ownership(_meta(pvc), uid) is not Ownership.UNOWNED:
            continue
        if archive_refusal("PVC", pvc, sandbox) is not None:
            return True
    return False


def _plan_pod(snapshot: Snapshot, hash_: str, now: datetime) -> PodPlan:
    """§1.5 resolution, then suspend (§1.7), repair (§1.6) or create (§1.5.1)."""
    sandbox = snapshot.sandbox
    uid = _meta(sandbox).get("uid", "")
    annotations = _annotations(sandbox)
    annotated = ANNOTATION_POD_NAME in annotations
    actions: list[Action] = []
    owned = [p for p in snapshot.pods if _owned(p, uid)]
    tracked = snapshot.tracked_pod
    if tracked is None and annotated:
        actions.append(_remove_pod_name())
        annotated = False
    # The index may lag behind a just-patched tracking label: count the tracked Pod once anyway.
    tracked_name = _meta(tracked)["name"] if tracked is not None else None
    if tracked is not None and _owned(tracked, uid) and all(_meta(p)["name"] != tracked_name for p in owned):
        owned.append(tracked)
    if len(owned) > 1:
        return PodPlan(tuple(actions), error=multiple_pods_message(len(owned)), multiple=True)
    pod = tracked
    if len(owned) == 1 and (tracked is None or _meta(tracked)["name"] != _meta(owned[0])["name"]):
        # Ownership beats the annotation: never create or adopt a second Pod next to an owned one.
        if annotated:
            actions.append(_remove_pod_name())
            annotated = False
        pod = owned[0]

    if (sandbox.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED:
        return _plan_suspend(pod, uid, actions, annotated, snapshot)
    current = annotations.get(ANNOTATION_POD_NAME, "") if annotated else ""
    if pod is not None:
        return plan_existing_pod(
            snapshot, pod, now, annotated=annotated, current_annotation=current, prior=tuple(actions)
        )
    if _archived_volume(snapshot):
        # Never a Pod mounting a hibernated Sandbox's data (the PVC step reports why).
        return PodPlan(tuple(actions))
    manifest = build_pod(sandbox, hash_)
    actions.append(CreateObject(kind=POD, obj=manifest, what="failed to create pod"))
    actions.extend(_ensure_pod_name(sandbox, current, manifest["metadata"]["name"]))
    return PodPlan(tuple(actions), pod=manifest, owned=True)


# --------------------------------------------------------------------------- Service (§1.8)


def _service_spec_patch(svc: Object, hash_: str, ports: list[Object] | None, *, with_ports: bool) -> Object:
    spec = svc.get("spec") or {}
    old: dict[str, Any] = {"selector": dict(spec.get("selector") or {})}
    new: dict[str, Any] = {"selector": {LABEL_SANDBOX_NAME_HASH: hash_}}
    if with_ports:
        if spec.get("ports") is not None:
            old["ports"] = spec["ports"]
        if ports is not None:
            new["ports"] = ports
    return create_merge_patch(old, new)


def _plan_service(snapshot: Snapshot, hash_: str) -> ServicePlan:
    sandbox = snapshot.sandbox
    sb_name, uid = _meta(sandbox)["name"], _meta(sandbox).get("uid", "")
    desired: bool | None = (sandbox.get("spec") or {}).get("service")
    svc = snapshot.service
    if svc is None:
        if desired:
            manifest = build_service(sandbox, hash_)
            create = CreateObject(kind=SERVICE, obj=manifest, what="failed to create service")
            return ServicePlan((create,), service=manifest, fields=ServiceFields.SET)
        return ServicePlan()
    meta = _meta(svc)
    ownership = classify_ownership(meta, uid)
    if desired is False:
        if ownership is Ownership.OWNED:
            delete = DeleteObject(
                kind=SERVICE, name=meta["name"], uid=meta.get("uid", ""), what="failed to delete service"
            )
            return ServicePlan((delete,))
        return ServicePlan()
    if ownership is Ownership.FOREIGN:
        return ServicePlan(
            error=foreign_owner_error("service", svc, sb_name),
            fields=ServiceFields.KEEP,
            waiting=owned_by_predecessor(svc, sb_name),
        )
    ports = service_ports(sandbox)
    if ownership is Ownership.UNOWNED:
        if desired is None:
            return ServicePlan()  # an unowned Service is never adopted implicitly
        if (held := archive_refusal("service", svc, sandbox)) is not None:
            # A hibernated Sandbox's Service (ours: `archive_refusal`), retried at `ARCHIVE_RETRY`.
            return ServicePlan(error=held, fields=ServiceFields.KEEP, retry_after=ARCHIVE_RETRY)
        if not adoption_allowed(svc, hash_):
            return ServicePlan(error=adoption_refusal("service", meta["name"]), fields=ServiceFields.KEEP)
        cluster_ip = (svc.get("spec") or {}).get("clusterIP") or ""
        if cluster_ip not in ("None", ""):
            msg = f'cannot adopt service "{meta["name"]}": ClusterIP is "{cluster_ip}" (expected "None", field is immutable)'
            return ServicePlan(error=msg, fields=ServiceFields.KEEP)
        patch = {
            "metadata": {
                "labels": {LABEL_SANDBOX_NAME_HASH: hash_},
                "ownerReferences": owner_refs_with_controller(svc, sandbox),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "spec": _service_spec_patch(svc, hash_, ports, with_ports=True),
        }
        adopt = PatchObject(
            kind=SERVICE, name=meta["name"], patch=patch, what="failed to update service with owner reference"
        )
        return ServicePlan((adopt,), service=svc, fields=ServiceFields.SET)
    # Owned: repair drift of the tracking label, the selector and (only when requested) the ports.
    patch = {}
    if (meta.get("labels") or {}).get(LABEL_SANDBOX_NAME_HASH) != hash_:
        patch["metadata"] = {"labels": {LABEL_SANDBOX_NAME_HASH: hash_}}
    with_ports = bool(desired) and not service_ports_equal((svc.get("spec") or {}).get("ports"), ports)
    spec_patch = _service_spec_patch(svc, hash_, ports, with_ports=with_ports)
    if spec_patch:
        patch["spec"] = spec_patch
    if not patch:
        return ServicePlan(service=svc, fields=ServiceFields.SET)
    repair = PatchObject(kind=SERVICE, name=meta["name"], patch=patch, what="failed to patch owned service")
    return ServicePlan((repair,), service=svc, fields=ServiceFields.SET)


# --------------------------------------------------------------------------- expiry (§1.10)


def _plan_teardown(snapshot: Snapshot) -> tuple[StepPlan, ...]:
    sandbox = snapshot.sandbox
    uid = _meta(sandbox).get("uid", "")
    steps: list[StepPlan] = []
    pod = snapshot.tracked_pod
    if pod is not None and _owned(pod, uid) and not _deleting(pod, snapshot):
        meta = _meta(pod)
        steps.append(
            StepPlan(
                (
                    DeleteObject(
                        kind=POD, name=meta["name"], uid=meta.get("uid", ""), what="failed to delete pod"
                    ),
                )
            )
        )
    svc = snapshot.service
    if svc is not None and _owned(svc, uid):
        meta = _meta(svc)
        steps.append(
            StepPlan(
                (
                    DeleteObject(
                        kind=SERVICE,
                        name=meta["name"],
                        uid=meta.get("uid", ""),
                        what="failed to delete service",
                    ),
                )
            )
        )
    if (sandbox.get("spec") or {}).get("shutdownPolicy") == ShutdownPolicy.DELETE:
        steps.append(StepPlan((DeleteSandbox(uid=uid, what="failed to delete sandbox"),)))
    return tuple(steps)


# --------------------------------------------------------------------------- top level (§1.2)


def _plan_trace(snapshot: Snapshot) -> StepPlan:
    if snapshot.trace_context and not _annotations(snapshot.sandbox).get(ANNOTATION_TRACE_CONTEXT):
        patch = {"metadata": {"annotations": {ANNOTATION_TRACE_CONTEXT: snapshot.trace_context}}}
        return StepPlan((PatchSandboxMetadata(patch=patch, what="failed to set trace context annotation"),))
    return StepPlan()


def decide(snapshot: Snapshot, now: datetime) -> Plan:
    """Decide one pass for the Sandbox in `snapshot` at time `now` (aware datetime).

    Returns:
        The plan; see the module docstring for the branches.
    """
    sandbox = snapshot.sandbox
    if _meta(sandbox).get("deletionTimestamp"):
        return Plan(PlanMode.IGNORE)
    trace = _plan_trace(snapshot)
    ready = status_condition(sandbox, CONDITION_READY)
    ready_reason = (ready or {}).get("reason")
    expired, _ = check_expiry(shutdown_time(sandbox), now)
    if expired:
        if ready_reason != REASON_SANDBOX_EXPIRED:
            return Plan(PlanMode.EXPIRE_MARK, trace=trace, requeue_after=EXPIRY_REQUEUE)
        return Plan(PlanMode.EXPIRE_TEARDOWN, trace=trace, teardown=_plan_teardown(snapshot))
    if snapshot.awaiting_cache is not None:
        return Plan(PlanMode.WAIT, trace=trace, requeue_after=max(snapshot.awaiting_cache, EXPIRY_REQUEUE))

    hash_ = name_hash(_meta(sandbox)["name"])
    pvcs = _plan_pvcs(snapshot, hash_)
    pod = _plan_pod(snapshot, hash_, now)
    events: tuple[EmitEvent, ...] = ()
    if pod.multiple and ready_reason != REASON_MULTIPLE_PODS:
        # One Warning per episode: the Ready reason remembers that it was already reported.
        events = (
            EmitEvent(
                type_="Warning", reason=EVENT_MULTIPLE_PODS, action="Reconciling", note=pod.error or ""
            ),
        )
    # While the Pod mapping is ambiguous the Service is left alone (no create, repair or delete).
    service = None if pod.multiple else _plan_service(snapshot, hash_)
    defer_since = now if pod.deferred_wait is not None and snapshot.deferral_since is None else None
    return Plan(
        PlanMode.RECONCILE,
        trace=trace,
        pvcs=pvcs,
        pod=pod,
        service=service,
        events=events,
        defer_since=defer_since,
    )
