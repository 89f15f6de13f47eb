"""Cold-start shape: env injection, volumeClaimTemplates merge, the cold Sandbox body (spec §4.7, §6.4)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.controllers.claim.errors import (
    EnvVarsInjectionRejected,
    ReconcilerError,
    VolumeClaimTemplatesError,
)
from agent_sandbox.controllers.claim.shape import build_cold_sandbox, inject_env, merge_volume_claim_templates
from tests.unit.controllers.claim.builders import claim, template

pytestmark = pytest.mark.unit


def _pod(**extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "initContainers": [{"name": "init", "env": [{"name": "I", "value": "0"}]}],
        "containers": [
            {
                "name": "main",
                "env": [{"name": "A", "value": "1"}, {"name": "S", "valueFrom": {"secretKeyRef": {}}}],
            },
            {"name": "side"},
        ],
    }
    pod.update(extra)
    return pod


def _env(**entries: str) -> list[dict[str, str]]:
    out = []
    for key, value in entries.items():
        name, _, target = key.partition("__")
        out.append({"name": name, "value": value, **({"containerName": target} if target else {})})
    return out


def test_env_allowed_appends_to_first_container_and_targets() -> None:
    pod = _pod()
    inject_env({"envVarsInjectionPolicy": "Allowed"}, pod, _env(B="2", C__side="3", J__init="4"))
    assert pod["containers"][0]["env"] == [
        {"name": "A", "value": "1"},
        {"name": "S", "valueFrom": {"secretKeyRef": {}}},
        {"name": "B", "value": "2"},
    ]
    assert pod["containers"][1]["env"] == [{"name": "C", "value": "3"}]
    assert pod["initContainers"][0]["env"] == [{"name": "I", "value": "0"}, {"name": "J", "value": "4"}]


def test_env_first_container_gets_named_then_default_entries() -> None:
    pod = _pod()
    inject_env({"envVarsInjectionPolicy": "Allowed"}, pod, [*_env(D="d"), *_env(N__main="n")])
    assert [v["name"] for v in pod["containers"][0]["env"]] == ["A", "S", "N", "D"]


def test_env_overrides_replaces_in_place_and_drops_value_from() -> None:
    pod = _pod()
    inject_env({"envVarsInjectionPolicy": "Overrides"}, pod, _env(S="plain", A="9"))
    assert pod["containers"][0]["env"] == [{"name": "A", "value": "9"}, {"name": "S", "value": "plain"}]


@pytest.mark.parametrize("policy", ["Disallowed", None])
def test_env_disallowed_or_unset_policy_rejects(policy: str | None) -> None:
    spec = {"envVarsInjectionPolicy": policy} if policy else {}
    with pytest.raises(EnvVarsInjectionRejected, match="not allowed by the template policy"):
        inject_env(spec, _pod(), _env(B="2"))


def test_env_allowed_rejects_override_of_template_variable() -> None:
    with pytest.raises(
        ReconcilerError, match='override is not allowed by the template policy for variable "A"'
    ):
        inject_env({"envVarsInjectionPolicy": "Allowed"}, _pod(), _env(A="x"))


@pytest.mark.parametrize("field", ["containers", "initContainers"])
def test_env_allowed_rejects_env_from_in_target(field: str) -> None:
    pod = _pod()
    pod[field][0]["envFrom"] = [{"configMapRef": {"name": "cm"}}]
    target = "" if field == "containers" else "init"
    entry = {"name": "B", "value": "2", **({"containerName": target} if target else {})}
    with pytest.raises(EnvVarsInjectionRejected, match="uses EnvFrom sources"):
        inject_env({"envVarsInjectionPolicy": "Allowed"}, pod, [entry])
    # Overrides may (it is allowed to replace whatever envFrom provides)
    inject_env({"envVarsInjectionPolicy": "Overrides"}, copy.deepcopy(pod), [entry])


def test_env_unknown_container() -> None:
    with pytest.raises(
        ReconcilerError, match='target container "nope" not found in template for environment variable "X"'
    ):
        inject_env({"envVarsInjectionPolicy": "Overrides"}, _pod(), [*_env(X__nope="1"), *_env(Y__nope="2")])


def _vct(name: str, size: str = "1Gi") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"resources": {"requests": {"storage": size}}}}


def test_vct_no_claim_entries_keep_template_list_without_policy() -> None:
    assert merge_volume_claim_templates({"volumeClaimTemplates": [_vct("data")]}, []) == [_vct("data")]


def test_vct_overrides_replace_by_name_then_append() -> None:
    tspec = {"volumeClaimTemplatesPolicy": "Overrides", "volumeClaimTemplates": [_vct("a"), _vct("b")]}
    merged = merge_volume_claim_templates(tspec, [_vct("new"), _vct("b", "5Gi")])
    assert merged == [_vct("a"), _vct("b", "5Gi"), _vct("new")]


def test_vct_allowed_appends() -> None:
    tspec = {"volumeClaimTemplatesPolicy": "Allowed", "volumeClaimTemplates": [_vct("a")]}
    assert merge_volume_claim_templates(tspec, [_vct("b")]) == [_vct("a"), _vct("b")]


VCT_ERRORS = [
    ("disallowed", {"volumeClaimTemplatesPolicy": "Disallowed"}, [_vct("b")], "disallowed by the template"),
    ("unset policy", {}, [_vct("b")], "disallowed by the template"),
    (
        "override under Allowed",
        {"volumeClaimTemplatesPolicy": "Allowed", "volumeClaimTemplates": [_vct("a")]},
        [_vct("a")],
        'cannot override template volume "a"',
    ),
    (
        "empty claim name",
        {"volumeClaimTemplatesPolicy": "Allowed"},
        [{"spec": {}}],
        "claim: volume claim template at index 0",
    ),
    (
        "duplicate claim names",
        {"volumeClaimTemplatesPolicy": "Allowed"},
        [_vct("x"), _vct("x")],
        "claim: duplicate",
    ),
    (
        "duplicate template names",
        {"volumeClaimTemplatesPolicy": "Allowed", "volumeClaimTemplates": [_vct("t"), _vct("t")]},
        [_vct("x")],
        "template: duplicate",
    ),
]


@pytest.mark.parametrize(
    ("case", "tspec", "claim_vcts", "fragment"), VCT_ERRORS, ids=[v[0] for v in VCT_ERRORS]
)
def test_vct_errors(
    case: str, tspec: dict[str, Any], claim_vcts: list[dict[str, Any]], fragment: str
) -> None:
    with pytest.raises(VolumeClaimTemplatesError) as err:
        merge_volume_claim_templates(tspec, claim_vcts)
    assert str(err.value).startswith("failed to merge volume claim templates: ")
    assert fragment in str(err.value)


def test_vct_invalid_template_list_without_claim_entries() -> None:
    with pytest.raises(VolumeClaimTemplatesError, match="invalid volume claim templates in template"):
        merge_volume_claim_templates({"volumeClaimTemplates": [{"spec": {}}]}, [])


def test_vct_unknown_policy_is_a_plain_error() -> None:
    with pytest.raises(ReconcilerError, match="unknown volumeClaimTemplatesPolicy"):
        merge_volume_claim_templates({"volumeClaimTemplatesPolicy": "Weird"}, [_vct("x")])


def test_cold_sandbox_body() -> None:
    tmpl = template(volumeClaimTemplates=[_vct("data")])
    cl = claim(
        labels={c.LABEL_CREATED_BY: "python-client"},
        annotations={c.ANNOTATION_TRACE_CONTEXT: '{"traceparent":"00-a-b-01"}'},
        additionalPodMetadata={"labels": {"sandbox.users.io/t": "1"}, "annotations": {"note": "n"}},
    )
    body = build_cold_sandbox(cl, tmpl)
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("c1", "ns")
    assert meta["labels"] == {
        c.LABEL_CLAIM_UID: "c1-uid",
        c.LABEL_CREATED_BY: "python-client",
        c.LABEL_LAUNCH_TYPE: "cold",
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: naming.name_hash("tmpl"),
    }
    assert meta["annotations"] == {
        c.ANNOTATION_SANDBOX_TEMPLATE_REF: "tmpl",
        c.ANNOTATION_TRACE_CONTEXT: '{"traceparent":"00-a-b-01"}',
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "name": "c1",
            "uid": "c1-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = body["spec"]
    assert "shutdownTime" not in spec
    assert "operatingMode" not in spec
    assert "lifecycle" not in spec
    assert spec["volumeClaimTemplates"] == [_vct("data")]  # template VCTs are copied
    pod_meta = spec["podTemplate"]["metadata"]
    assert pod_meta["labels"] == {
        "app": "demo",
        c.LABEL_CLAIM_UID: "c1-uid",
        c.LABEL_CREATED_BY: "python-client",
        c.LABEL_SANDBOX_TEMPLATE_REF_HASH: naming.name_hash("tmpl"),
        "sandbox.users.io/t": "1",
    }
    assert pod_meta["annotations"] == {"team": "x", "note": "n"}
    pod = spec["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["dnsPolicy"] == "None"
    assert pod["dnsConfig"] == {"nameservers": ["8.8.8.8", "1.1.1.1"]}
    assert "dnsPolicy" not in tmpl["spec"]["podTemplate"]["spec"]  # input untouched


def test_cold_sandbox_keeps_explicit_automount_and_custom_policy_dns() -> None:
    tmpl = template(networkPolicy={"egress": []})
    tmpl["spec"]["podTemplate"]["spec"]["automountServiceAccountToken"] = True
    body = build_cold_sandbox(claim(), tmpl)
    pod = body["spec"]["podTemplate"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert "dnsPolicy" not in pod
    assert "dnsConfig" not in pod
    assert c.LABEL_CREATED_BY not in body["metadata"]["labels"]  # claim has none: absent


def test_cold_sandbox_env_injected_and_claim_vcts_merged() -> None:
    tmpl = template(envVarsInjectionPolicy="Allowed", volumeClaimTemplatesPolicy="Allowed")
    body = build_cold_sandbox(
        claim(env=[{"name": "K", "value": "v"}], volumeClaimTemplates=[_vct("extra")]), tmpl
    )
    assert body["spec"]["podTemplate"]["spec"]["containers"][0]["env"] == [{"name": "K", "value": "v"}]
    assert body["spec"]["volumeClaimTemplates"] == [_vct("extra")]
