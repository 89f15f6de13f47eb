"""Typed models: parse/serialise every example, defaults, aliases, unknown-field round trips."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.api import (
    Condition,
    NameRef,
    PodTemplate,
    Sandbox,
    SandboxClaim,
    SandboxClaimSpec,
    SandboxSpec,
    SandboxTemplate,
    SandboxWarmPool,
    find_condition,
    v1alpha1,
    v1beta1,
)
from agent_sandbox.api import constants as c

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MODELS = {
    "agents.x-k8s.io/v1beta1": v1beta1.MODELS,
    "extensions.agents.x-k8s.io/v1beta1": v1beta1.MODELS,
    "agents.x-k8s.io/v1alpha1": v1alpha1.MODELS,
    "extensions.agents.x-k8s.io/v1alpha1": v1alpha1.MODELS,
}


def example_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc and doc.get("apiVersion") in MODELS:
                docs.append((f"{path.relative_to(EXAMPLES)}#{i}", doc))
    return docs


def is_subset(small: Any, big: Any) -> bool:
    """Every key/value of ``small`` appears in ``big`` (lists element-wise)."""
    if isinstance(small, dict):
        return isinstance(big, dict) and all(k in big and is_subset(v, big[k]) for k, v in small.items())
    if isinstance(small, list):
        return isinstance(big, list) and len(small) == len(big) and all(map(is_subset, small, big))
    return bool(small == big)


def test_examples_are_found() -> None:
    kinds = {doc["kind"] for _, doc in example_docs()}
    assert kinds == {"Sandbox", "SandboxTemplate", "SandboxWarmPool", "SandboxClaim"}
    assert len(example_docs()) >= 11


@pytest.mark.parametrize(("name", "doc"), example_docs(), ids=[n for n, _ in example_docs()])
def test_every_example_parses_and_serialises(name: str, doc: dict[str, Any]) -> None:
    model = MODELS[doc["apiVersion"]][doc["kind"]]
    obj = model.from_dict(doc)
    out = obj.to_dict()
    assert is_subset(doc, out), f"{name}: serialisation lost or changed fields"
    assert model.from_dict(out) == obj, f"{name}: not stable under a second round trip"
    assert out["apiVersion"] == doc["apiVersion"]


def test_sandbox_defaults_equal_crd_defaults() -> None:
    sb = Sandbox(spec=SandboxSpec(pod_template=PodTemplate(spec={"containers": [{"name": "c"}]})))
    assert sb.api_version == "agents.x-k8s.io/v1beta1"
    assert sb.kind == "Sandbox"
    assert sb.spec.operating_mode is c.OperatingMode.RUNNING
    assert sb.spec.shutdown_policy is c.ShutdownPolicy.RETAIN
    assert sb.spec.service is None  # tri-state: unset
    out = sb.to_dict()
    assert "status" not in out  # empty status omitted
    assert out["spec"] == {
        "podTemplate": {"metadata": {}, "spec": {"containers": [{"name": "c"}]}},
        "shutdownPolicy": "Retain",
        "operatingMode": "Running",
    }


def test_extension_defaults() -> None:
    tmpl = SandboxTemplate.from_dict({"spec": {"podTemplate": {"spec": {"containers": []}}}})
    assert tmpl.spec.network_policy_management == "Managed"
    assert tmpl.spec.env_vars_injection_policy == "Disallowed"
    assert tmpl.spec.volume_claim_templates_policy == "Disallowed"
    pool = SandboxWarmPool.from_dict({"spec": {"sandboxTemplateRef": {"name": "t"}}})
    assert pool.spec.replicas == 1
    assert pool.spec.update_strategy is None
    claim = SandboxClaim.from_dict({"spec": {"warmPoolRef": {"name": "p"}, "lifecycle": {}}})
    assert claim.spec.lifecycle is not None
    assert claim.spec.lifecycle.shutdown_policy == "Retain"
    alpha_claim = v1alpha1.SandboxClaim.from_dict({"spec": {"sandboxTemplateRef": {"name": "t"}}})
    assert alpha_claim.spec.warmpool == "default"
    assert v1alpha1.Sandbox.from_dict({"spec": {"podTemplate": {"spec": {}}}}).spec.replicas == 1
    with pytest.raises(ValueError, match="replicas"):
        v1alpha1.SandboxWarmPool.from_dict({"spec": {"sandboxTemplateRef": {"name": "t"}}})


def test_snake_case_and_alias_inputs_are_both_accepted() -> None:
    a = SandboxClaim(spec=SandboxClaimSpec(warm_pool_ref=NameRef(name="p")))
    b = SandboxClaim.from_dict({"spec": {"warmPoolRef": {"name": "p"}}})
    assert a == b
    assert a.to_dict()["spec"] == {"warmPoolRef": {"name": "p"}}


def test_unknown_fields_round_trip() -> None:
    doc = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "s", "uid": "u", "selfLink": "/x", "managedFields": [{"manager": "m"}]},
        "spec": {
            "podTemplate": {"spec": {"containers": [{"name": "c", "futureField": 1}]}},
            "newSpec": {"a": 1},
        },
        "status": {"futureStatus": True},
    }
    out = Sandbox.from_dict(doc).to_dict()
    assert out["metadata"]["selfLink"] == "/x"
    assert out["spec"]["newSpec"] == {"a": 1}
    assert out["spec"]["podTemplate"]["spec"]["containers"][0]["futureField"] == 1
    assert out["status"] == {"futureStatus": True}


def test_status_conditions_and_times() -> None:
    sb = Sandbox.from_dict(
        {
            "metadata": {"name": "s", "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": {"podTemplate": {"spec": {}}, "shutdownTime": "2026-12-31T23:59:59Z"},
            "status": {
                "podIPs": ["10.0.0.1"],
                "nodeName": "n1",
                "selector": "agents.x-k8s.io/sandbox-name-hash=abc",
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "SandboxSuspended", "message": "",
                     "lastTransitionTime": "2026-01-02T03:04:05Z", "observedGeneration": 3},
                ],
            },
        }
    )  # fmt: skip
    assert sb.spec.shutdown_time == dt.datetime(2026, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
    ready = find_condition(sb.status.conditions, c.CONDITION_READY)
    assert isinstance(ready, Condition)
    assert ready.status is c.ConditionStatus.FALSE
    assert ready.observed_generation == 3
    assert find_condition(sb.status.conditions, c.CONDITION_SUSPENDED) is None
    out = sb.to_dict()
    assert out["spec"]["shutdownTime"] == "2026-12-31T23:59:59Z"
    assert out["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert out["status"]["nodeName"] == "n1"


def test_invalid_enum_is_rejected() -> None:
    with pytest.raises(ValueError, match="operatingMode"):
        Sandbox.from_dict({"spec": {"podTemplate": {"spec": {}}, "operatingMode": "Paused"}})


def test_list_models() -> None:
    lst = v1beta1.SandboxList.from_dict(
        {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "SandboxList", "metadata": {"continue": "tok"},
         "items": [{"metadata": {"name": "a"}, "spec": {"podTemplate": {"spec": {}}}}]}
    )  # fmt: skip
    assert lst.metadata.continue_ == "tok"
    assert lst.items[0].metadata.name == "a"
