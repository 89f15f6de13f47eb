"""Sandbox status conditions (controllers spec §1.9 tables, §1.10 expiry condition).

Owns the four computed conditions (`Suspended`, `PodScheduled`, `Finished`, `Ready`) as pure functions of
a `ChildOutcome`, and the `SandboxExpired` Ready condition. They are set on the status with
`api.meta.upsert_condition` / `remove_condition` (apimachinery `SetStatusCondition` semantics).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_sandbox.api.constants import (
    CONDITION_FINISHED,
    CONDITION_POD_SCHEDULED,
    CONDITION_READY,
    CONDITION_SUSPENDED,
    REASON_DEPENDENCIES_NOT_READY,
    REASON_DEPENDENCIES_READY,
    REASON_MULTIPLE_PODS,
    REASON_NOT_SUSPENDED,
    REASON_POD_FAILED,
    REASON_POD_NOT_OWNED,
    REASON_POD_SCHEDULED,
    REASON_POD_SCHEDULING_UNKNOWN,
    REASON_POD_STATE_UNKNOWN,
    REASON_POD_SUCCEEDED,
    REASON_POD_TERMINATED,
    REASON_POD_TERMINATING,
    REASON_RECONCILER_ERROR,
    REASON_SANDBOX_EXPIRED,
    REASON_SANDBOX_SUSPENDED,
    RECONCILER_ERROR_MESSAGE_PREFIX,
    OperatingMode,
)
from agent_sandbox.api.meta import new_condition, status_condition
from agent_sandbox.kube import Object

__all__ = ["PRESENT_WHILE_APPLICABLE", "ChildOutcome", "compute_conditions", "expired_condition"]

#: Conditions present only while they apply; removed when a normal pass does not produce them (§1.3 step 5).
PRESENT_WHILE_APPLICABLE = (CONDITION_FINISHED, CONDITION_POD_SCHEDULED)


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """What one pass of child reconciliation produced; the input of the §1.9 tables.

    Attributes:
        pod: the Pod the pass ended with (possibly foreign while Suspended), None if absent.
        pod_owned: whether that Pod is (now) controlled by this Sandbox.
        pod_error: error of the Pod step, including the multiple-Pods error (drives the "Unknown" rows).
        multiple_pods: the Pod step stopped because several Pods are controlled by this Sandbox.
        errors: condition errors in order (PVC, Pod, Service), excluding the multiple-Pods error.
        waiting: `errors` is not empty and every one is a wait on a deleted namesake's child.
        service: the Service the pass ended with (None: no Service, or the Service step failed/skipped).
    """

    pod: Object | None = None
    pod_owned: bool = False
    pod_error: str | None = None
    multiple_pods: bool = False
    errors: tuple[str, ...] = ()
    waiting: bool = False
    service: Object | None = None


def expired_condition(generation: int) -> dict[str, Any]:
    """Ready = False / SandboxExpired (§1.2 step 7, §1.10)."""
    return new_condition(CONDITION_READY, "False", REASON_SANDBOX_EXPIRED, "Sandbox has expired", generation)


def _phase(pod: Object | None) -> str:
    return str(((pod or {}).get("status") or {}).get("phase") or "")


def _pod_condition(pod: Object, type_: str) -> Mapping[str, Any] | None:
    return status_condition(pod, type_)


def _suspended(suspended: bool, out: ChildOutcome, gen: int) -> dict[str, Any]:
    if not suspended:
        return new_condition(
            CONDITION_SUSPENDED, "False", REASON_NOT_SUSPENDED, "Sandbox is not suspended", gen
        )
    if out.pod is None and out.pod_error is not None:
        msg = "Pod state is unknown. Sandbox suspension cannot be confirmed"
        return new_condition(CONDITION_SUSPENDED, "Unknown", REASON_POD_STATE_UNKNOWN, msg, gen)
    if out.pod is None:
        msg = "Pod has been terminated. Sandbox is suspended"
        return new_condition(CONDITION_SUSPENDED, "True", REASON_POD_TERMINATED, msg, gen)
    if not out.pod_owned:
        msg = "Refused to delete pod because it is not owned by this sandbox"
        return new_condition(CONDITION_SUSPENDED, "False", REASON_POD_NOT_OWNED, msg, gen)
    msg = "Pod is terminating. Sandbox is suspending"
    return new_condition(CONDITION_SUSPENDED, "False", REASON_POD_TERMINATING, msg, gen)


def _pod_scheduled(out: ChildOutcome, gen: int) -> dict[str, Any] | None:
    if out.pod is None and out.pod_error is not None:
        # A failed Pod step does not prove the Pod is gone: report Unknown instead of removing.
        msg = "Pod state is unknown. Pod scheduling cannot be determined"
        return new_condition(CONDITION_POD_SCHEDULED, "Unknown", REASON_POD_SCHEDULING_UNKNOWN, msg, gen)
    if out.pod is None or not out.pod_owned:
        return None
    mirrored = _pod_condition(out.pod, CONDITION_POD_SCHEDULED)
    if mirrored is None:
        msg = "Pod has not reported a PodScheduled condition yet"
        return new_condition(CONDITION_POD_SCHEDULED, "Unknown", REASON_POD_SCHEDULING_UNKNOWN, msg, gen)
    status = str(mirrored.get("status") or "")
    reason = str(mirrored.get("reason") or "")
    if not reason:
        reason = REASON_POD_SCHEDULED if status == "True" else REASON_POD_SCHEDULING_UNKNOWN
    return new_condition(CONDITION_POD_SCHEDULED, status, reason, str(mirrored.get("message") or ""), gen)


def _stopped_by_its_delete(sandbox: Object, pod: Object | None) -> bool:
    """An owned Pod in a terminal phase it reached while being deleted, the Sandbox not Finished before it.

    Departure from §1.9.3/§1.9.4 rows 4-5 (docs/design/sandbox-quirks.md #19): a Pod being deleted (suspend,
    idle suspend, a user's or an eviction's delete) reaches a terminal phase because it was stopped, not because
    the workload ended. Setting Finished from it started a claim's ttlSecondsAfterFinished and deleted the
    Sandbox and its PVCs; a Ready of PodFailed from it is a reason clients (upstream's SDK among them) take as
    final while the Pod is about to be recreated.
    """
    return _ended_while_deleted(pod) and _kept_finished(sandbox) is None


def _ended_while_deleted(pod: Object | None) -> bool:
    """A Pod in a terminal phase that carries a deletionTimestamp."""
    return (
        pod is not None
        and _phase(pod) in ("Succeeded", "Failed")
        and bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    )


def _kept_finished(sandbox: Object) -> Mapping[str, Any] | None:
    """The Sandbox's stored Finished condition when it is True."""
    kept = status_condition(sandbox, CONDITION_FINISHED)
    return kept if kept is not None and kept.get("status") == "True" else None


def _finished(sandbox: Object, out: ChildOutcome, gen: int) -> dict[str, Any] | None:
    if out.pod is None or not out.pod_owned:
        return None
    phase = _phase(out.pod)
    if _ended_while_deleted(out.pod):
        # A Finished the Sandbox already has (the Pod ended on its own, then was deleted) is kept as it is, so
        # its lastTransitionTime - the claim's TTL start - does not move; none is set from a stopped Pod.
        kept = _kept_finished(sandbox)
        if kept is None:
            return None
        return new_condition(
            CONDITION_FINISHED, "True", str(kept.get("reason") or ""), str(kept.get("message") or ""), gen
        )
    if phase == "Succeeded":
        return new_condition(
            CONDITION_FINISHED, "True", REASON_POD_SUCCEEDED, "Pod completed successfully", gen
        )
    if phase == "Failed":
        return new_condition(CONDITION_FINISHED, "True", REASON_POD_FAILED, "Pod failed", gen)
    return None


def _ready(sandbox: Object, suspended: bool, out: ChildOutcome, gen: int) -> dict[str, Any]:
    not_ready = REASON_DEPENDENCIES_NOT_READY
    if out.multiple_pods and out.pod_error:
        # Only the invariant violation is shown; transient errors of the same pass are not joined in.
        return new_condition(CONDITION_READY, "False", REASON_MULTIPLE_PODS, out.pod_error, gen)
    if out.errors:
        msg = RECONCILER_ERROR_MESSAGE_PREFIX + "\n".join(out.errors)
        return new_condition(CONDITION_READY, "False", REASON_RECONCILER_ERROR, msg, gen)
    if suspended:
        msg = "Sandbox is suspending" if out.pod is not None else "Sandbox is suspended"
        return new_condition(CONDITION_READY, "False", REASON_SANDBOX_SUSPENDED, msg, gen)
    phase = _phase(out.pod)
    # A Pod stopped by its delete reads as any other not-ready Pod (row 6): it is about to be recreated.
    final = out.pod is not None and not (out.pod_owned and _stopped_by_its_delete(sandbox, out.pod))
    if final and phase == "Succeeded":
        return new_condition(
            CONDITION_READY, "False", REASON_POD_SUCCEEDED, "Pod completed successfully", gen
        )
    if final and phase == "Failed":
        return new_condition(CONDITION_READY, "False", REASON_POD_FAILED, "Pod failed", gen)

    pod_ready = False
    if out.pod is None:
        message = "Pod does not exist"
    elif phase != "Running":
        message = f"Pod exists with phase: {phase}"
    else:
        message = "Pod is Running but not Ready"
        ready = _pod_condition(out.pod, "Ready")
        if ready is not None and ready.get("status") == "True":
            if (out.pod.get("status") or {}).get("podIPs"):
                message, pod_ready = "Pod is Ready", True
            else:
                message = "Pod is Ready but has no podIPs yet"
    wanted: bool | None = (sandbox.get("spec") or {}).get("service")
    # Unset spec.service keeps requiring a Service the Sandbox already owns (backward compatibility).
    required = wanted if wanted is not None else out.service is not None
    service_ready = True
    if required:
        service_ready = out.service is not None
        message += "; Service Exists" if service_ready else "; Service does not exist"
    if pod_ready and service_ready:
        return new_condition(CONDITION_READY, "True", REASON_DEPENDENCIES_READY, message, gen)
    return new_condition(CONDITION_READY, "False", not_ready, message, gen)


def compute_conditions(sandbox: Object, out: ChildOutcome) -> list[dict[str, Any]]:
    """The conditions of one normal pass (§1.9), in upstream order: Suspended, Finished?, PodScheduled?, Ready."""
    gen = int((sandbox.get("metadata") or {}).get("generation") or 0)
    suspended = (sandbox.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED
    conditions = [_suspended(suspended, out, gen)]
    for optional in (_finished(sandbox, out, gen), _pod_scheduled(out, gen)):
        if optional is not None:
            conditions.append(optional)
    conditions.append(_ready(sandbox, suspended, out, gen))
    return conditions
