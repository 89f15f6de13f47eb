"""The Pod stage probe's bookkeeping: stage counts, states per namespace and stage latencies per window."""

from __future__ import annotations

from typing import Any

from benchmarks.pod_stage_probe import PodStages

from agent_sandbox.kube import WatchEvent


def pod(uid: str, *, node: str = "", ready: bool = False, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": uid, "namespace": "ns", "resourceVersion": "1"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]} if ready else {},
    }


def test_a_pods_stages_and_their_latencies_are_reported_once_per_window() -> None:
    stages = PodStages()
    stages.observe(WatchEvent("ADDED", pod("a")), 0.0)
    stages.observe(WatchEvent("ADDED", pod("b")), 0.0)
    stages.observe(WatchEvent("MODIFIED", pod("a", node="n")), 0.5)
    stages.observe(WatchEvent("MODIFIED", pod("a", node="n", ready=True)), 2.5)
    first = stages.window()
    assert first["counts"] == {"created": 2, "bound": 1, "ready": 1, "terminating": 0, "deleted": 0}
    assert first["by_namespace"] == {"ns": {"ready": 1, "unbound": 1}}
    assert first["create_to_bound_s"] == (0.5, 0.5)
    assert first["bound_to_ready_s"] == (2.0, 2.0)

    stages.observe(WatchEvent("MODIFIED", pod("a", node="n", ready=True, deleting=True)), 3.0)
    stages.observe(WatchEvent("DELETED", pod("a", node="n", ready=True, deleting=True)), 3.25)
    second = stages.window()
    assert second["counts"] == {"created": 0, "bound": 0, "ready": 0, "terminating": 1, "deleted": 1}
    assert second["by_namespace"] == {"ns": {"unbound": 1}}
    assert second["terminating_to_gone_s"] == (0.25, 0.25)
    assert second["bound_to_ready_s"] == (None, None)  # nothing in this window
