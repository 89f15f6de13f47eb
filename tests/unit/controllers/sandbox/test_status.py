"""`conclude`: status composition, failure folding, expiry re-check, write-behind requeue, status diff (§1.2-§1.12)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api.constants import ANNOTATION_POD_NAME, LABEL_SANDBOX_NAME_HASH
from agent_sandbox.controllers.sandbox import Results, StepResult, conclude, decide, status_patch
from agent_sandbox.controllers.sandbox.plan import Snapshot
from agent_sandbox.controllers.sandbox.status import BOOT_HOLD, booting_pool_member
from tests.unit.controllers.sandbox.builders import HASH, NOW, SB, pod, ref, sandbox, service, snap

pytestmark = pytest.mark.unit

T = "2026-01-01T12:00:00Z"
SCHED = ("True", "", "")


def _run(
    s: Snapshot, results: Results | None = None, *, after: timedelta = timedelta(0)
) -> tuple[dict[str, Any], Any]:
    """decide + conclude; returns (new status as the server would hold it, conclusion)."""
    plan = decide(s, NOW)
    c = conclude(s, plan, results or Results(), NOW + after)
    old = dict(s.sandbox.get("status") or {})
    new = dict(old)
    if c.status_patch is not None:
        for k, v in c.status_patch["status"].items():
            if v is None:
                new.pop(k, None)
            else:
                new[k] = v
    return new, c


def _cond(status: dict[str, Any], type_: str) -> tuple[str, str, str] | None:
    for c in status.get("conditions") or ():
        if c["type"] == type_:
            return (c["status"], c["reason"], c["message"])
    return None


def test_minimal_spec_status_exactly() -> None:
    status, c = _run(snap(sandbox()))
    assert status == {
        "selector": f"{LABEL_SANDBOX_NAME_HASH}={HASH}",
        "conditions": [
            {
                "type": "Suspended",
                "status": "False",
                "reason": "NotSuspended",
                "message": "Sandbox is not suspended",
                "observedGeneration": 1,
                "lastTransitionTime": T,
            },
            {
                "type": "PodScheduled",
                "status": "Unknown",
                "reason": "PodSchedulingUnknown",
                "message": "Pod has not reported a PodScheduled condition yet",
                "observedGeneration": 1,
                "lastTransitionTime": T,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "DependenciesNotReady",
                "message": "Pod exists with phase: ",
                "observedGeneration": 1,
                "lastTransitionTime": T,
            },
        ],
    }
    assert c.errors == ()
    assert c.requeue_after is None


def test_created_pod_uses_the_api_answer() -> None:
    created = pod(phase="Pending")
    status, _ = _run(snap(sandbox()), Results(pod=StepResult(created=created)))
    assert _cond(status, "Ready") == ("False", "DependenciesNotReady", "Pod exists with phase: Pending")


def test_ready_pod_reports_ips_node_and_ready_without_service() -> None:
    s = snap(
        sandbox(annotations={ANNOTATION_POD_NAME: SB}),
        pods=[pod(phase="Running", ready=True, ips=["10.0.0.5", "fd00::5"], node="n1", scheduled=SCHED)],
    )
    status, _ = _run(s)
    assert status["podIPs"] == ["10.0.0.5", "fd00::5"]
    assert status["nodeName"] == "n1"
    assert _cond(status, "Ready") == ("True", "DependenciesReady", "Pod is Ready")
    assert "service" not in status


@pytest.mark.parametrize("domain", ["cluster.local", "corp.example"])
def test_service_status_uses_cluster_domain(domain: str) -> None:
    s = snap(
        sandbox(service=True, annotations={ANNOTATION_POD_NAME: SB}),
        pods=[pod()],
        svc=service(),
        cluster_domain=domain,
    )
    status, _ = _run(s)
    assert status["service"] == SB
    assert status["serviceFQDN"] == f"sb.ns.svc.{domain}"


def test_service_status_cleared_when_disabled() -> None:
    old = {"service": SB, "serviceFQDN": "sb.ns.svc.cluster.local"}
    status, _ = _run(snap(sandbox(service=False, status=old), pods=[pod()]))
    assert "service" not in status
    assert "serviceFQDN" not in status


def test_service_failure_keeps_previous_service_fields() -> None:
    old = {"service": SB, "serviceFQDN": "sb.ns.svc.cluster.local"}
    s = snap(
        sandbox(service=False, status=old, annotations={ANNOTATION_POD_NAME: SB}), pods=[pod()], svc=service()
    )
    status, c = _run(s, Results(service=StepResult(0, "failed to delete service: boom")))
    assert status["service"] == SB
    assert c.errors == ("failed to delete service: boom",)
    assert _cond(status, "Ready") == (
        "False",
        "ReconcilerError",
        "Error seen: failed to delete service: boom",
    )


def test_suspended_foreign_pod_never_leaks_ips_or_node() -> None:
    old = {"podIPs": ["10.0.0.1"], "nodeName": "n1"}
    foreign = pod(owned=False, labels={}, phase="Running", ips=["10.9.9.9"], node="n9")
    status, _ = _run(snap(sandbox(mode="Suspended", status=old), pods=[foreign]))
    assert "podIPs" not in status
    assert "nodeName" not in status
    assert _cond(status, "Suspended") == (
        "False",
        "PodNotOwned",
        "Refused to delete pod because it is not owned by this sandbox",
    )


def test_multiple_pods_status_no_error_no_service_change() -> None:
    old = {"service": SB, "serviceFQDN": "x", "podIPs": ["1.1.1.1"], "nodeName": "n"}
    s = snap(sandbox(service=True, status=old), pods=[pod("a", ips=["10.0.0.1"]), pod("b")], svc=service())
    status, c = _run(s)
    assert c.errors == ()
    assert c.requeue_after is None
    assert _cond(status, "Ready") == (
        "False",
        "MultiplePods",
        "multiple Pods (2) are controlled by this Sandbox; refusing to choose or create a Pod",
    )
    assert "podIPs" not in status
    assert "nodeName" not in status
    assert status["service"] == SB  # untouched


POOL = ref("SandboxWarmPool", "pool", "uid-pool", api_version="extensions.agents.x-k8s.io/v1beta1")
READY_STATUS = {
    "podIPs": ["10.0.0.1"],
    "conditions": [
        {"type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "Pod is Ready"}
    ],
}
BOOTING_STATUS = {
    "conditions": [{"type": "Ready", "status": "False", "reason": "DependenciesNotReady", "message": "x"}]
}


@pytest.mark.parametrize(
    ("old", "new", "booting"),
    [
        ({}, BOOTING_STATUS, True),
        (BOOTING_STATUS, BOOTING_STATUS | {"selector": "s"}, True),
        (READY_STATUS, BOOTING_STATUS, False),  # left Ready: claims must see it at once
        ({"podIPs": ["10.0.0.1"], "conditions": BOOTING_STATUS["conditions"]}, BOOTING_STATUS, False),
        ({}, {"podIPs": ["10.0.0.1"]}, False),
        (BOOTING_STATUS, READY_STATUS, False),
    ],
    ids=["new", "still-booting", "ready-lost", "address-lost", "addressed", "becomes-ready"],
)
def test_only_a_member_that_never_was_ready_or_addressed_is_booting(
    old: dict[str, Any], new: dict[str, Any], booting: bool
) -> None:
    assert booting_pool_member(sandbox(owner=POOL, status=old), new) is booting
    assert booting_pool_member(sandbox(status=old), new) is False  # only pool members are held


def test_a_ready_members_multiple_pods_write_is_never_held_as_booting() -> None:
    # Probe: a Ready member whose status write to Ready=False was held for the boot hold kept the old
    # Pod's Ready and IPs; a claim adopted it meanwhile (§4.5.2 picks Ready members).
    held: dict[str, Any] = {"boot_hold": BOOT_HOLD, "deferral_since": NOW}
    s = snap(sandbox(owner=POOL, status=READY_STATUS), pods=[pod("a", ips=["10.0.0.1"]), pod("b")], **held)
    status, c = _run(s)
    assert c.status_patch is not None
    assert not c.status_deferred
    assert _cond(status, "Ready")[:2] == ("False", "MultiplePods")  # type: ignore[index]
    assert "podIPs" not in status
    # A member that never was Ready still waits for its Ready write.
    s = snap(sandbox(owner=POOL, status=BOOTING_STATUS), pods=[pod(phase="Pending")], **held)
    _, c = _run(s)
    assert c.status_patch is None
    assert c.status_deferred


def test_pod_delete_failure_stays_terminating() -> None:
    s = snap(sandbox(mode="Suspended"), pods=[pod(phase="Running")])
    status, c = _run(s, Results(pod=StepResult(0, "failed to delete pod: boom")))
    assert _cond(status, "Suspended") == (
        "False",
        "PodTerminating",
        "Pod is terminating. Sandbox is suspending",
    )
    assert _cond(status, "Ready") == ("False", "ReconcilerError", "Error seen: failed to delete pod: boom")
    assert c.errors == ("failed to delete pod: boom",)


def test_pod_step_failure_without_pod_reports_unknown() -> None:
    s = snap(sandbox(mode="Suspended", annotations={ANNOTATION_POD_NAME: "gone"}))
    status, _ = _run(s, Results(pod=StepResult(0, "failed to clear pod name annotation: boom")))
    assert _cond(status, "Suspended") == (
        "Unknown",
        "PodStateUnknown",
        "Pod state is unknown. Sandbox suspension cannot be confirmed",
    )
    assert _cond(status, "PodScheduled") == (
        "Unknown",
        "PodSchedulingUnknown",
        "Pod state is unknown. Pod scheduling cannot be determined",
    )


def test_pod_scheduled_mirrors_then_disappears_with_the_pod() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB})
    status, _ = _run(snap(sb, pods=[pod(phase="Pending", scheduled=("False", "Unschedulable", "no nodes"))]))
    assert _cond(status, "PodScheduled") == ("False", "Unschedulable", "no nodes")
    status, _ = _run(snap(sandbox(mode="Suspended", status=status)))
    assert _cond(status, "PodScheduled") is None


def test_errors_of_all_steps_are_joined_and_returned() -> None:
    s = snap(sandbox(vcts=[{"metadata": {"name": "d"}, "spec": {}}], service=True))
    results = Results(
        pvcs=StepResult(0, "failed to create PVC: a"),
        pod=StepResult(0, "failed to create pod: b"),
        service=StepResult(0, "failed to create service: c"),
    )
    status, c = _run(s, results)
    assert c.errors == ("failed to create PVC: a", "failed to create pod: b", "failed to create service: c")
    assert _cond(status, "Ready") == (
        "False",
        "ReconcilerError",
        "Error seen: failed to create PVC: a\nfailed to create pod: b\nfailed to create service: c",
    )


def test_conditions_do_not_accumulate_over_passes() -> None:
    s = snap(sandbox(annotations={ANNOTATION_POD_NAME: SB}), pods=[pod(phase="Running", scheduled=SCHED)])
    status, _ = _run(s)
    for _ in range(3):
        status, c = _run(
            snap(
                sandbox(annotations={ANNOTATION_POD_NAME: SB}, status=status),
                pods=[pod(phase="Running", scheduled=SCHED)],
            )
        )
        assert c.status_patch is None
    assert len(status["conditions"]) == 3


def test_a_pod_deleted_for_a_suspend_never_sets_finished() -> None:
    """The suspend's delete takes the Pod through phase Failed (kubelet, kwok): that is not the workload
    finishing, so no Finished - it used to start a claim's ttlSecondsAfterFinished (docs/lifecycle.md)."""
    sb = sandbox(mode="Suspended", annotations={ANNOTATION_POD_NAME: SB})
    status, _ = _run(snap(sb, pods=[pod(phase="Running", scheduled=SCHED)]))
    assert _cond(status, "Finished") is None
    sb = sandbox(mode="Suspended", annotations={ANNOTATION_POD_NAME: SB}, status=status)
    status, _ = _run(snap(sb, pods=[pod(phase="Failed", scheduled=SCHED, deleting=True)]))
    assert _cond(status, "Finished") is None
    assert _cond(status, "Suspended") == (
        "False",
        "PodTerminating",
        "Pod is terminating. Sandbox is suspending",
    )


