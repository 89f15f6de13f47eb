"""Condition tables of spec §1.9 (upstream TestComputeConditions) and the §0.5 condition upsert."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api.meta import remove_condition, upsert_condition
from agent_sandbox.controllers.sandbox import ChildOutcome, compute_conditions
from tests.unit.controllers.sandbox.builders import NOW, pod, sandbox, service

pytestmark = pytest.mark.unit

MULTI = "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod"
Expected = dict[str, tuple[str, str, str]]


def _summary(conditions: list[dict[str, Any]]) -> Expected:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in conditions}


NOT_SUSPENDED = ("False", "NotSuspended", "Sandbox is not suspended")
NOT_REPORTED = ("Unknown", "PodSchedulingUnknown", "Pod has not reported a PodScheduled condition yet")
UNKNOWN_SCHED = (
    "Unknown",
    "PodSchedulingUnknown",
    "Pod state is unknown. Pod scheduling cannot be determined",
)
SCHEDULED = ("True", "PodScheduled", "")
SCHED = ("True", "", "")

FINISHED_BEFORE = {
    "type": "Finished",
    "status": "True",
    "reason": "PodSucceeded",
    "message": "Pod completed successfully",
    "observedGeneration": 2,
    "lastTransitionTime": "2026-01-01T11:00:00Z",
}

CASES: list[tuple[str, dict[str, Any], ChildOutcome, Expected]] = [
    (
        "provisioning",
        {},
        ChildOutcome(),
        {"Suspended": NOT_SUSPENDED, "Ready": ("False", "DependenciesNotReady", "Pod does not exist")},
    ),
    (
        "pending",
        {},
        ChildOutcome(pod=pod(phase="Pending"), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": NOT_REPORTED,
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Pending"),
        },
    ),
    (
        "just-created-no-phase",
        {},
        ChildOutcome(pod=pod(), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": NOT_REPORTED,
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: "),
        },
    ),
    (
        "running-not-ready",
        {},
        ChildOutcome(pod=pod(phase="Running", scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "DependenciesNotReady", "Pod is Running but not Ready"),
        },
    ),
    (
        "ready-without-ip",
        {},
        ChildOutcome(pod=pod(phase="Running", ready=True, scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "DependenciesNotReady", "Pod is Ready but has no podIPs yet"),
        },
    ),
    (
        "ready",
        {},
        ChildOutcome(pod=pod(phase="Running", ready=True, ips=["10.0.0.1"], scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("True", "DependenciesReady", "Pod is Ready"),
        },
    ),
    (
        "suspending",
        {"mode": "Suspended"},
        ChildOutcome(pod=pod(phase="Running", deleting=True, scheduled=SCHED), pod_owned=True),
        {
            "Suspended": ("False", "PodTerminating", "Pod is terminating. Sandbox is suspending"),
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspending"),
        },
    ),
    (
        "suspended",
        {"mode": "Suspended"},
        ChildOutcome(),
        {
            "Suspended": ("True", "PodTerminated", "Pod has been terminated. Sandbox is suspended"),
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspended"),
        },
    ),
    (
        "pod-not-owned",
        {"mode": "Suspended"},
        ChildOutcome(pod=pod(owned=False, phase="Running", ips=["10.0.0.9"]), pod_owned=False),
        {
            "Suspended": (
                "False",
                "PodNotOwned",
                "Refused to delete pod because it is not owned by this sandbox",
            ),
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspending"),
        },
    ),
    (
        "delete-failed-stays-terminating",
        {"mode": "Suspended"},
        ChildOutcome(
            pod=pod(phase="Running"),
            pod_owned=True,
            pod_error="failed to delete pod: boom",
            errors=("failed to delete pod: boom",),
        ),
        {
            "Suspended": ("False", "PodTerminating", "Pod is terminating. Sandbox is suspending"),
            "PodScheduled": NOT_REPORTED,
            "Ready": ("False", "ReconcilerError", "Error seen: failed to delete pod: boom"),
        },
    ),
    (
        "pod-lookup-failure-suspended",
        {"mode": "Suspended"},
        ChildOutcome(pod_error="pod get failed: boom", errors=("pod get failed: boom",)),
        {
            "Suspended": (
                "Unknown",
                "PodStateUnknown",
                "Pod state is unknown. Sandbox suspension cannot be confirmed",
            ),
            "PodScheduled": UNKNOWN_SCHED,
            "Ready": ("False", "ReconcilerError", "Error seen: pod get failed: boom"),
        },
    ),
    (
        "pod-lookup-failure-running",
        {},
        ChildOutcome(pod_error="pod get failed: boom", errors=("pod get failed: boom",)),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": UNKNOWN_SCHED,
            "Ready": ("False", "ReconcilerError", "Error seen: pod get failed: boom"),
        },
    ),
    (
        "resume",
        {"status": {"conditions": [{"type": "Suspended", "status": "True"}]}},
        ChildOutcome(),
        {"Suspended": NOT_SUSPENDED, "Ready": ("False", "DependenciesNotReady", "Pod does not exist")},
    ),
    (
        "unknown-phase",
        {},
        ChildOutcome(pod=pod(phase="Unknown", scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Unknown"),
        },
    ),
    (
        "failed",
        {},
        ChildOutcome(pod=pod(phase="Failed", scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "Finished": ("True", "PodFailed", "Pod failed"),
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "PodFailed", "Pod failed"),
        },
    ),
    (
        "succeeded",
        {},
        ChildOutcome(pod=pod(phase="Succeeded", scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "Finished": ("True", "PodSucceeded", "Pod completed successfully"),
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "PodSucceeded", "Pod completed successfully"),
        },
    ),
    # A Pod that reaches a terminal phase while being deleted was stopped, it did not finish: no Finished
    # (a departure from §1.9.3, docs/lifecycle.md), or a claim's ttlSecondsAfterFinished deletes the Sandbox.
    (
        "suspend-deleted-pod-failed-is-not-finished",
        {"mode": "Suspended"},
        ChildOutcome(pod=pod(phase="Failed", scheduled=SCHED, deleting=True), pod_owned=True),
        {
            "Suspended": ("False", "PodTerminating", "Pod is terminating. Sandbox is suspending"),
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspending"),
        },
    ),
    (
        "deleted-pod-failed-is-not-finished",
        {},
        ChildOutcome(pod=pod(phase="Failed", scheduled=SCHED, deleting=True), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            # Not PodFailed, which clients take as final: the Pod is about to be recreated.
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Failed"),
        },
    ),
    (
        "deleted-pod-succeeded-is-not-finished",
        {},
        ChildOutcome(pod=pod(phase="Succeeded", scheduled=SCHED, deleting=True), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Succeeded"),
        },
    ),
    (
        "finished-kept-while-its-pod-is-deleted",
        {"status": {"conditions": [FINISHED_BEFORE]}},
        ChildOutcome(pod=pod(phase="Failed", scheduled=SCHED, deleting=True), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "Finished": ("True", "PodSucceeded", "Pod completed successfully"),
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "PodFailed", "Pod failed"),
        },
    ),
    (
        "foreign-terminal-pod-no-finished",
        {"mode": "Suspended"},
        ChildOutcome(pod=pod(owned=False, phase="Succeeded"), pod_owned=False),
        {
            "Suspended": (
                "False",
                "PodNotOwned",
                "Refused to delete pod because it is not owned by this sandbox",
            ),
            "Ready": ("False", "SandboxSuspended", "Sandbox is suspending"),
        },
    ),
    (
        "error-precedence-over-suspended-and-phase",
        {"mode": "Suspended"},
        ChildOutcome(errors=("PVC boom", "service boom")),
        {
            "Suspended": ("True", "PodTerminated", "Pod has been terminated. Sandbox is suspended"),
            "Ready": ("False", "ReconcilerError", "Error seen: PVC boom\nservice boom"),
        },
    ),
    (
        "unschedulable-passthrough",
        {},
        ChildOutcome(
            pod=pod(phase="Pending", scheduled=("False", "Unschedulable", "0/2 nodes are available")),
            pod_owned=True,
        ),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": ("False", "Unschedulable", "0/2 nodes are available"),
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Pending"),
        },
    ),
    (
        "scheduling-gated-passthrough",
        {},
        ChildOutcome(
            pod=pod(phase="Pending", scheduled=("False", "SchedulingGated", "gated")), pod_owned=True
        ),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": ("False", "SchedulingGated", "gated"),
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Pending"),
        },
    ),
    (
        "empty-scheduler-reason-not-true",
        {},
        ChildOutcome(pod=pod(phase="Pending", scheduled=("False", "", "")), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": ("False", "PodSchedulingUnknown", ""),
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Pending"),
        },
    ),
    (
        "multiple-pods-message-without-transient-errors",
        {},
        ChildOutcome(pod_error=MULTI, multiple_pods=True, errors=("PVC boom",)),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": UNKNOWN_SCHED,
            "Ready": ("False", "MultiplePods", MULTI),
        },
    ),
    (
        "service-required-missing",
        {"service": True},
        ChildOutcome(pod=pod(phase="Running", ready=True, ips=["10.0.0.1"], scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("False", "DependenciesNotReady", "Pod is Ready; Service does not exist"),
        },
    ),
    (
        "service-required-present",
        {"service": True},
        ChildOutcome(
            pod=pod(phase="Running", ready=True, ips=["10.0.0.1"], scheduled=SCHED),
            pod_owned=True,
            service=service(),
        ),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("True", "DependenciesReady", "Pod is Ready; Service Exists"),
        },
    ),
    (
        "service-unset-but-owned-service-kept",
        {},
        ChildOutcome(pod=pod(phase="Pending"), pod_owned=True, service=service()),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": NOT_REPORTED,
            "Ready": ("False", "DependenciesNotReady", "Pod exists with phase: Pending; Service Exists"),
        },
    ),
    (
        "service-false-not-required",
        {"service": False},
        ChildOutcome(pod=pod(phase="Running", ready=True, ips=["10.0.0.1"], scheduled=SCHED), pod_owned=True),
        {
            "Suspended": NOT_SUSPENDED,
            "PodScheduled": SCHEDULED,
            "Ready": ("True", "DependenciesReady", "Pod is Ready"),
        },
    ),
]


@pytest.mark.parametrize(
    ("sandbox_kwargs", "outcome", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_compute_conditions(
    sandbox_kwargs: dict[str, Any], outcome: ChildOutcome, expected: Expected
) -> None:
    conditions = compute_conditions(sandbox(generation=3, **sandbox_kwargs), outcome)
    assert _summary(conditions) == expected
    assert [c["type"] for c in conditions] == list(expected)  # upstream order
    assert all(c["observedGeneration"] == 3 for c in conditions)


def test_upsert_appends_stamps_and_keeps_position() -> None:
    conds: list[dict[str, Any]] = []
    ready = {"type": "Ready", "status": "False", "reason": "A", "message": "a", "observedGeneration": 1}
    upsert_condition(conds, ready, NOW)
    upsert_condition(conds, {**ready, "type": "Suspended"}, NOW)
    assert conds[0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    later = NOW + timedelta(minutes=1)
    # Same status: reason/message/generation overwritten, transition time kept.
    upsert_condition(conds, {**ready, "reason": "B", "message": "b", "observedGeneration": 2}, later)
    assert conds[0] == {
        **ready,
        "reason": "B",
        "message": "b",
        "observedGeneration": 2,
        "lastTransitionTime": "2026-01-01T12:00:00Z",
    }
    # Status flip: new transition time, position kept.
    upsert_condition(conds, {**ready, "status": "True"}, later)
    assert conds[0]["status"] == "True"
    assert conds[0]["lastTransitionTime"] == "2026-01-01T12:01:00Z"
    assert [c["type"] for c in conds] == ["Ready", "Suspended"]
    remove_condition(conds, "Ready")
    assert [c["type"] for c in conds] == ["Suspended"]
