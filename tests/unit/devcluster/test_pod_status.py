"""The runtime container's status as the local runner reports it (devcluster/pod_status.py): pure patches."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.devcluster.pod_status import config_error_patch, ready_condition, ready_patch

pytestmark = pytest.mark.unit

POD: dict[str, Any] = {
    "spec": {"containers": [{"name": "runtime"}, {"name": "sidecar"}]},
    "status": {
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "runtime", "ready": False}, {"name": "sidecar", "ready": True}],
    },
}


def test_ready_condition_reads_the_ready_type_only() -> None:
    assert ready_condition(POD) == "False"
    assert ready_condition({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}) is None


def test_a_crash_marks_only_the_runtime_container_terminated_with_137() -> None:
    patch = ready_patch(
        POD,
        ready=False,
        container="runtime",
        restarts=2,
        started_at="t0",
        message="runtime crashed",
        crashed=True,
    )
    runtime, sidecar = patch["status"]["containerStatuses"]
    assert runtime["lastState"]["terminated"]["exitCode"] == 137
    assert runtime["lastState"]["terminated"]["startedAt"] == "t0"
    assert "lastState" not in sidecar
    assert {s["restartCount"] for s in (runtime, sidecar)} == {2}
    ready = {c["type"]: c for c in patch["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ContainersNotReady",
        "runtime crashed",
    )


def test_ready_replaces_a_waiting_state_with_running() -> None:
    patch = ready_patch(POD, ready=True, container="runtime", restarts=0, started_at="t1", message="")
    runtime = patch["status"]["containerStatuses"][0]
    assert runtime["state"] == {"running": {"startedAt": "t1"}}
    assert runtime["started"] is True
    assert all(c["reason"] is None for c in patch["status"]["conditions"])


def test_a_config_error_waits_the_runtime_container_and_keeps_the_others() -> None:
    patch = config_error_patch(POD, container="runtime", message='secret "s" not found')
    runtime, sidecar = patch["status"]["containerStatuses"]
    assert runtime["state"] == {
        "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}
    }
    assert sidecar == {"name": "sidecar", "ready": True}
    ready = {c["type"]: c for c in patch["status"]["conditions"]}["Ready"]
    assert ready["message"] == "containers with unready status: [runtime sidecar]"