def test_a_finished_pod_keeps_finished_and_its_time_while_being_deleted() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB})
    status, _ = _run(snap(sb, pods=[pod(phase="Succeeded", scheduled=SCHED)]))
    first = next(c for c in status["conditions"] if c["type"] == "Finished")
    assert (first["status"], first["reason"]) == ("True", "PodSucceeded")
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB}, status=status, generation=2)
    status, _ = _run(
        snap(sb, pods=[pod(phase="Succeeded", scheduled=SCHED, deleting=True)]), after=timedelta(hours=1)
    )
    kept = next(c for c in status["conditions"] if c["type"] == "Finished")
    # The claim's TTL starts at this time: a delete must not move it.
    assert kept["lastTransitionTime"] == first["lastTransitionTime"]
    assert (kept["status"], kept["reason"], kept["observedGeneration"]) == ("True", "PodSucceeded", 2)


# --------------------------------------------------------------------------- expiry (§1.10)


def test_requeue_until_shutdown_time() -> None:
    _, c = _run(snap(sandbox(shutdown_time=NOW + timedelta(hours=1))))
    assert c.requeue_after == 3600.0
    _, c = _run(snap(sandbox(shutdown_time=NOW + timedelta(seconds=1))))
    assert c.requeue_after == 2.0


def test_becoming_expired_during_the_pass_marks_and_requeues_fast() -> None:
    status, c = _run(snap(sandbox(shutdown_time=NOW + timedelta(seconds=1))), after=timedelta(seconds=2))
    assert _cond(status, "Ready") == ("False", "SandboxExpired", "Sandbox has expired")
    assert _cond(status, "PodScheduled") is None
    assert c.requeue_after == 0.001


