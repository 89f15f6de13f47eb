"""From plan + results to the new Sandbox status, the requeue and the returned error (controllers spec §1.2-§1.12).

`conclude(snapshot, plan, results, now)` is pure like `decide`: it folds what actually happened (which
action of which step failed, what a create returned) into a `ChildOutcome`, composes the new status
(runtime fields §1.3 step 3, Service fields §1.8, conditions §1.9, expiry §1.10), re-checks expiry at
`now` (the time after the children were reconciled, §1.2 step 8.2), applies the write-behind requeue
(§1.12), and diffs the result against the cached status into a merge patch (§1.11) - or no write at all.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_sandbox.api.constants import CONDITION_POD_SCHEDULED, CONDITION_READY
from agent_sandbox.api.kinds import SANDBOX_WARM_POOL
from agent_sandbox.api.meta import controlled_by, find_condition, remove_condition, upsert_condition
from agent_sandbox.api.naming import sandbox_selector
from agent_sandbox.kube import Object, create_merge_patch

from .conditions import (
    PRESENT_WHILE_APPLICABLE,
    ChildOutcome,
    compute_conditions,
    expired_condition,
)
from .decide import EXPIRY_REQUEUE, check_expiry, deferral, shutdown_time
from .plan import DeleteSandbox, Plan, PlanMode, PodPlan, Results, ServiceFields, Snapshot, StepResult

__all__ = ["BOOT_HOLD", "Conclusion", "booting_pool_member", "child_outcome", "conclude", "status_patch"]

# How long an unclaimed pool member's booting status may wait to ride along with its Ready write: long
# enough to cover a 1,050-member fill's queueing (1 s saved half as much; docs/design/boot-status-hold.md).
BOOT_HOLD = 5.0


@dataclass(frozen=True, slots=True)
class Conclusion:
    """The end of a pass.

    Attributes:
        status_patch: `{"status": ...}` merge patch for the status subresource; None: nothing to write.
        requeue_after: seconds until the next pass (None: event driven).
        errors: returned errors (-> exponential backoff); the status is still written first.
        waiting: every error is a wait on a deleted namesake's child (`StepPlan.waiting`): not a fault.
        retry_after: every error is one decided with a `StepPlan.retry_after`: look again in that many
            seconds (the least of them, or `requeue_after` if sooner) instead of returning the errors for
            backoff.
        sandbox_deleted: the Sandbox was deleted by expiry (no status write).
        clear_deferral: drop the write-behind clock entry of this Sandbox.
        status_deferred: a status write was held back (an observedGeneration-only echo under claim
            pressure, or a booting pool member's); start the write-behind clock if it is not running.
        write_behind: a write of this pass waits on the write-behind clock: the Pod metadata patch, or the
            status echo behind claims. Such Sandboxes are claim priority's held writes, re-enqueued when
            claims stop. A booting pool member's held status is not one (it waits for its Pod), nor is a
            clock entry left by a pass that failed.
        outcome: the child outcome the conditions were computed from (RECONCILE only).
    """

    status_patch: Object | None = None
    requeue_after: float | None = None
    errors: tuple[str, ...] = ()
    waiting: bool = False
    retry_after: float | None = None
    sandbox_deleted: bool = False
    clear_deferral: bool = False
    status_deferred: bool = False
    write_behind: bool = False
    outcome: ChildOutcome | None = None


def _min_positive(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None and v > 0]
    return min(values) if values else None


def _normalized(status: Mapping[str, Any]) -> dict[str, Any]:
    # Go's omitempty: missing, null, "" and empty lists/maps are all the same status.
    return {k: v for k, v in status.items() if v not in (None, "", [], {})}


def generation_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether `new` differs from `old` only in the conditions' observedGeneration (a takeover's echo)."""

    def strip(status: Mapping[str, Any]) -> dict[str, Any]:
        out = _normalized(status)
        out["conditions"] = [
            {k: v for k, v in cond.items() if k != "observedGeneration"}
            for cond in out.get("conditions") or ()
        ]
        return out

    return strip(old) == strip(new)


def _unaddressed_and_not_ready(status: Mapping[str, Any]) -> bool:
    if status.get("podIPs"):
        return False
    ready = find_condition(status.get("conditions"), CONDITION_READY)
    return ready is None or ready.get("status") != "True"


def booting_pool_member(sandbox: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """An unclaimed warm-pool member that is still booting: neither its observed status nor `new` has
    Ready=True or an address.

    Nothing reads such a member's intermediate states: claims take members by Ready, or by their Pod IPs
    as a fallback (§4.5.2), and the pool judges members by Ready and reads their Pods for the rest. A
    member that was Ready or addressed is not booting: its leaving Ready (its Pod deleted or evicted and
    not recreatable at once, or several Pods) or losing its address is exactly what claims must see, so
    that write is never held - holding it let a claim adopt a Pod-less member whose status still showed
    the dead Pod's Ready and IPs.
    """
    if not controlled_by(sandbox, SANDBOX_WARM_POOL):
        return False
    return _unaddressed_and_not_ready(sandbox.get("status") or {}) and _unaddressed_and_not_ready(new)


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Object | None:
    """§1.11: the merge patch turning `old` into `new`, or None when no write is due.

    Semantically equal statuses need no write; a change of `nodeName` alone is held back until Ready is
    True (it rides along with the Ready transition instead of costing its own request).
    """
    o, n = _normalized(old), _normalized(new)
    if o == n:
        return None
    if o.get("nodeName") != n.get("nodeName"):
        scratch = dict(n)
        scratch.pop("nodeName", None)
        if "nodeName" in o:
            scratch["nodeName"] = o["nodeName"]
        ready = find_condition(n.get("conditions"), CONDITION_READY)
        if scratch == o and (ready is None or ready.get("status") != "True"):
            return None
    return {"status": create_merge_patch(o, n)}


def child_outcome(plan: Plan, results: Results) -> tuple[ChildOutcome, ServiceFields, PodPlan]:
    """Fold step results into the outcome: a failed action replaces the step's planned result."""
    pvc_error = plan.pvcs.error if results.pvcs.ok else results.pvcs.error
    pvc_wait = results.pvcs.ok and plan.pvcs.waiting
    pod_plan = results.pod.replanned or plan.pod
    if results.pod.ok:
        pod = results.pod.created or pod_plan.pod
        owned, pod_error, multiple = pod_plan.owned, pod_plan.error, pod_plan.multiple
        pod_wait = pod_plan.waiting
    else:
        assert results.pod.failed_at is not None
        keeps = pod_plan.actions[results.pod.failed_at].keeps_pod
        pod = pod_plan.pod if keeps else None
        owned, pod_error, multiple, pod_wait = pod_plan.owned and keeps, results.pod.error, False, False
    service: Object | None = None
    fields = ServiceFields.KEEP
    service_error: str | None = None
    service_wait = False
    if plan.service is not None:
        if results.service.ok:
            service = results.service.created or plan.service.service
            fields, service_error = plan.service.fields, plan.service.error
            service_wait = plan.service.waiting
        else:
            service_error = results.service.error
    steps = (
        (pvc_error, pvc_wait),
        (None if multiple else pod_error, pod_wait),
        (service_error, service_wait),
    )
    errors = tuple(e for e, _ in steps if e)
    outcome = ChildOutcome(
        pod=pod,
        pod_owned=owned,
        pod_error=pod_error,
        multiple_pods=multiple,
        errors=errors,
        waiting=bool(errors) and all(wait for e, wait in steps if e),
        service=service,
    )
    return outcome, fields, pod_plan


def _apply_children(
    status: dict[str, Any], snapshot: Snapshot, out: ChildOutcome, fields: ServiceFields, now: datetime
) -> None:
    sandbox = snapshot.sandbox
    meta = sandbox["metadata"]
    if out.pod is None:
        status.pop("podIPs", None)
        status.pop("nodeName", None)
    else:
        # The selector is never cleared here; only the Retain expiry teardown resets it.
        status["selector"] = sandbox_selector(meta["name"])
        pod_ips = (
            [ip.get("ip") for ip in (out.pod.get("status") or {}).get("podIPs") or ()]
            if out.pod_owned
            else []
        )
        status["podIPs"] = pod_ips or None
        status["nodeName"] = ((out.pod.get("spec") or {}).get("nodeName") or "") if out.pod_owned else ""
    if fields is ServiceFields.SET and out.service is not None:
        name = out.service["metadata"]["name"]
        status["service"] = name
        status["serviceFQDN"] = f"{name}.{meta.get('namespace', '')}.svc.{snapshot.cluster_domain}"
    elif fields is ServiceFields.CLEAR:
        status.pop("service", None)
        status.pop("serviceFQDN", None)
    conditions = [dict(c) for c in status.get("conditions") or ()]
    produced = set()
    for cond in compute_conditions(sandbox, out):
        produced.add(cond["type"])
        upsert_condition(conditions, cond, now)
    for type_ in PRESENT_WHILE_APPLICABLE:
        if type_ not in produced:
            remove_condition(conditions, type_)
    status["conditions"] = conditions


def _mark_expired(status: dict[str, Any], generation: int, now: datetime) -> None:
    conditions = [dict(c) for c in status.get("conditions") or ()]
    upsert_condition(conditions, expired_condition(generation), now)
    remove_condition(conditions, CONDITION_POD_SCHEDULED)
    status["conditions"] = conditions


def _conclude_teardown(snapshot: Snapshot, plan: Plan, results: Results, now: datetime) -> Conclusion:
    errors: list[str] = []
    # Steps without a recorded result succeeded (`Results()` means "everything succeeded").
    padded = list(results.teardown) + [StepResult()] * (len(plan.teardown) - len(results.teardown))
    for step, result in zip(plan.teardown, padded, strict=True):
        if isinstance(step.actions[0], DeleteSandbox) and result.ok:
            # GC removes Pod, Service and PVCs; cleanup errors of this pass no longer matter.
            return Conclusion(sandbox_deleted=True, clear_deferral=True)
        if not result.ok and result.error:
            errors.append(result.error)
    old: Mapping[str, Any] = snapshot.sandbox.get("status") or {}
    if errors:
        return Conclusion(errors=tuple(errors))
    # Retain: drop live-resource fields, keep the conditions (Finished survives), mark expired.
    status: dict[str, Any] = {"conditions": copy.deepcopy(list(old.get("conditions") or ()))}
    conditions = status["conditions"]
    upsert_condition(conditions, expired_condition(_generation(snapshot)), now)
    return Conclusion(status_patch=status_patch(old, status))


def _retry_after(plan: Plan, results: Results, pod_plan: PodPlan) -> float | None:
    """The least `StepPlan.retry_after` of the steps that ended with an error, if every one of them ended
    with its planned error (a failed API call is retried with backoff); None otherwise."""
    steps = [(plan.pvcs, results.pvcs), (pod_plan, results.pod)]
    if plan.service is not None:
        steps.append((plan.service, results.service))
    retries = []
    for step, result in steps:
        if not result.ok:
            return None
        if step.error and not (isinstance(step, PodPlan) and step.multiple):
            if step.retry_after is None:
                return None
            retries.append(step.retry_after)
    return min(retries) if retries else None


def _generation(snapshot: Snapshot) -> int:
    return int(snapshot.sandbox["metadata"].get("generation") or 0)


def conclude(snapshot: Snapshot, plan: Plan, results: Results, now: datetime) -> Conclusion:
    """Compose the pass's status patch, requeue and errors from `plan` and what executing it produced.

    Args:
        snapshot: the snapshot `plan` was decided from.
        plan: the plan.
        results: per-step execution results (`Results()` = everything succeeded).
        now: time after the children were reconciled (expiry is re-checked against it).
    """
    old: Mapping[str, Any] = snapshot.sandbox.get("status") or {}
    if plan.mode is PlanMode.IGNORE:
        return Conclusion(clear_deferral=True)
    if plan.mode is PlanMode.WAIT:
        return Conclusion(requeue_after=plan.requeue_after)
    if plan.mode is PlanMode.EXPIRE_MARK:
        status = copy.deepcopy(dict(old))
        _mark_expired(status, _generation(snapshot), now)
        return Conclusion(status_patch=status_patch(old, status), requeue_after=EXPIRY_REQUEUE)
    if plan.mode is PlanMode.EXPIRE_TEARDOWN:
        return _conclude_teardown(snapshot, plan, results, now)

    outcome, fields, pod_plan = child_outcome(plan, results)
    status = copy.deepcopy(dict(old))
    _apply_children(status, snapshot, outcome, fields, now)
    expired, requeue = check_expiry(shutdown_time(snapshot.sandbox), now)
    if expired:
        _mark_expired(status, _generation(snapshot), now)
        requeue = EXPIRY_REQUEUE
    patch = status_patch(old, status)
    status_wait: float | None = None
    behind_claims = False
    if patch is not None and snapshot.yield_to_claims and generation_only(old, status):
        # Claims are arriving and only observedGeneration moved (a takeover bumped the generation): the
        # echo waits behind them, on the Pod patch's clock (docs/design/claim-priority.md).
        status_wait = deferral(snapshot.write_behind_window, snapshot.deferral_since, now)
        behind_claims = status_wait is not None
    elif patch is not None and booting_pool_member(snapshot.sandbox, status):
        # A booting member's Pending and PodScheduled states ride along with its Ready write when that
        # comes within the boot hold: each write is a watch event the API server converts for every
        # served version (docs/design/boot-status-hold.md).
        status_wait = deferral(snapshot.boot_hold, snapshot.deferral_since, now)
    if status_wait is not None:
        patch = None
    retry = _retry_after(plan, results, pod_plan) if outcome.errors else None
    clear = False
    if not outcome.errors:
        waits = [w for w in (pod_plan.deferred_wait, status_wait) if w is not None]
        if waits:
            requeue = _min_positive(requeue, min(waits))
        else:
            clear = True
    return Conclusion(
        status_patch=patch,
        requeue_after=requeue,
        errors=outcome.errors,
        waiting=outcome.waiting,
        # The sooner of the two: an expiry due before the retry is not put off.
        retry_after=_min_positive(requeue, retry) if retry is not None else None,
        clear_deferral=clear,
        status_deferred=status_wait is not None,
        write_behind=behind_claims or pod_plan.deferred_wait is not None,
        outcome=outcome,
    )
