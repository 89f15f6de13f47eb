"""Pod cache transform and tracking-label index (spec §1.1; upstream pod_cache_transform_test.go)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.api.constants import LABEL_SANDBOX_NAME_HASH
from agent_sandbox.controllers.indexes import pod_name_hash_index
from agent_sandbox.controllers.sandbox import decide, pod_cache_transform
from agent_sandbox.controllers.sandbox.plan import PatchObject
from tests.unit.controllers.sandbox.builders import HASH, NOW, SB, pod, sandbox, snap

pytestmark = pytest.mark.unit


def _full_pod() -> dict[str, Any]:
    p = pod(phase="Running", ready=True, ips=["10.0.0.1"], node="n1")
    p["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    p["metadata"]["finalizers"] = ["example.com/x"]
    p["spec"] = {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}], "volumes": [{"name": "v"}]}
    return p


def test_transform_keeps_metadata_status_and_node_name_only() -> None:
    full = _full_pod()
    before = copy.deepcopy(full)
    out = pod_cache_transform(full)
    assert out["spec"] == {"nodeName": "n1"}
    assert "managedFields" not in out["metadata"]
    assert "finalizers" not in out["metadata"]
    assert out["status"] == before["status"]
    for key in ("labels", "ownerReferences", "uid", "resourceVersion"):
        assert out["metadata"][key] == before["metadata"][key]


def test_transform_passes_other_inputs_through() -> None:
    tombstone = {"kind": "DeletedFinalStateUnknown", "key": "ns/x"}
    assert pod_cache_transform(tombstone) is tombstone
    unscheduled = pod()
    unscheduled["spec"] = {"containers": []}
    assert pod_cache_transform(unscheduled)["spec"] == {}


def test_merge_patch_computed_on_transformed_pod_is_unaffected() -> None:
    sb = sandbox(template_labels={"app": "x"}, annotations={"agents.x-k8s.io/pod-name": SB})
    patches = []
    for candidate in (_full_pod(), pod_cache_transform(_full_pod())):
        plan = decide(snap(sb, pods=[candidate]), NOW)
        (action,) = plan.pod.actions
        assert isinstance(action, PatchObject)
        patches.append(action.patch)
    assert patches[0] == patches[1]
    assert set(patches[0]) == {"metadata"}  # metadata-only: stripped fields can never appear


def test_index_yields_the_tracking_label_value() -> None:
    assert list(pod_name_hash_index(pod(labels={LABEL_SANDBOX_NAME_HASH: HASH}))) == [HASH]
    assert list(pod_name_hash_index(pod(labels={LABEL_SANDBOX_NAME_HASH: ""}))) == [""]
    assert list(pod_name_hash_index(pod(labels={}))) == []