def test_two_pass_expiry_keeps_finished_and_drops_podscheduled() -> None:
    sb_status = {
        "selector": "x",
        "podIPs": ["10.0.0.1"],
        "nodeName": "n1",
        "service": SB,
        "serviceFQDN": "f",
        "conditions": [
            {
                "type": "Finished",
                "status": "True",
                "reason": "PodSucceeded",
                "message": "Pod completed successfully",
                "observedGeneration": 1,
                "lastTransitionTime": T,
            },
            {
                "type": "PodScheduled",
                "status": "True",
                "reason": "PodScheduled",
                "message": "",
                "observedGeneration": 1,
                "lastTransitionTime": T,
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodSucceeded",
                "message": "Pod completed successfully",
                "observedGeneration": 1,
                "lastTransitionTime": T,
            },
        ],
    }
    sb = sandbox(shutdown_time=NOW, status=sb_status)
    status, c = _run(snap(sb, pods=[pod(phase="Succeeded")], svc=service()))
    assert c.requeue_after == 0.001
    assert status["podIPs"] == ["10.0.0.1"]  # pass 1 keeps everything else
    assert [x["type"] for x in status["conditions"]] == ["Finished", "Ready"]
    status2, c2 = _run(
        snap(sandbox(shutdown_time=NOW, status=status), pods=[pod(phase="Succeeded")], svc=service())
    )
    assert status2 == {"conditions": status["conditions"]}
    assert c2.requeue_after is None
    assert c2.errors == ()
    # A third pass (children gone) writes nothing.
    _, c3 = _run(snap(sandbox(shutdown_time=NOW, status=status2)))
    assert c3.status_patch is None


