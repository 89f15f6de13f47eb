"""SandboxTemplate decisions (controllers spec §2, pinned cases of §6.2)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import new_controller_ref
from agent_sandbox.api.naming import template_ref_hash
from agent_sandbox.controllers.template.decide import (
    CreatePolicy,
    DeletePolicy,
    PatchTemplateLabel,
    RefuseForeignPolicy,
    TemplateSnapshot,
    UpdatePolicy,
    decide,
    desired_policy_spec,
    policy_name,
)

pytestmark = pytest.mark.unit

UID = "tmpl-uid"


def template(**spec: Any) -> dict[str, Any]:
    labels = spec.pop("labels", {c.LABEL_SANDBOX_TEMPLATE_REF_HASH: template_ref_hash("tmpl")})
    meta: dict[str, Any] = {"name": "tmpl", "namespace": "ns", "uid": UID, "labels": labels}
    if spec.pop("deleting", False):
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}, **spec},
    }


def policy(spec: dict[str, Any], *, owner_uid: str | None = UID) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": policy_name("tmpl"),
        "namespace": "ns",
        "uid": "np-uid",
        "resourceVersion": "7",
    }
    if owner_uid is not None:
        meta["ownerReferences"] = [
            new_controller_ref(
                api_version=c.EXTENSIONS_API_VERSION, kind="SandboxTemplate", name="tmpl", uid=owner_uid
            )
        ]
    return {"metadata": meta, "spec": spec}


def test_default_secure_policy_content() -> None:
    plan = decide(TemplateSnapshot(template(), None))
    assert len(plan.actions) == 1
    action = plan.actions[0]
    assert isinstance(action, CreatePolicy)
    body = action.body
    assert body["metadata"]["name"] == "tmpl-network-policy"
    assert body["metadata"]["namespace"] == "ns"
    assert body["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxTemplate",
            "name": "tmpl",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert body["spec"] == {
        "podSelector": {
            "matchLabels": {"agents.x-k8s.io/sandbox-template-ref-hash": template_ref_hash("tmpl")}
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}
                        },
                        "podSelector": {"matchLabels": {"app": "sandbox-router"}},
                    }
                ]
            }
        ],
        "egress": [
            {
                "to": [
                    {
                        "ipBlock": {
                            "cidr": "0.0.0.0/0",
                            "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"],
                        }
                    },
                    {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
                ]
            }
        ],
    }


def test_policy_selects_template_backed_pods_by_ref_hash() -> None:
    spec = desired_policy_spec(template())
    assert spec["podSelector"] == {
        "matchLabels": {c.LABEL_SANDBOX_TEMPLATE_REF_HASH: template_ref_hash("tmpl")}
    }


def test_custom_policy_rules_are_copied_with_controller_selector() -> None:
    rules = {"ingress": [{"from": [{"podSelector": {"matchLabels": {"a": "b"}}}]}], "egress": []}
    plan = decide(TemplateSnapshot(template(networkPolicy=rules), None))
    (action,) = plan.actions
    assert isinstance(action, CreatePolicy)
    assert action.body["spec"]["ingress"] == rules["ingress"]
    assert action.body["spec"]["egress"] == []  # empty list: deny all egress
    assert action.body["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert action.body["spec"]["podSelector"]["matchLabels"] == {
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: template_ref_hash("tmpl")
    }


@pytest.mark.parametrize(
    ("existing", "owner", "expected"),
    [
        pytest.param(None, None, [], id="unmanaged-no-policy-creates-nothing"),
        pytest.param({"podSelector": {}}, UID, [DeletePolicy], id="unmanaged-deletes-owned"),
        pytest.param({"podSelector": {}}, "someone-else", [], id="unmanaged-keeps-foreign"),
        pytest.param({"podSelector": {}}, "none", [], id="unmanaged-keeps-unowned"),
    ],
)
def test_unmanaged(existing: dict[str, Any] | None, owner: str | None, expected: list[type]) -> None:
    pol = None if existing is None else policy(existing, owner_uid=None if owner == "none" else owner)
    plan = decide(TemplateSnapshot(template(networkPolicyManagement="Unmanaged"), pol))
    assert [type(a) for a in plan.actions] == expected


def test_spec_drift_is_updated_keeping_resource_version() -> None:
    desired = desired_policy_spec(template())
    drifted = copy.deepcopy(desired)
    drifted["egress"] = []
    plan = decide(TemplateSnapshot(template(), policy(drifted)))
    (action,) = plan.actions
    assert isinstance(action, UpdatePolicy)
    assert action.body["spec"] == desired
    assert action.body["metadata"]["resourceVersion"] == "7"


def test_in_sync_policy_needs_nothing() -> None:
    assert decide(TemplateSnapshot(template(), policy(desired_policy_spec(template())))).actions == ()


def test_server_omitted_empty_lists_and_defaulted_port_protocol_are_not_drift() -> None:
    rules = {"ingress": [], "egress": [{"ports": [{"port": 53}]}]}
    tmpl = template(networkPolicy=rules)
    stored = desired_policy_spec(tmpl)
    del stored["ingress"]  # the API server omits an empty list
    stored["egress"][0]["ports"][0]["protocol"] = "TCP"  # and defaults the protocol
    assert decide(TemplateSnapshot(tmpl, policy(stored))).actions == ()


@pytest.mark.parametrize("owner", ["someone-else", None])
def test_never_updates_or_deletes_a_policy_it_does_not_control(owner: str | None) -> None:
    plan = decide(TemplateSnapshot(template(), policy({"podSelector": {}}, owner_uid=owner)))
    assert [type(a) for a in plan.actions] == [RefuseForeignPolicy]
    assert "refusing to update NetworkPolicy ns/tmpl-network-policy" in plan.actions[0].message  # type: ignore[union-attr]


@pytest.mark.parametrize("labels", [{}, {c.LABEL_SANDBOX_TEMPLATE_REF_HASH: "wrong"}, None])
def test_ref_hash_label_stamped_when_missing_or_wrong(labels: dict[str, str] | None) -> None:
    plan = decide(TemplateSnapshot(template(labels=labels), policy(desired_policy_spec(template()))))
    assert plan.actions == (PatchTemplateLabel(template_ref_hash("tmpl")),)
    assert plan.actions[0].patch() == {  # type: ignore[union-attr]
        "metadata": {"labels": {"agents.x-k8s.io/sandbox-template-ref-hash": template_ref_hash("tmpl")}}
    }


def test_deleting_template_does_nothing() -> None:
    assert decide(TemplateSnapshot(template(labels={}, deleting=True), None)).actions == ()


def test_template_ref_hash_deterministic_and_distinct() -> None:
    names = ["", "a", "tmpl", "test-template", "other"]
    hashes = [template_ref_hash(n) for n in names]
    assert hashes == [template_ref_hash(n) for n in names]
    assert all(len(h) == 8 and int(h, 16) >= 0 for h in hashes)
    assert len(set(hashes)) == len(names)
    assert template_ref_hash("test-template") == "69155462"
