"""Shared extension helpers: secure defaults, hashes, semantic blueprint comparison (controllers spec §3.8)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.api.meta import pool_update_strategy
from agent_sandbox.controllers.blueprint import (
    apply_secure_defaults,
    blueprint,
    blueprint_hash,
    blueprint_matches,
    is_secure_by_default,
    pod_template_hash,
    semantic_equal,
)

pytestmark = pytest.mark.unit

POD = {"containers": [{"name": "main", "image": "img:1"}]}


def tspec(**extra: Any) -> dict[str, Any]:
    return {"podTemplate": {"spec": copy.deepcopy(POD)}, **extra}


@pytest.mark.parametrize(
    ("extra", "pod_extra", "automount", "dns"),
    [
        pytest.param({}, {}, False, "None", id="managed-default-injects-public-dns"),
        pytest.param({"networkPolicyManagement": "Managed"}, {}, False, "None", id="explicit-managed"),
        pytest.param({"networkPolicy": {"egress": []}}, {}, False, None, id="custom-policy-leaves-dns"),
        pytest.param({"networkPolicyManagement": "Unmanaged"}, {}, False, None, id="unmanaged-leaves-dns"),
        pytest.param({}, {"dnsPolicy": "ClusterFirst"}, False, "ClusterFirst", id="explicit-dns-kept"),
        pytest.param(
            {}, {"automountServiceAccountToken": True}, True, "None", id="explicit-automount-true-kept"
        ),
        pytest.param(
            {}, {"automountServiceAccountToken": False}, False, "None", id="explicit-automount-false"
        ),
    ],
)
def test_secure_defaults(
    extra: dict[str, Any], pod_extra: dict[str, Any], automount: bool, dns: str | None
) -> None:
    spec = tspec(**extra)
    pod = {**POD, **pod_extra}
    out = apply_secure_defaults(spec, pod)
    assert out["automountServiceAccountToken"] is automount
    assert out.get("dnsPolicy") == dns
    if dns == "None":
        assert out["dnsConfig"] == {"nameservers": ["8.8.8.8", "1.1.1.1"]}
    else:
        assert "dnsConfig" not in out
    assert "automountServiceAccountToken" not in POD  # input untouched


def test_secure_by_default_modes() -> None:
    assert is_secure_by_default({})
    assert is_secure_by_default({"networkPolicyManagement": "Managed"})
    assert not is_secure_by_default({"networkPolicy": {}})
    assert not is_secure_by_default({"networkPolicyManagement": "Unmanaged"})


def test_blueprint_hash_changes_with_pod_spec_vcts_and_service_only() -> None:
    base = tspec()
    h = blueprint_hash(base)
    assert h == blueprint_hash(copy.deepcopy(base))
    assert len(h) == 8
    changed_image = tspec()
    changed_image["podTemplate"]["spec"]["containers"][0]["image"] = "img:2"
    assert blueprint_hash(changed_image) != h
    assert blueprint_hash(tspec(volumeClaimTemplates=[{"metadata": {"name": "d"}, "spec": {}}])) != h
    assert blueprint_hash(tspec(service=True)) != h
    assert blueprint_hash(tspec(service=False)) != h
    # Policies are not part of the blueprint.
    assert blueprint_hash(tspec(envVarsInjectionPolicy="Allowed", networkPolicyManagement="Unmanaged")) == h
    assert pod_template_hash(changed_image) != pod_template_hash(base)
    assert blueprint(tspec(volumeClaimTemplates=[], service=None)) == {"podTemplate": base["podTemplate"]}


def member_spec(template_spec: dict[str, Any]) -> dict[str, Any]:
    bp = copy.deepcopy(blueprint(template_spec))
    bp["podTemplate"]["spec"] = apply_secure_defaults(template_spec, bp["podTemplate"]["spec"])
    return bp


def test_controller_injected_defaults_are_not_drift() -> None:
    spec = tspec()
    assert blueprint_matches(spec, member_spec(spec))
    # nil automount on the member vs false after defaults: equal (pre-default members).
    legacy = member_spec(spec)
    legacy["podTemplate"]["spec"]["automountServiceAccountToken"] = False
    assert blueprint_matches(spec, legacy)


def test_dns_policy_change_is_drift() -> None:
    old = tspec()
    new = tspec()
    new["podTemplate"]["spec"]["dnsPolicy"] = "ClusterFirst"
    assert not blueprint_matches(new, member_spec(old))
    assert blueprint_matches(new, member_spec(new))


def test_metadata_only_changes_never_drift() -> None:
    spec = tspec(volumeClaimTemplates=[{"metadata": {"name": "d", "labels": {"a": "1"}}, "spec": {"x": 1}}])
    member = member_spec(spec)
    edited = copy.deepcopy(spec)
    edited["podTemplate"]["metadata"] = {"labels": {"new": "label"}, "annotations": {"n": "a"}}
    edited["volumeClaimTemplates"][0]["metadata"]["labels"] = {"b": "2"}
    edited["volumeClaimTemplates"][0]["metadata"]["annotations"] = {"c": "3"}
    assert blueprint_matches(edited, member)


VCT_A = {"metadata": {"name": "a"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}}
VCT_B = {"metadata": {"name": "b"}, "spec": {"resources": {"requests": {"storage": "2Gi"}}}}


@pytest.mark.parametrize(
    ("template_extra", "member_extra", "equal"),
    [
        pytest.param({"volumeClaimTemplates": [VCT_A]}, {}, False, id="vct-added"),
        pytest.param({}, {"volumeClaimTemplates": [VCT_A]}, False, id="vct-removed"),
        pytest.param(
            {"volumeClaimTemplates": [VCT_A, VCT_B]},
            {"volumeClaimTemplates": [VCT_B, VCT_A]},
            False,
            id="vct-order",
        ),
        pytest.param(
            {"volumeClaimTemplates": [VCT_A]},
            {
                "volumeClaimTemplates": [
                    {"metadata": {"name": "a"}, "spec": {"resources": {"requests": {"storage": "5Gi"}}}}
                ]
            },
            False,
            id="vct-spec",
        ),
        pytest.param(
            {"volumeClaimTemplates": [VCT_A]},
            {"volumeClaimTemplates": [{"metadata": {"name": "z"}, "spec": VCT_A["spec"]}]},
            False,
            id="vct-name",
        ),
        pytest.param(
            {"volumeClaimTemplates": [VCT_A]},
            {
                "volumeClaimTemplates": [
                    {"metadata": {"name": "a"}, "spec": {"resources": {"requests": {"storage": "1024Mi"}}}}
                ]
            },
            True,
            id="vct-quantity-by-value",
        ),
        pytest.param({"service": True}, {}, False, id="service-true-vs-unset"),
        pytest.param({"service": False}, {}, False, id="service-false-vs-unset"),
        pytest.param({"service": False}, {"service": False}, True, id="service-equal"),
        pytest.param({"volumeClaimTemplates": []}, {}, True, id="empty-vcts-vs-none"),
    ],
)
def test_blueprint_comparison(
    template_extra: dict[str, Any], member_extra: dict[str, Any], equal: bool
) -> None:
    spec = tspec(**template_extra)
    member = member_spec(tspec())
    member.update(copy.deepcopy(member_extra))
    assert blueprint_matches(spec, member) is equal


@pytest.mark.parametrize(
    "field",
    [
        pytest.param("podTemplate.spec", id="pod-spec"),
        pytest.param("volumeClaimTemplates", id="vcts"),
        pytest.param("service", id="service"),
    ],
)
def test_every_blueprint_field_is_compared(field: str) -> None:
    spec = tspec(volumeClaimTemplates=[VCT_A], service=True)
    member = member_spec(spec)
    assert blueprint_matches(spec, member)
    if field == "podTemplate.spec":
        member["podTemplate"]["spec"]["containers"][0]["image"] = "other"
    elif field == "volumeClaimTemplates":
        member["volumeClaimTemplates"] = [VCT_B]
    else:
        member["service"] = False
    assert not blueprint_matches(spec, member)
    assert set(blueprint(spec)) == {"podTemplate", "volumeClaimTemplates", "service"}


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ({"x": None}, {}, True),
        ({"x": []}, {}, True),
        ({"x": {}}, {"x": None}, True),
        ({"x": ""}, {}, False),
        ({"x": False}, {}, False),
        ({"x": [1]}, {"x": [1, 2]}, False),
        ({"limits": {"cpu": "1"}}, {"limits": {"cpu": "1000m"}}, True),
        ({"requests": {"memory": "1Gi"}}, {"requests": {"memory": "1073741824"}}, True),
        ({"requests": {"memory": "1G"}}, {"requests": {"memory": "1Gi"}}, False),
        ({"sizeLimit": "512Mi"}, {"sizeLimit": "0.5Gi"}, True),
        ({"image": "1"}, {"image": "1.0"}, False),  # not a quantity field
    ],
)
def test_semantic_equal(a: dict[str, Any], b: dict[str, Any], equal: bool) -> None:
    assert semantic_equal(a, b) is equal
    assert semantic_equal(b, a) is equal


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (None, "OnReplenish"),
        ({}, "OnReplenish"),
        ({"type": ""}, "OnReplenish"),
        ({"type": "Bogus"}, "OnReplenish"),
        ({"type": "OnReplenish"}, "OnReplenish"),
        ({"type": "Recreate"}, "Recreate"),
    ],
)
def test_effective_update_strategy(strategy: dict[str, str] | None, expected: str) -> None:
    spec: dict[str, Any] = {} if strategy is None else {"updateStrategy": strategy}
    assert pool_update_strategy({"spec": spec}) == expected