def test_teardown_errors_skip_the_status_reset() -> None:
    expired = {
        "podIPs": ["1.2.3.4"],
        "conditions": [
            {"type": "Ready", "status": "False", "reason": "SandboxExpired", "message": "Sandbox has expired"}
        ],
    }
    s = snap(sandbox(shutdown_time=NOW, status=expired), pods=[pod()], svc=service())
    _, c = _run(s, Results(teardown=(StepResult(0, "failed to delete pod: boom"), StepResult())))
    assert c.status_patch is None
    assert c.errors == ("failed to delete pod: boom",)


def test_delete_policy_drops_cleanup_errors_once_the_sandbox_is_deleted() -> None:
    expired = {
        "conditions": [{"type": "Ready", "status": "False", "reason": "SandboxExpired", "message": "m"}]
    }
    s = snap(sandbox(shutdown_time=NOW, shutdown_policy="Delete", status=expired), pods=[pod()])
    _, c = _run(s, Results(teardown=(StepResult(0, "failed to delete pod: boom"), StepResult())))
    assert c.sandbox_deleted
    assert c.errors == ()
    _, c = _run(s, Results(teardown=(StepResult(), StepResult(0, "failed to delete sandbox: nope"))))
    assert not c.sandbox_deleted
    assert c.errors == ("failed to delete sandbox: nope",)


