"""Pure child builders: Pod/PVC/Service shapes, reserved-key filtering, metadata repair, ports (spec §1.4-§1.8)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from agent_sandbox.api.constants import (
    ANNOTATION_PROPAGATED_ANNOTATIONS,
    ANNOTATION_PROPAGATED_LABELS,
    ANNOTATION_SAFE_TO_EVICT,
    ANNOTATION_TRACE_CONTEXT,
    LABEL_ADOPTABLE,
    LABEL_CLAIM_UID,
    LABEL_CREATED_BY,
    LABEL_SANDBOX_NAME_HASH,
    LABEL_SANDBOX_TEMPLATE_REF_HASH,
    LABEL_WARM_POOL_SANDBOX,
)
from agent_sandbox.api.naming import name_hash
from agent_sandbox.controllers.sandbox.children import (
    adoption_allowed,
    build_pod,
    build_pvc,
    build_service,
    extension_pod_labels,
    merge_volume_claim_volumes,
    owner_refs_with_controller,
    repair_pod_metadata,
    service_ports,
    service_ports_equal,
)
from tests.unit.controllers.sandbox.builders import HASH, SB, SB_UID, pod, ref, sandbox, vct

pytestmark = pytest.mark.unit

POOL_OWNER = ref("SandboxWarmPool", "pool", "uid-pool", api_version="extensions.agents.x-k8s.io/v1beta1")
CLAIM_OWNER = ref("SandboxClaim", "claim", "uid-claim", api_version="extensions.agents.x-k8s.io/v1alpha1")


# --------------------------------------------------------------------------- Pod creation (§1.5.1)


def test_build_pod_minimal_has_tracking_label_owner_and_no_annotations() -> None:
    sb = sandbox()
    p = build_pod(sb, HASH)
    assert p["metadata"]["name"] == SB
    assert p["metadata"]["labels"] == {LABEL_SANDBOX_NAME_HASH: HASH}
    assert "annotations" not in p["metadata"]
    assert p["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "name": SB,
            "uid": SB_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert p["spec"] == sb["spec"]["podTemplate"]["spec"]
    assert "hostname" not in p["spec"]
    assert "subdomain" not in p["spec"]


def test_build_pod_drops_reserved_template_keys_and_records_propagated_keys() -> None:
    sb = sandbox(
        template_labels={
            "app": "x",
            "team": "y",
            LABEL_SANDBOX_NAME_HASH: "evil",
            LABEL_CLAIM_UID: "c",
            "extensions.agents.x-k8s.io/z": "1",
        },
        template_annotations={
            "note": "n",
            ANNOTATION_TRACE_CONTEXT: "{}",
            "agents.x-k8s.io/pod-name": "other",
        },
    )
    p = build_pod(sb, HASH)
    assert p["metadata"]["labels"] == {"app": "x", "team": "y", LABEL_SANDBOX_NAME_HASH: HASH}
    assert p["metadata"]["annotations"] == {
        "note": "n",
        ANNOTATION_PROPAGATED_LABELS: "app,team",
        ANNOTATION_PROPAGATED_ANNOTATIONS: "note",
    }


def test_build_pod_reserved_keys_on_sandbox_metadata_never_reach_pod() -> None:
    sb = sandbox(
        labels={LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"},
        annotations={ANNOTATION_TRACE_CONTEXT: "{}"},
    )
    p = build_pod(sb, HASH)
    assert p["metadata"]["labels"] == {
        LABEL_SANDBOX_NAME_HASH: HASH
    }  # no extension owner -> no extension labels


@pytest.mark.parametrize(
    ("owner", "labels", "expected"),
    [
        (None, {LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"}, {}),
        (
            POOL_OWNER,
            {LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"},
            {LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"},
        ),
        (POOL_OWNER, {LABEL_WARM_POOL_SANDBOX: ""}, {}),
        (
            CLAIM_OWNER,
            {LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"},
            {LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"},
        ),
        (ref("Deployment", "d", "u", api_version="apps/v1"), {LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"}, {}),
        ({**POOL_OWNER, "controller": False}, {LABEL_WARM_POOL_SANDBOX: "p"}, {}),
    ],
    ids=["no-owner", "pool", "pool-empty-label", "claim-v1alpha1", "other-group", "non-controller-ref"],
)
def test_extension_pod_labels_follow_extension_ownership(
    owner: dict[str, Any] | None, labels: dict[str, str], expected: dict[str, str]
) -> None:
    assert extension_pod_labels(sandbox(owner=owner, labels=labels)) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("go-client", "go-client"),
        ("python-client", "python-client"),
        ("controller", "controller"),
        ("bogus", "unknown"),
        ("", None),
    ],
)
def test_build_pod_created_by_is_normalized(value: str, expected: str | None) -> None:
    p = build_pod(sandbox(labels={LABEL_CREATED_BY: value}), HASH)
    assert p["metadata"]["labels"].get(LABEL_CREATED_BY) == expected


def test_build_pod_adds_pvc_volumes_and_does_not_mutate_the_sandbox() -> None:
    sb = sandbox(
        vcts=[vct("data"), vct("cache")],
        volumes=[{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
    )
    before = copy.deepcopy(sb)
    p = build_pod(sb, HASH)
    assert p["spec"]["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "data", "persistentVolumeClaim": {"claimName": f"data-{SB}"}},
        {"name": "cache", "persistentVolumeClaim": {"claimName": f"cache-{SB}"}},
    ]
    assert sb == before


@pytest.mark.parametrize(
    ("existing", "pvc", "expected"),
    [
        ([{"name": "a"}], [], [{"name": "a"}]),
        (
            [{"name": "a"}, {"name": "b", "x": 1}],
            [{"name": "b", "y": 2}],
            [{"name": "a"}, {"name": "b", "y": 2}],
        ),
        ([{"name": "a"}], [{"name": "c"}], [{"name": "a"}, {"name": "c"}]),
        ([], [{"name": "c"}], [{"name": "c"}]),
    ],
    ids=["no-vct-noop", "replace-same-name", "append", "empty-existing"],
)
def test_merge_volume_claim_volumes(
    existing: list[dict[str, Any]], pvc: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    assert merge_volume_claim_volumes(existing, pvc) == expected


# --------------------------------------------------------------------------- PVCs (§1.4)


def test_build_pvc_copies_template_metadata_plus_tracking_label() -> None:
    sb = sandbox()
    p = build_pvc(vct("data", labels={"tier": "fast"}, annotations={"a": "b"}), sb, HASH)
    assert p["metadata"]["name"] == f"data-{SB}"
    assert p["metadata"]["labels"] == {"tier": "fast", LABEL_SANDBOX_NAME_HASH: HASH}
    assert p["metadata"]["annotations"] == {"a": "b"}
    assert p["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    assert p["spec"]["accessModes"] == ["ReadWriteOnce"]


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        ({}, False),
        ({LABEL_ADOPTABLE: "true"}, True),
        ({LABEL_ADOPTABLE: "yes"}, False),
        ({LABEL_SANDBOX_NAME_HASH: HASH}, True),
        ({LABEL_SANDBOX_NAME_HASH: "other"}, False),
    ],
)
def test_adoption_rule(labels: dict[str, str], allowed: bool) -> None:
    assert adoption_allowed(pod(labels=labels, owned=False), HASH) is allowed


# --------------------------------------------------------------------------- Pod repair (§1.6 step 2)


def _repair(p: dict[str, Any], sb: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], bool]:
    before = copy.deepcopy(p)
    result = repair_pod_metadata(p, sb, HASH)
    assert p == before, "repair must not mutate the cached Pod"
    return result


def test_repair_noop_for_a_pod_created_from_the_same_template() -> None:
    sb = sandbox(template_labels={"app": "x"}, template_annotations={"n": "1"})
    created = build_pod(sb, HASH)
    labels, _annotations, changed = _repair(created, sb)
    assert not changed
    assert labels == created["metadata"]["labels"]


def test_repair_sets_tracking_label_and_template_keys() -> None:
    sb = sandbox(template_labels={"app": "x"}, template_annotations={"n": "1"})
    labels, annotations, changed = _repair(pod(labels={}, owned=False), sb)
    assert changed
    assert labels == {LABEL_SANDBOX_NAME_HASH: HASH, "app": "x"}
    assert annotations == {
        "n": "1",
        ANNOTATION_PROPAGATED_LABELS: "app",
        ANNOTATION_PROPAGATED_ANNOTATIONS: "n",
    }


def test_repair_removes_keys_dropped_from_template_and_writes_empty_list() -> None:
    sb = sandbox()
    p = pod(
        labels={LABEL_SANDBOX_NAME_HASH: HASH, "app": "x", "keep": "me"},
        annotations={
            "n": "1",
            "other": "o",
            ANNOTATION_PROPAGATED_LABELS: "app",
            ANNOTATION_PROPAGATED_ANNOTATIONS: "n",
        },
    )
    labels, annotations, changed = _repair(p, sb)
    assert changed
    assert labels == {LABEL_SANDBOX_NAME_HASH: HASH, "keep": "me"}
    assert annotations == {
        "other": "o",
        ANNOTATION_PROPAGATED_LABELS: "",
        ANNOTATION_PROPAGATED_ANNOTATIONS: "",
    }


def test_repair_scrubs_stale_reserved_keys_recorded_by_older_controllers() -> None:
    sb = sandbox(template_labels={LABEL_CLAIM_UID: "c"})
    p = pod(
        labels={LABEL_SANDBOX_NAME_HASH: HASH, LABEL_CLAIM_UID: "c", LABEL_ADOPTABLE: "true"},
        annotations={
            ANNOTATION_TRACE_CONTEXT: "{}",
            ANNOTATION_PROPAGATED_LABELS: f"{LABEL_CLAIM_UID},{LABEL_SANDBOX_NAME_HASH},{LABEL_ADOPTABLE}",
            ANNOTATION_PROPAGATED_ANNOTATIONS: f"{ANNOTATION_TRACE_CONTEXT},{ANNOTATION_PROPAGATED_LABELS}",
        },
    )
    labels, annotations, changed = _repair(p, sb)
    assert changed
    assert labels == {LABEL_SANDBOX_NAME_HASH: HASH}  # tracking label survives the scrub
    assert annotations == {ANNOTATION_PROPAGATED_LABELS: "", ANNOTATION_PROPAGATED_ANNOTATIONS: ""}


def test_repair_strips_pool_markers_after_claim_adoption() -> None:
    # Pool-owned Sandbox Pod after a claim took the Sandbox over (§1.6 warm-pool effects).
    sb = sandbox(
        owner=CLAIM_OWNER, labels={LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"}
    )
    p = pod(
        labels={
            LABEL_SANDBOX_NAME_HASH: HASH,
            LABEL_WARM_POOL_SANDBOX: "p",
            LABEL_SANDBOX_TEMPLATE_REF_HASH: "t",
        },
        annotations={
            ANNOTATION_SAFE_TO_EVICT: "true",
            ANNOTATION_PROPAGATED_ANNOTATIONS: ANNOTATION_SAFE_TO_EVICT,
        },
    )
    labels, annotations, changed = _repair(p, sb)
    assert changed
    assert labels == {LABEL_SANDBOX_NAME_HASH: HASH, LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"}
    assert ANNOTATION_SAFE_TO_EVICT not in annotations


@pytest.mark.parametrize(
    ("sandbox_value", "pod_value", "expected"),
    [
        ("go-client", None, "go-client"),
        ("weird", "go-client", "unknown"),
        (None, "python-client", None),
        ("", "controller", None),
    ],
    ids=["propagated", "normalized-update", "removed", "empty-removed"],
)
def test_repair_created_by(sandbox_value: str | None, pod_value: str | None, expected: str | None) -> None:
    sb = sandbox(labels={LABEL_CREATED_BY: sandbox_value} if sandbox_value is not None else None)
    pod_labels = {LABEL_SANDBOX_NAME_HASH: HASH} | ({LABEL_CREATED_BY: pod_value} if pod_value else {})
    labels, _, _ = _repair(pod(labels=pod_labels), sb)
    assert labels.get(LABEL_CREATED_BY) == expected


def test_repair_extension_labels_added_kept_and_removed() -> None:
    pool_sb = sandbox(
        owner=POOL_OWNER, labels={LABEL_WARM_POOL_SANDBOX: "p", LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"}
    )
    labels, _, _ = _repair(pod(), pool_sb)
    assert labels[LABEL_WARM_POOL_SANDBOX] == "p"
    assert labels[LABEL_SANDBOX_TEMPLATE_REF_HASH] == "t"
    with_both = pod(
        labels={
            LABEL_SANDBOX_NAME_HASH: HASH,
            LABEL_WARM_POOL_SANDBOX: "p",
            LABEL_SANDBOX_TEMPLATE_REF_HASH: "t",
        }
    )
    labels, _, _ = _repair(with_both, sandbox())  # ownership gone
    assert LABEL_WARM_POOL_SANDBOX not in labels
    assert LABEL_SANDBOX_TEMPLATE_REF_HASH not in labels
    labels, _, _ = _repair(
        with_both, sandbox(owner=POOL_OWNER, labels={LABEL_SANDBOX_TEMPLATE_REF_HASH: "t"})
    )
    assert LABEL_WARM_POOL_SANDBOX not in labels
    assert labels[LABEL_SANDBOX_TEMPLATE_REF_HASH] == "t"


# --------------------------------------------------------------------------- Service (§1.8)


def _c(*ports: dict[str, Any], restart: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "c", "image": "i", "ports": list(ports)}
    if restart:
        c["restartPolicy"] = restart
    return c


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [
        ([{"name": "c", "image": "i"}], None, None),
        ([_c({"containerPort": 0})], None, None),
        ([_c({"containerPort": 8080})], None, [("p-8080-tcp", "TCP", 8080)]),
        (
            [_c({"containerPort": 9000, "protocol": "UDP"}, {"containerPort": 80, "name": "http"})],
            [_c({"containerPort": 7000, "name": "side"}, restart="Always"), _c({"containerPort": 6000})],
            [("http", "TCP", 80), ("side", "TCP", 7000), ("p-9000-udp", "UDP", 9000)],
        ),
        (
            [
                _c(
                    {"containerPort": 80},
                    {"containerPort": 80, "name": "web"},
                    {"containerPort": 80, "name": "late"},
                )
            ],
            None,
            [("web", "TCP", 80)],
        ),
        (
            [_c({"containerPort": 80, "name": "web"}, {"containerPort": 81, "name": "web"})],
            None,
            [("web", "TCP", 80), ("p-81-tcp", "TCP", 81)],
        ),
        (
            [
                _c(
                    {"containerPort": 80, "name": "p-81-tcp"},
                    {"containerPort": 81},
                    {"containerPort": 82, "name": "p-81-tcp-2"},
                )
            ],
            None,
            [("p-81-tcp", "TCP", 80), ("p-81-tcp-3", "TCP", 81), ("p-81-tcp-2", "TCP", 82)],
        ),
        (
            [_c({"containerPort": 53, "protocol": "UDP"}, {"containerPort": 53, "protocol": "TCP"})],
            None,
            [("p-53-tcp", "TCP", 53), ("p-53-udp", "UDP", 53)],
        ),
    ],
    ids=[
        "no-ports",
        "zero-port",
        "single",
        "sidecars-sorted",
        "first-name-wins",
        "name-claimed",
        "suffixes",
        "protocol-sort",
    ],
)
def test_service_ports(
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None,
    expected: list[tuple[str, str, int]] | None,
) -> None:
    ports = service_ports(sandbox(containers=containers, init_containers=init))
    if expected is None:
        assert ports is None
    else:
        assert ports == [{"name": n, "protocol": pr, "port": po, "targetPort": po} for n, pr, po in expected]


def test_service_ports_equal_ignores_unmanaged_fields() -> None:
    desired = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 80}]
    assert service_ports_equal([{**desired[0], "appProtocol": "h2c", "nodePort": 30000}], desired)
    assert service_ports_equal([{"name": "http", "port": 80, "targetPort": 80}], desired)  # TCP default
    assert not service_ports_equal([{**desired[0], "targetPort": "80"}], desired)
    assert not service_ports_equal(None, desired)
    assert service_ports_equal(None, None)


def test_build_service_is_headless_and_selects_the_tracking_label() -> None:
    svc = build_service(sandbox(containers=[_c({"containerPort": 8080})]), HASH)
    assert svc["spec"] == {
        "clusterIP": "None",
        "selector": {LABEL_SANDBOX_NAME_HASH: HASH},
        "ports": [{"name": "p-8080-tcp", "protocol": "TCP", "port": 8080, "targetPort": 8080}],
    }
    assert svc["metadata"]["labels"] == {LABEL_SANDBOX_NAME_HASH: HASH}
    assert "ports" not in build_service(sandbox(), HASH)["spec"]


def test_name_hash_matches_independent_fnv1a() -> None:
    # TestNameHash_Correctness: 8 lowercase hex digits of 32-bit FNV-1a, for fixed and random inputs.
    def reference(s: str) -> str:
        h = 0x811C9DC5
        for b in s.encode():
            h = ((h ^ b) * 0x01000193) % 2**32
        return format(h, "08x")

    rng = random.Random(7)
    samples = ["", "a", SB, "sandbox-name"] + [
        "".join(rng.choice("abcxyz-0é") for _ in range(rng.randint(0, 40))) for _ in range(200)
    ]
    for s in samples:
        assert name_hash(s) == reference(s)
        assert len(name_hash(s)) == 8


@pytest.mark.parametrize("api_version", ["agents.x-k8s.io/v1beta1", "agents.x-k8s.io/v1alpha1"])
def test_taking_control_replaces_a_reference_to_the_same_sandbox(api_version: str) -> None:
    # A user set the Sandbox's reference to `controller: false`: taking control again must not leave two
    # references to one Sandbox (controller-runtime's SetControllerReference replaces the same object's).
    other = ref("ConfigMap", "keep", "cm-uid", api_version="v1", controller=False)
    child = pod()
    child["metadata"]["ownerReferences"] = [ref(api_version=api_version, controller=False), other]
    refs = owner_refs_with_controller(child, sandbox())
    assert refs == [other, ref()]
