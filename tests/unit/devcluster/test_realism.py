"""Pure parts of the dev cluster's realism: stage rendering, storage classes, provisioner decisions, taints."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.config import (
    EXIT_AFTER_ANNOTATION,
    EXIT_CODE_ANNOTATION,
    HOST_PATH_ANNOTATION,
    NOT_READY_LABEL,
    POD_READINESS_EXPRESSION,
    PROVISIONER_NAME,
    PROVISIONER_USER,
    READINESS_ANNOTATION,
    READINESS_EXTERNAL,
    START_AFTER_ANNOTATION,
    STORAGE_CLASS_IMMEDIATE,
    STORAGE_CLASS_WFFC,
    TERMINATE_AT_ANNOTATION,
    ClusterConfig,
    kwok_stages_yaml,
    provisioner_binding_manifest,
    readiness_held_jq,
    storage_class_manifests,
)
from agent_sandbox.devcluster.provisioner import (
    PROVISIONED_BY_ANNOTATION,
    SELECTED_NODE_ANNOTATION,
    backing_dir,
    pv_manifest,
    should_delete,
    should_provision,
)
from agent_sandbox.devcluster.runtime_pods import runtime_pod_jq
from agent_sandbox.devcluster.simulation import pod_readiness_status, ready_status, with_taint, without_taint
from agent_sandbox.devcluster.state import ClusterState

pytestmark = pytest.mark.unit


def _stages(cfg: ClusterConfig | None = None) -> dict[str, Any]:
    docs = yaml.safe_load_all(kwok_stages_yaml(cfg or ClusterConfig()))
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Stage"}


def _selector(stage: dict[str, Any]) -> dict[str, str]:
    return {e["key"]: e["operator"] for e in stage["spec"]["selector"]["matchExpressions"]}


def _values(stage: dict[str, Any]) -> dict[str, list[str] | None]:
    return {e["key"]: e.get("values") for e in stage["spec"]["selector"]["matchExpressions"]}


# -- kwok stages --------------------------------------------------------------------------------------------
def test_stage_knobs_are_filled_from_the_config() -> None:
    text = kwok_stages_yaml(ClusterConfig(pod_grace_period_cap_ms=4321, pod_exit_delay_ms=765))
    assert "@@" not in text
    stages = _stages(ClusterConfig(pod_grace_period_cap_ms=4321, pod_exit_delay_ms=765))
    assert stages["pod-exit"]["spec"]["delay"]["durationMilliseconds"] == 765
    terminating = stages["pod-terminating"]["spec"]["steps"][0]["patch"]
    assert terminating["root"] == "metadata"
    assert "min (mul $grace 1000) 4321" in terminating["template"]


def test_pod_start_waits_the_configured_delay_plus_jitter_or_the_pods_own_start_after() -> None:
    start = _stages(ClusterConfig(pod_start_delay_ms=700, pod_start_jitter_ms=250))["pod-ready"]
    delay = start["spec"]["delay"]
    # kwok draws the delay uniformly from [durationMilliseconds, jitterDurationMilliseconds).
    assert (delay["durationMilliseconds"], delay["jitterDurationMilliseconds"]) == (700, 950)
    # The annotation sets both bounds, so a pod that names its start delay gets exactly that.
    own = f'.metadata.annotations["{START_AFTER_ANNOTATION}"]'
    assert delay["durationFrom"]["expressionFrom"] == own
    assert delay["jitterDurationFrom"]["expressionFrom"] == own
    instant = _stages(ClusterConfig(pod_start_delay_ms=0, pod_start_jitter_ms=0))["pod-ready"]["spec"][
        "delay"
    ]
    assert (instant["durationMilliseconds"], instant["jitterDurationMilliseconds"]) == (0, 0)


def test_defaults_start_pods_in_about_a_second() -> None:
    cfg = ClusterConfig()
    assert 500 <= cfg.pod_start_delay_ms <= cfg.pod_start_delay_ms + cfg.pod_start_jitter_ms <= 1500


def test_pods_whose_readiness_is_decided_elsewhere_start_running_but_not_ready() -> None:
    stages = _stages(ClusterConfig(pod_start_delay_ms=700, pod_start_jitter_ms=250))
    ready, held = stages["pod-ready"], stages["pod-start-held"]
    held_jq = readiness_held_jq()
    # One expression splits pending pods between the two stages: never both, never neither.
    assert _values(ready)[held_jq] == ["kwok"]
    assert _values(held)[held_jq] == ["held"]
    assert f'["{READINESS_ANNOTATION}"] == "{READINESS_EXTERNAL}"' in held_jq
    assert runtime_pod_jq() in held_jq  # runtime pods are held for the local runner
    assert held["spec"]["delay"] == ready["spec"]["delay"]  # both start after the same delay
    template = held["spec"]["next"]["statusTemplate"]
    assert template.count("reason: ContainersNotReady") == 2
    assert "ready: false" in template
    assert "ContainersNotReady" not in ready["spec"]["next"]["statusTemplate"]  # kwok's pods start Ready


def test_a_deleted_ready_pod_turns_not_ready_before_its_grace_period_starts() -> None:
    stages = _stages()
    not_ready, terminating = stages["pod-not-ready-on-delete"], stages["pod-terminating"]
    for stage in (not_ready, terminating):
        assert _selector(stage)[".metadata.deletionTimestamp"] == "Exists"
        assert _selector(stage)[f'.metadata.annotations["{TERMINATE_AT_ANNOTATION}"]'] == "DoesNotExist"
    # The same readiness expression splits deleted pods between the two stages: never both (kwok would pick
    # one at random), never neither.
    assert _values(not_ready)[POD_READINESS_EXPRESSION] == ["ready"]
    assert _values(terminating)[POD_READINESS_EXPRESSION] == ["not-ready"]
    template = not_ready["spec"]["next"]["statusTemplate"]
    assert template.count('status: "False"') == 2  # Ready and ContainersReady
    assert '$_ := set $status "ready" false' in template
    assert "phase" not in template  # containers keep running until the grace period ends


@pytest.mark.parametrize(
    "field", ["pod_grace_period_cap_ms", "pod_exit_delay_ms", "pod_start_delay_ms", "pod_start_jitter_ms"]
)
def test_negative_delays_are_rejected(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        kwok_stages_yaml(ClusterConfig(**{field: -1}))  # type: ignore[arg-type]


def test_graceful_deletion_is_three_stages_that_never_touch_finalizers() -> None:
    stages = _stages()
    terminating, terminated, delete = (stages[n] for n in ("pod-terminating", "pod-terminated", "pod-delete"))
    ann = f'.metadata.annotations["{TERMINATE_AT_ANNOTATION}"]'
    # Each step needs the previous one's result, so a deleted pod goes through them in order.
    assert _selector(terminating)[ann] == "DoesNotExist"
    assert _selector(terminated)[ann] == "Exists"
    assert _selector(delete)[ann] == "Exists"
    assert terminated["spec"]["delay"]["durationFrom"]["expressionFrom"] == ann
    assert _selector(delete)[".metadata.finalizers"] == "DoesNotExist"
    for stage in (terminating, terminated, delete):
        text = yaml.safe_dump(stage)
        assert "finalizers:" not in text.replace(".metadata.finalizers", "")
        assert "empty" not in text


def test_pod_exit_stage_reads_the_documented_annotations() -> None:
    stage = _stages()["pod-exit"]
    keys = list(_selector(stage))
    assert any(EXIT_CODE_ANNOTATION in k for k in keys)
    assert stage["spec"]["delay"]["durationFrom"]["expressionFrom"] == (
        f'.metadata.annotations["{EXIT_AFTER_ANNOTATION}"]'
    )
    assert EXIT_CODE_ANNOTATION in stage["spec"]["next"]["statusTemplate"]


def test_heartbeat_and_initialize_skip_nodes_simulated_not_ready() -> None:
    stages = _stages()
    label = f'.metadata.labels["{NOT_READY_LABEL}"]'
    assert _selector(stages["node-initialize"])[label] == "DoesNotExist"
    assert _selector(stages["node-heartbeat-with-lease"])[label] == "DoesNotExist"
    not_ready = stages["node-not-ready"]
    assert _selector(not_ready)[label] == "Exists"
    assert 'status: "False"' in not_ready["spec"]["next"]["statusTemplate"]


# -- storage classes and RBAC -------------------------------------------------------------------------------
@pytest.mark.parametrize("default", [STORAGE_CLASS_IMMEDIATE, STORAGE_CLASS_WFFC])
def test_exactly_one_storage_class_is_default(default: str) -> None:
    classes = storage_class_manifests(ClusterConfig(default_storage_class=default))
    modes = {c["metadata"]["name"]: c["volumeBindingMode"] for c in classes}
    assert modes == {STORAGE_CLASS_IMMEDIATE: "Immediate", STORAGE_CLASS_WFFC: "WaitForFirstConsumer"}
    defaults = [
        c["metadata"]["name"]
        for c in classes
        if c["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    ]
    assert defaults == [default]
    assert {c["provisioner"] for c in classes} == {PROVISIONER_NAME}


def test_unknown_default_storage_class_is_rejected() -> None:
    with pytest.raises(ValueError, match="default_storage_class"):
        storage_class_manifests(ClusterConfig(default_storage_class="fast"))


def test_provisioner_identity_gets_the_builtin_provisioner_role() -> None:
    binding = provisioner_binding_manifest()
    assert binding["roleRef"]["name"] == "system:persistent-volume-provisioner"
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": PROVISIONER_USER}
    ]


# -- provisioner decisions ----------------------------------------------------------------------------------
def _class(mode: str = "Immediate", provisioner: str = PROVISIONER_NAME, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "sc"},
        "provisioner": provisioner,
        "volumeBindingMode": mode,
        "reclaimPolicy": "Delete",
        **extra,
    }


def _claim(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    ann = {"volume.kubernetes.io/storage-provisioner": PROVISIONER_NAME, **(annotations or {})}
    return {
        "metadata": {"name": "data", "namespace": "ns", "uid": "u-1", "annotations": ann},
        "spec": {
            "storageClassName": "sc",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "2Gi"}},
            **spec,
        },
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    ("claim", "storage_class", "expected"),
    [
        (_claim(), _class(), True),
        (_claim(), None, False),
        (_claim(), _class(provisioner="other.example/p"), False),
        # Not yet handed to us by the PV controller (it may still bind a pre-existing PV).
        ({**_claim(), "metadata": {**_claim()["metadata"], "annotations": {}}}, _class(), False),
        (_claim(volumeName="pv-1"), _class(), False),
        (_claim(selector={"matchLabels": {"a": "b"}}), _class(), False),
        ({**_claim(), "status": {"phase": "Bound"}}, _class(), False),
        ({**_claim(), "metadata": {**_claim()["metadata"], "deletionTimestamp": "t"}}, _class(), False),
        (_claim(), _class("WaitForFirstConsumer"), False),
        (_claim({SELECTED_NODE_ANNOTATION: "n1"}), _class("WaitForFirstConsumer"), True),
    ],
)
def test_should_provision(
    claim: dict[str, Any], storage_class: dict[str, Any] | None, expected: bool
) -> None:
    assert should_provision(claim, storage_class, PROVISIONER_NAME) is expected


def test_immediate_claims_get_a_host_path_volume_usable_from_any_node(tmp_path: Path) -> None:
    pv = pv_manifest(_claim(), _class(mountOptions=["noatime"]), tmp_path, PROVISIONER_NAME)
    spec = pv["spec"]
    assert pv["metadata"]["name"] == "pvc-u-1"
    assert pv["metadata"]["annotations"] == {
        PROVISIONED_BY_ANNOTATION: PROVISIONER_NAME,
        HOST_PATH_ANNOTATION: str(tmp_path / "pvc-u-1"),
    }
    assert spec["hostPath"] == {"path": str(tmp_path / "pvc-u-1"), "type": "DirectoryOrCreate"}
    assert "nodeAffinity" not in spec
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "data",
        "uid": "u-1",
    }
    assert spec["capacity"] == {"storage": "2Gi"}
    assert spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["persistentVolumeReclaimPolicy"] == "Delete"
    assert spec["storageClassName"] == "sc"
    assert spec["mountOptions"] == ["noatime"]


def test_wait_for_first_consumer_claims_get_a_local_volume_pinned_to_the_selected_node(
    tmp_path: Path,
) -> None:
    claim = _claim({SELECTED_NODE_ANNOTATION: "kwok-node-1"})
    spec = pv_manifest(claim, _class("WaitForFirstConsumer", reclaimPolicy="Retain"), tmp_path, "p")["spec"]
    assert spec["local"] == {"path": str(tmp_path / "pvc-u-1")}
    assert "hostPath" not in spec
    term = spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
    assert term == {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["kwok-node-1"]}]
    }
    assert spec["persistentVolumeReclaimPolicy"] == "Retain"


def _pv(phase: str, policy: str = "Delete", by: str = PROVISIONER_NAME, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "pvc-1", "annotations": {PROVISIONED_BY_ANNOTATION: by}, **meta},
        "spec": {"persistentVolumeReclaimPolicy": policy, "hostPath": {"path": "/x/pvc-1"}},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("pv", "expected"),
    [
        (_pv("Released"), True),
        (_pv("Bound"), False),
        (_pv("Available"), False),
        (_pv("Released", policy="Retain"), False),
        (_pv("Released", by="someone.else/p"), False),
        (_pv("Released", deletionTimestamp="t"), False),
    ],
)
def test_should_delete(pv: dict[str, Any], expected: bool) -> None:
    assert should_delete(pv, PROVISIONER_NAME) is expected


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("{root}/pvc-1", True),
        ("{root}/../pvc-1", False),
        ("/etc", False),
        ("{root}", False),
        ("{root}/a/b", False),
    ],
)
def test_backing_dir_only_returns_direct_children_of_the_root(
    tmp_path: Path, path: str, inside: bool
) -> None:
    pv = {"spec": {"local": {"path": path.format(root=tmp_path)}}}
    got = backing_dir(pv, tmp_path)
    assert (got is not None) is inside
    if inside:
        assert got == tmp_path / "pvc-1"


def test_backing_dir_of_a_volume_without_a_path_is_none(tmp_path: Path) -> None:
    assert backing_dir({"spec": {"nfs": {"server": "x"}}}, tmp_path) is None


# -- node simulations ---------------------------------------------------------------------------------------
def test_with_taint_replaces_the_same_key_and_effect_only() -> None:
    taints = [{"key": "a", "effect": "NoSchedule", "value": "1"}, {"key": "a", "effect": "NoExecute"}]
    got = with_taint(taints, "a", "2", "NoSchedule")
    assert got == [{"key": "a", "effect": "NoExecute"}, {"key": "a", "value": "2", "effect": "NoSchedule"}]
    assert with_taint([], "b") == [{"key": "b", "effect": "NoSchedule"}]


@pytest.mark.parametrize(("key", "effect"), [("", "NoSchedule"), ("k", "Sometimes")])
def test_with_taint_rejects_bad_taints(key: str, effect: str) -> None:
    with pytest.raises(ValueError, match="taint"):
        with_taint([], key, effect=effect)


def test_without_taint_filters_by_key_and_optionally_effect() -> None:
    taints = [
        {"key": "a", "effect": "NoSchedule"},
        {"key": "a", "effect": "NoExecute"},
        {"key": "b", "effect": "NoSchedule"},
    ]
    assert without_taint(taints, "a") == [{"key": "b", "effect": "NoSchedule"}]
    assert without_taint(taints, "a", "NoExecute") == [taints[0], taints[2]]


def test_ready_status_reads_the_ready_condition() -> None:
    node = {
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "Unknown"},
            ]
        }
    }
    assert ready_status(node) == "Unknown"
    assert ready_status({"status": {}}) is None


def test_cluster_state_remembers_its_config(tmp_path: Path) -> None:
    cfg = ClusterConfig(name="x", pod_grace_period_cap_ms=1234, default_storage_class=STORAGE_CLASS_WFFC)
    state = ClusterState(
        name="x",
        directory=str(tmp_path),
        binaries=str(tmp_path),
        ports={},
        pod_cidr="127.10.0.0/16",
        kubeconfig=str(tmp_path / "kc"),
        server="https://127.0.0.1:1",
        nodes=[],
        config=asdict(cfg),
    )
    assert DevCluster(state).config == cfg
    # Through JSON, as the state file keeps it: a tuple knob comes back a tuple, not a list.
    flagged = ClusterConfig(name="x", apiserver_extra_args=("--v=2",))
    state.config = json.loads(json.dumps(asdict(flagged)))
    assert DevCluster(state).config == flagged
    # A state written before a knob existed (or with one since removed) still loads.
    state.config = {"name": "x", "gone_knob": 1}
    assert DevCluster(state).config == ClusterConfig(name="x")


def _running_pod(ready: bool) -> dict[str, Any]:
    value = "True" if ready else "False"
    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "main"}, {"name": "side"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": value, "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {"type": "ContainersReady", "status": value, "lastTransitionTime": "2026-01-01T00:00:01Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
            "containerStatuses": [
                {"name": "main", "ready": ready, "started": True, "state": {"running": {"startedAt": "x"}}},
                {"name": "side", "ready": ready, "started": True, "state": {"running": {"startedAt": "x"}}},
            ],
        },
    }


def test_pod_readiness_status_flips_ready_conditions_and_containers_and_keeps_the_rest() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    ready = pod_readiness_status(_running_pod(False), True, now=now)
    conds = {c["type"]: c for c in ready["conditions"]}
    assert set(conds) == {"Initialized", "PodScheduled", "Ready", "ContainersReady"}
    assert conds["Initialized"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert conds["Ready"] == {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-02T00:00:00Z"}
    assert [c["ready"] for c in ready["containerStatuses"]] == [True, True]
    assert ready["containerStatuses"][0]["state"] == {"running": {"startedAt": "x"}}

    not_ready = pod_readiness_status(_running_pod(True), False, now=now)
    cond = {c["type"]: c for c in not_ready["conditions"]}["ContainersReady"]
    assert cond["reason"] == "ContainersNotReady"
    assert cond["message"] == "containers with unready status: [main side]"
    assert [c["ready"] for c in not_ready["containerStatuses"]] == [False, False]
    # No change of status: the transition time stays.
    same = pod_readiness_status(_running_pod(True), True, now=now)
    assert {c["type"]: c for c in same["conditions"]}["Ready"]["lastTransitionTime"] == "2026-01-01T00:00:01Z"


def test_only_a_running_pod_can_be_reported_ready() -> None:
    pod = _running_pod(False)
    pod["status"]["phase"] = "Pending"
    with pytest.raises(ValueError, match="ns/p is Pending, not Running"):
        pod_readiness_status(pod, True)