# --------------------------------------------------------------------------- write-behind requeue (§1.12)


def test_deferred_write_requeues_within_window_and_clears_when_flushed() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB}, template_labels={"app": "x"})
    _, c = _run(snap(sb, pods=[pod()], write_behind_window=0.4))
    assert c.requeue_after == pytest.approx(0.4)
    assert not c.clear_deferral
    _, c = _run(snap(sb, pods=[pod()], write_behind_window=0.4, deferral_since=NOW - timedelta(seconds=1)))
    assert c.clear_deferral
    assert c.requeue_after is None


def test_deferral_requeue_is_the_smaller_of_expiry_and_window() -> None:
    sb = sandbox(
        annotations={ANNOTATION_POD_NAME: SB},
        template_labels={"app": "x"},
        shutdown_time=NOW + timedelta(hours=1),
    )
    _, c = _run(snap(sb, pods=[pod()], write_behind_window=0.3))
    assert c.requeue_after == pytest.approx(0.3)


# --------------------------------------------------------------------------- status diff (§1.11)


READY_TRUE = [{"type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "Pod is Ready"}]
READY_FALSE = [{"type": "Ready", "status": "False", "reason": "DependenciesNotReady", "message": "m"}]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({}, {"podIPs": [], "nodeName": "", "service": None}, None),
        ({"conditions": READY_FALSE}, {"conditions": READY_FALSE, "nodeName": "n1"}, None),
        (
            {"conditions": READY_FALSE},
            {"conditions": READY_TRUE, "nodeName": "n1"},
            {"status": {"conditions": READY_TRUE, "nodeName": "n1"}},
        ),
        (
            {"conditions": READY_TRUE, "nodeName": "n1"},
            {"conditions": READY_TRUE, "nodeName": "n2"},
            {"status": {"nodeName": "n2"}},
        ),
        ({"service": "s", "podIPs": ["1"]}, {}, {"status": {"service": None, "podIPs": None}}),
    ],
    ids=[
        "semantic-empties",
        "node-only-before-ready-held",
        "node-rides-with-ready",
        "node-after-ready-written",
        "removals-are-null",
    ],
)
def test_status_patch(old: dict[str, Any], new: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert status_patch(old, new) == expected


def test_node_name_rides_along_with_ready_transition() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB})
    status, _ = _run(snap(sb, pods=[pod(phase="Pending", scheduled=SCHED)]))
    _, c = _run(
        snap(
            sandbox(annotations={ANNOTATION_POD_NAME: SB}, status=status),
            pods=[pod(phase="Pending", node="n1", scheduled=SCHED)],
        )
    )
    assert c.status_patch is None  # nodeName only, not Ready yet
    ready = pod(phase="Running", ready=True, ips=["10.0.0.1"], node="n1", scheduled=SCHED)
    status2, c = _run(snap(sandbox(annotations={ANNOTATION_POD_NAME: SB}, status=status), pods=[ready]))
    assert c.status_patch is not None
    assert status2["nodeName"] == "n1"
    moved = pod(phase="Running", ready=True, ips=["10.0.0.1"], node="n2", scheduled=SCHED)
    _, c = _run(snap(sandbox(annotations={ANNOTATION_POD_NAME: SB}, status=status2), pods=[moved]))
    assert c.status_patch == {"status": {"nodeName": "n2"}}
