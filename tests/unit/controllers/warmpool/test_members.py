"""Member shape (§3.8), staleness (§3.8.2), health helpers (§3.5) and event formatting (§3.10)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.api.meta import is_ready, sandbox_pod_name
from agent_sandbox.api.naming import template_ref_hash
from agent_sandbox.controllers.blueprint import blueprint_hash, pod_template_hash
from agent_sandbox.controllers.warmpool.members import (
    StalenessChecker,
    build_member,
    go_duration,
    pod_unschedulable,
)

from .fixtures import member, pool, template, unschedulable_pod

pytestmark = pytest.mark.unit


def build(
    tmpl: dict[str, Any] | None = None, *, eviction: bool = True, pool_obj: dict[str, Any] | None = None
) -> dict[str, Any]:
    tmpl = tmpl or template()
    return build_member(
        pool_obj or pool(),
        tmpl,
        pod_template_hash=pod_template_hash(tmpl["spec"]),
        blueprint_hash=blueprint_hash(tmpl["spec"]),
        enable_eviction=eviction,
    )


def test_member_labels_annotations_and_owner() -> None:
    tmpl = template()
    body = build(tmpl)
    meta = body["metadata"]
    assert meta["generateName"] == "pool-"
    assert "name" not in meta
    assert meta["namespace"] == "ns"
    hashes = {
        "agents.x-k8s.io/warm-pool-sandbox": naming.name_hash("pool"),
        "agents.x-k8s.io/sandbox-template-ref-hash": template_ref_hash("tmpl"),
        "agents.x-k8s.io/sandbox-pod-template-hash": pod_template_hash(tmpl["spec"]),
        "agents.x-k8s.io/sandbox-template-hash": blueprint_hash(tmpl["spec"]),
    }
    assert meta["labels"] == {
        **hashes,
        "agents.x-k8s.io/launch-type": "warm",
        "agents.x-k8s.io/created-by": "controller",
    }
    assert meta["annotations"] == {"agents.x-k8s.io/sandbox-template-ref": "tmpl"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxWarmPool",
            "name": "pool",
            "uid": "pool-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod_meta = body["spec"]["podTemplate"]["metadata"]
    assert pod_meta["labels"] == {"team": "a", **hashes}  # template labels copied, pool keys added
    assert pod_meta["annotations"] == {"note": "x", "cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}
    assert set(body["spec"]) == {"podTemplate"}  # no operatingMode, no lifecycle, no empty VCTs
    assert tmpl == template()  # the template is not modified


def test_member_copies_volume_claim_templates_and_service() -> None:
    vct = {"metadata": {"name": "data", "labels": {"x": "y"}}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    body = build(template(volumeClaimTemplates=[vct], service=True))
    assert body["spec"]["volumeClaimTemplates"] == [vct]
    assert body["spec"]["service"] is True


@pytest.mark.parametrize(
    ("extra", "pod_extra", "automount", "dns_policy"),
    [
        ({}, {}, False, "None"),
        ({}, {"automountServiceAccountToken": True}, True, "None"),
        ({"networkPolicy": {"ingress": []}}, {}, False, None),
        ({"networkPolicyManagement": "Unmanaged"}, {}, False, None),
    ],
)
def test_member_secure_defaults(
    extra: dict[str, Any], pod_extra: dict[str, Any], automount: bool, dns_policy: str | None
) -> None:
    tmpl = template(**extra)
    tmpl["spec"]["podTemplate"]["spec"].update(pod_extra)
    spec = build(tmpl)["spec"]["podTemplate"]["spec"]
    assert spec["automountServiceAccountToken"] is automount
    assert spec.get("dnsPolicy") == dns_policy


@pytest.mark.parametrize(
    ("eviction", "template_value", "expected"),
    [
        (True, None, "true"),
        (False, None, None),
        (True, "false", "false"),
        (False, "true", "true"),
        (True, "true", "true"),
        (False, "false", "false"),
    ],
)
def test_eviction_annotation_override(
    eviction: bool, template_value: str | None, expected: str | None
) -> None:
    tmpl = template()
    if template_value is not None:
        tmpl["spec"]["podTemplate"]["metadata"]["annotations"][c.ANNOTATION_SAFE_TO_EVICT] = template_value
    annotations = build(tmpl, eviction=eviction)["spec"]["podTemplate"]["metadata"]["annotations"]
    assert annotations.get(c.ANNOTATION_SAFE_TO_EVICT) == expected


def test_staleness_rules() -> None:
    tmpl = template()
    fresh = member("a", tmpl=tmpl)
    checker = StalenessChecker(tmpl, blueprint_hash(tmpl["spec"]))
    assert not checker.is_stale(fresh, orphan=False)
    # Different template name: stale even with an identical spec.
    other_name = template("other")
    assert StalenessChecker(other_name, blueprint_hash(other_name["spec"])).is_stale(fresh, orphan=False)
    # Image change: stale; metadata-only change: fresh (label hash mismatch falls back to the comparison).
    new_image = template(image="img:2")
    assert StalenessChecker(new_image, blueprint_hash(new_image["spec"])).is_stale(fresh, orphan=False)
    relabelled = template()
    relabelled["spec"]["podTemplate"]["metadata"]["labels"]["extra"] = "1"
    assert not StalenessChecker(relabelled, blueprint_hash(relabelled["spec"])).is_stale(fresh, orphan=False)
    # No computable hash: never stale (no mass deletion on a marshal failure).
    assert not StalenessChecker(new_image, "").is_stale(fresh, orphan=False)


def test_orphans_are_always_compared_semantically() -> None:
    tmpl = template()
    lying = member("o", tmpl=template(image="evil"), owner_uid=None)
    lying["metadata"]["labels"][c.LABEL_SANDBOX_TEMPLATE_HASH] = blueprint_hash(tmpl["spec"])  # forged label
    checker = StalenessChecker(tmpl, blueprint_hash(tmpl["spec"]))
    assert checker.is_stale(lying, orphan=True)
    honest = member("h", tmpl=tmpl, owner_uid=None)
    assert not checker.is_stale(honest, orphan=True)


def test_verdicts_are_cached_by_member_hash_within_a_pass() -> None:
    old = template(image="img:0")
    a, b = member("a", tmpl=old), member("b", tmpl=old)
    new = template(image="img:1")
    checker = StalenessChecker(new, blueprint_hash(new["spec"]))
    assert checker.is_stale(a, orphan=False)
    # Same hash label, different spec: the cached verdict is reused (one comparison per old hash).
    b["spec"]["podTemplate"]["spec"]["containers"][0]["image"] = "img:1"
    assert checker.is_stale(b, orphan=False)
    assert StalenessChecker(new, blueprint_hash(new["spec"])).is_stale(b, orphan=False) is False


def test_health_helpers() -> None:
    sb = member("m", ready=True)
    assert is_ready(sb)
    assert not is_ready(member("m", ready=False))
    assert not is_ready({"status": {}})
    assert sandbox_pod_name(sb) == "m"
    sb2 = copy.deepcopy(sb)
    sb2["metadata"]["annotations"][c.ANNOTATION_POD_NAME] = "real-pod"
    assert sandbox_pod_name(sb2) == "real-pod"
    sb2["metadata"]["annotations"][c.ANNOTATION_POD_NAME] = ""
    assert sandbox_pod_name(sb2) == "m"


def test_pod_unschedulable() -> None:
    pod = unschedulable_pod("p")
    assert pod_unschedulable(pod)
    assert not pod_unschedulable(None)
    deleting = copy.deepcopy(pod)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not pod_unschedulable(deleting)
    scheduled = copy.deepcopy(pod)
    scheduled["status"]["conditions"][0].update(status="True", reason="")
    assert not pod_unschedulable(scheduled)
    gated = copy.deepcopy(pod)
    gated["status"]["conditions"][0]["reason"] = "SchedulingGated"
    assert not pod_unschedulable(gated)
    assert not pod_unschedulable({"metadata": {}, "status": {"conditions": []}})


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300, "5m0s"),
        (60, "1m0s"),
        (3600, "1h0m0s"),
        (90.5, "1m30.5s"),
        (2, "2s"),
        (1.5, "1.5s"),
        (0.5, "500ms"),
        (0, "0s"),
        (0.0000015, "1.5µs"),
    ],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
