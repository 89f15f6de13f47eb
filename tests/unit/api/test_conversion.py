"""Pure v1alpha1 <-> v1beta1 conversion (api spec §8), including the upstream quirks."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.conversion import (
    ConversionError,
    convert,
    convert_review,
    strip_random_suffix,
    to_hub,
    to_spoke,
)

pytestmark = pytest.mark.unit

POD = {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
VCT = [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]
COND = {
    "type": "Ready",
    "status": "True",
    "reason": "DependenciesReady",
    "message": "",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
    "observedGeneration": 2,
}


def alpha_sandbox(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": "ns", "annotations": {"keep": "me"}},
        "spec": {"podTemplate": POD, **spec},
    }


def beta_sandbox(mode: str | None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"podTemplate": POD}
    if mode is not None:
        spec["operatingMode"] = mode
    return {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": {"name": "sb"}, "spec": spec,
            **extra}  # fmt: skip


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("annotations") or {})


# ---------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("replicas", "mode"), [(0, "Suspended"), (1, "Running"), (None, "Running")])
def test_sandbox_replicas_to_operating_mode(replicas: int | None, mode: str) -> None:
    src = alpha_sandbox(shutdownPolicy="Delete", service=True, volumeClaimTemplates=VCT)
    if replicas is not None:
        src["spec"]["replicas"] = replicas
    # v1alpha1 status.replicas is synthesised from the mode, so a consistent object round-trips
    status_replicas = 0 if replicas == 0 else 1
    src["status"] = {
        "replicas": status_replicas,
        "selector": "x=y",
        "podIPs": ["10.0.0.1"],
        "conditions": [COND],
    }
    hub = to_hub(src)
    assert hub["apiVersion"] == "agents.x-k8s.io/v1beta1"
    assert hub["spec"]["operatingMode"] == mode
    assert "replicas" not in hub["spec"]
    assert hub["spec"]["volumeClaimTemplates"] == VCT
    assert hub["spec"]["service"] is True
    assert hub["status"] == {"selector": "x=y", "podIPs": ["10.0.0.1"], "conditions": [COND]}
    assert annotations(hub)["keep"] == "me"
    snapshot = json.loads(annotations(hub)[c.ANNOTATION_V1ALPHA1_SANDBOX_STATE])
    assert snapshot["spec"] == ({} if replicas is None else {"replicas": replicas})  # what the way back reads
    back = to_spoke(hub)
    assert back == src, "alpha -> beta -> alpha must be lossless"


@pytest.mark.parametrize(
    ("mode", "spec_replicas", "status_replicas"),
    [("Suspended", 0, 0), ("Running", 1, 1), (None, 1, 1)],
)
def test_sandbox_from_hub_without_snapshot(
    mode: str | None, spec_replicas: int, status_replicas: int
) -> None:
    hub = beta_sandbox(mode, status={"nodeName": "node-1", "podIPs": ["10.0.0.9"]})
    alpha = to_spoke(hub)
    assert alpha["spec"]["replicas"] == spec_replicas
    assert "operatingMode" not in alpha["spec"]
    assert alpha["status"] == {"podIPs": ["10.0.0.9"], "replicas": status_replicas}  # nodeName dropped


def test_sandbox_node_name_is_dropped_to_hub() -> None:
    src = alpha_sandbox(replicas=1)
    src["status"] = {"nodeName": "stale"}
    assert "status" not in to_hub(src)


@pytest.mark.parametrize(
    ("orig_replicas", "new_mode", "expected"),
    [
        (None, "Running", None),  # unset round-trips as unset
        (1, "Running", 1),
        (0, "Running", 1),  # resumed through v1beta1
        (1, "Suspended", 0),  # suspended through v1beta1
        (None, "Suspended", 0),
    ],
)
def test_sandbox_snapshot_restores_replicas(
    orig_replicas: int | None, new_mode: str, expected: int | None
) -> None:
    src = alpha_sandbox() if orig_replicas is None else alpha_sandbox(replicas=orig_replicas)
    hub = to_hub(src)
    hub["spec"]["operatingMode"] = new_mode  # a v1beta1 client edits the mode
    alpha = to_spoke(hub)
    assert alpha["spec"].get("replicas") == expected
    assert c.ANNOTATION_V1ALPHA1_SANDBOX_STATE not in annotations(alpha)


def test_sandbox_status_replicas_follows_mode_not_our_snapshot() -> None:
    src = alpha_sandbox(replicas=1)
    src["status"] = {"replicas": 1}  # what a v1alpha1 client echoes back, e.g. through /scale
    hub = to_hub(src)
    assert "status" not in json.loads(annotations(hub)[c.ANNOTATION_V1ALPHA1_SANDBOX_STATE])
    hub["spec"]["operatingMode"] = "Suspended"
    assert to_spoke(hub)["status"]["replicas"] == 0


def test_sandbox_upstream_snapshot_status_replicas_is_honoured() -> None:
    """Snapshots written by upstream carry status; upstream restores status.replicas from them."""
    hub = beta_sandbox("Running")
    upstream_state = {"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox", "metadata": {"name": "sb"},
                      "spec": {"podTemplate": POD, "replicas": 1}, "status": {"replicas": 0}}  # fmt: skip
    hub["metadata"]["annotations"] = {c.ANNOTATION_V1ALPHA1_SANDBOX_STATE: json.dumps(upstream_state)}
    alpha = to_spoke(hub)
    assert alpha["status"]["replicas"] == 0
    assert alpha["spec"]["replicas"] == 1
    assert "annotations" not in alpha["metadata"]


def test_snapshot_excludes_itself_and_metadata() -> None:
    src = alpha_sandbox(replicas=0)
    src["metadata"]["annotations"][c.ANNOTATION_V1ALPHA1_SANDBOX_STATE] = "old-state"
    src["status"] = {"replicas": 0, "podIPs": ["10.0.0.2"]}
    hub = to_hub(src)
    snapshot = json.loads(annotations(hub)[c.ANNOTATION_V1ALPHA1_SANDBOX_STATE])
    assert set(snapshot) == {"apiVersion", "kind", "spec"}
    # second conversion of the same input is byte-identical (no-op updates stay no-ops)
    assert to_hub(copy.deepcopy(src)) == hub
    assert src["metadata"]["annotations"][c.ANNOTATION_V1ALPHA1_SANDBOX_STATE] == "old-state", "input mutated"


@pytest.mark.parametrize("state", ["{not json", "[1, 2]", '"text"', "null"])
def test_an_unusable_snapshot_is_ignored_not_a_failure(state: str) -> None:
    """Ours (upstream fails the conversion): one user-writable annotation failed every v1alpha1 LIST of the
    namespace and kept the API server's watch cache retrying (until December 6)."""
    hub = beta_sandbox("Running")
    plain = to_spoke(copy.deepcopy(hub))
    hub["metadata"]["annotations"] = {c.ANNOTATION_V1ALPHA1_SANDBOX_STATE: state}
    assert to_spoke(hub) == plain


def test_snapshot_values_outside_the_v1alpha1_schema_are_not_returned() -> None:
    hub = beta_sandbox("Running")
    plain = to_spoke(copy.deepcopy(hub))
    for bad in ({"spec": {"replicas": "abc"}, "status": {"replicas": -5}}, {"spec": [], "status": "x"},
                {"spec": {"replicas": True}, "status": {"replicas": "y"}}, {"spec": {"replicas": 7}}):  # fmt: skip
        hub["metadata"]["annotations"] = {c.ANNOTATION_V1ALPHA1_SANDBOX_STATE: json.dumps(bad)}
        assert to_spoke(copy.deepcopy(hub)) == plain, bad


def test_state_annotation_is_removed_and_empty_map_dropped() -> None:
    hub = to_hub(alpha_sandbox(replicas=1))
    del hub["metadata"]["annotations"]["keep"]
    alpha = to_spoke(hub)
    assert "annotations" not in alpha["metadata"]


# ---------------------------------------------------------------------------
# SandboxClaim
# ---------------------------------------------------------------------------


def alpha_claim(
    warmpool: str | None, template: str = "my-template", sandbox: str = "", *, assigned: str = ""
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "sandboxTemplateRef": {"name": template},
        "lifecycle": {"shutdownPolicy": "Delete", "ttlSecondsAfterFinished": 30},
        "additionalPodMetadata": {"labels": {"sandbox.users.io/x": "y"}},
        "env": [{"name": "A", "value": "1", "containerName": "c"}],
    }
    if warmpool is not None:
        spec["warmpool"] = warmpool
    obj: dict[str, Any] = {
        "apiVersion": "extensions.agents.x-k8s.io/v1alpha1",
        "kind": "SandboxClaim",
        "metadata": {"name": "my-claim", "labels": {"foo": "bar"}},
        "spec": spec,
    }
    if sandbox:
        obj["status"] = {"sandbox": {"name": sandbox, "podIPs": ["10.1.1.1"]}, "conditions": [COND]}
    if assigned:  # the claim controller's record of a warm adoption (api spec §5.5)
        obj["metadata"]["annotations"] = {c.ANNOTATION_SANDBOX_NAME: assigned}
    return obj


@pytest.mark.parametrize(
    ("warmpool", "sandbox", "expected"),
    [
        ("my-pool", "my-claim", "my-pool"),  # cold start, specific pool
        ("none", "my-claim", "shadow-pool-my-template"),
        ("default", "my-claim", "shadow-pool-my-template"),
        ("my-pool", "my-pool-abcde", "my-pool"),  # warm start, specific pool
        ("default", "my-pool-abcde", "my-pool"),  # warm start: originating pool from the name
        ("my-pool", "", "my-pool"),
        ("", "", "shadow-pool-my-template"),
        (None, "", "shadow-pool-my-template"),
        ("default", "nodash", "nodash"),
    ],
)
def test_claim_to_hub_pool_resolution_and_round_trip(
    warmpool: str | None, sandbox: str, expected: str
) -> None:
    # A warm-started claim carries the controller's assignment record; rule (b) reads it (ours: not the
    # status, which a v1alpha1 /status write sets - tests/unit/api/test_conversion_snapshots.py).
    warm = sandbox not in ("", "my-claim")
    src = alpha_claim(warmpool, sandbox=sandbox, assigned=sandbox if warm else "")
    hub = to_hub(src)
    assert hub["spec"]["warmPoolRef"] == {"name": expected}
    assert "sandboxTemplateRef" not in hub["spec"]
    assert "warmpool" not in hub["spec"]
    assert hub["spec"]["env"] == src["spec"]["env"]
    assert hub["spec"]["lifecycle"] == src["spec"]["lifecycle"]
    assert to_spoke(hub) == src


@pytest.mark.parametrize(
    ("pool", "warmpool", "template"),
    [
        ("my-pool", "my-pool", "my-pool"),  # quirk §10.2: template name = pool name
        ("", "", ""),
        ("shadow-pool-my-template", "default", "my-template"),
    ],
)
def test_claim_from_hub_without_snapshot(pool: str, warmpool: str, template: str) -> None:
    hub = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": "my-claim"},
        "spec": {"warmPoolRef": {"name": pool}, "volumeClaimTemplates": VCT},
    }
    alpha = to_spoke(hub)
    assert alpha["spec"]["warmpool"] == warmpool
    assert alpha["spec"]["sandboxTemplateRef"] == {"name": template}
    assert "volumeClaimTemplates" not in alpha["spec"]  # lossy by design
    assert "warmPoolRef" not in alpha["spec"]


def test_claim_snapshot_with_changed_pool() -> None:
    hub = to_hub(alpha_claim("pool-a", template="tmpl"))
    hub["spec"]["warmPoolRef"]["name"] = "pool-b"  # edited through v1beta1
    alpha = to_spoke(hub)
    assert alpha["spec"]["warmpool"] == "pool-b"
    assert alpha["spec"]["sandboxTemplateRef"] == {"name": "tmpl"}


def test_claim_snapshot_matches_bound_sandbox() -> None:
    hub = to_hub(alpha_claim("default", template="tmpl"))
    # controller later binds a warm sandbox (recording it) and a v1beta1 client rewrites the pool name
    hub["status"] = {"sandbox": {"name": "warm-xyz12"}}
    hub["metadata"]["annotations"][c.ANNOTATION_SANDBOX_NAME] = "warm-xyz12"
    hub["spec"]["warmPoolRef"]["name"] = "warm"
    alpha = to_spoke(hub)
    assert alpha["spec"]["warmpool"] == "default"
    assert alpha["spec"]["sandboxTemplateRef"] == {"name": "tmpl"}
    assert to_hub(alpha)["spec"]["warmPoolRef"] == {"name": "warm"}


def test_claim_snapshot_matched_only_through_the_status_names_the_pool() -> None:
    """Ours: without the assignment record, the restored `warmpool: default` would convert back to the shadow
    pool, so a v1alpha1 write of what was read (a /status write included) would move the claim."""
    hub = to_hub(alpha_claim("default", template="tmpl"))
    hub["status"] = {"sandbox": {"name": "warm-xyz12"}}
    hub["spec"]["warmPoolRef"]["name"] = "warm"
    alpha = to_spoke(hub)
    assert alpha["spec"] == {**alpha["spec"], "warmpool": "warm", "sandboxTemplateRef": {"name": "tmpl"}}
    assert to_hub(alpha)["spec"]["warmPoolRef"] == {"name": "warm"}


def test_strip_random_suffix() -> None:
    assert strip_random_suffix("pool-abc-x1y2z") == "pool-abc"
    assert strip_random_suffix("plain") == "plain"


# ---------------------------------------------------------------------------
# SandboxTemplate
# ---------------------------------------------------------------------------


def beta_template(policy: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "podTemplate": POD,
        "networkPolicy": {"ingress": [], "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]},
        "networkPolicyManagement": "Managed",
        "envVarsInjectionPolicy": "Allowed",
        "service": False,
    }
    if policy is not None:
        spec["volumeClaimTemplatesPolicy"] = policy
    return {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
            "metadata": {"name": "t"}, "spec": spec}  # fmt: skip


@pytest.mark.parametrize("policy", ["Disallowed", "Allowed", "Overrides"])
def test_template_policy_round_trips_through_annotation(policy: str) -> None:
    hub = beta_template(policy)
    alpha = to_spoke(hub)
    assert "volumeClaimTemplatesPolicy" not in alpha["spec"]
    assert annotations(alpha) == {c.ANNOTATION_V1BETA1_VCT_POLICY: policy}
    back = to_hub(alpha)
    assert back["spec"] == hub["spec"]
    assert c.ANNOTATION_V1BETA1_VCT_POLICY not in annotations(back)
    assert c.ANNOTATION_V1ALPHA1_SANDBOXTEMPLATE_STATE in annotations(back)
    # the snapshot is written but only stripped on the way back
    again = to_spoke(back)
    assert annotations(again) == {c.ANNOTATION_V1BETA1_VCT_POLICY: policy}


def test_template_without_policy_has_no_annotation() -> None:
    alpha = to_spoke(beta_template(None))
    assert "annotations" not in alpha["metadata"]


def test_template_invalid_policy_annotation_fails() -> None:
    alpha = to_spoke(beta_template("Allowed"))
    alpha["metadata"]["annotations"][c.ANNOTATION_V1BETA1_VCT_POLICY] = "Sometimes"
    with pytest.raises(ConversionError, match="VolumeClaimTemplatesPolicy"):
        to_hub(alpha)


# ---------------------------------------------------------------------------
# SandboxWarmPool
# ---------------------------------------------------------------------------


def test_warm_pool_mapping() -> None:
    hub = {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": "p"},
        "spec": {"sandboxTemplateRef": {"name": "t"}, "updateStrategy": {"type": "Recreate"}},
        "status": {"replicas": 2, "readyReplicas": 1, "selector": "s", "observedGeneration": 4},
    }
    alpha = to_spoke(hub)
    assert alpha["spec"]["replicas"] == 1  # unset -> 1
    assert alpha["spec"]["updateStrategy"] == {"type": "Recreate"}
    assert alpha["status"] == {"replicas": 2, "readyReplicas": 1, "selector": "s"}
    back = to_hub(alpha)
    assert back["spec"]["replicas"] == 1
    assert "observedGeneration" not in back["status"]
    assert c.ANNOTATION_V1ALPHA1_SANDBOXWARMPOOL_STATE in annotations(back)
    assert to_spoke(back) == alpha


def test_warm_pool_alpha_round_trip_keeps_nil_update_strategy() -> None:
    src = {
        "apiVersion": "extensions.agents.x-k8s.io/v1alpha1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": "p"},
        "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "t"}},
    }
    hub = to_hub(src)
    assert hub["spec"] == {"replicas": 0, "sandboxTemplateRef": {"name": "t"}}
    assert to_spoke(hub) == src


# ---------------------------------------------------------------------------
# Dispatch and ConversionReview
# ---------------------------------------------------------------------------


def test_convert_rejects_group_mismatch_and_unknown_kinds() -> None:
    with pytest.raises(ConversionError, match="group mismatch"):
        convert(alpha_sandbox(), "extensions.agents.x-k8s.io/v1beta1")
    with pytest.raises(ConversionError, match="unsupported kind"):
        convert({"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Pod"}, "agents.x-k8s.io/v1beta1")
    with pytest.raises(ConversionError, match="unsupported target"):
        convert(alpha_sandbox(), "agents.x-k8s.io/v2")


def test_same_version_is_identity_copy() -> None:
    src = alpha_sandbox(replicas=0)
    out = convert(src, "agents.x-k8s.io/v1alpha1")
    assert out == src
    assert out is not src


def test_convert_review_success_and_failure() -> None:
    review = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": "agents.x-k8s.io/v1beta1",
                    "objects": [alpha_sandbox(replicas=0), alpha_sandbox()]},
    }  # fmt: skip
    resp = convert_review(review)
    assert resp["apiVersion"] == "apiextensions.k8s.io/v1"
    assert resp["kind"] == "ConversionReview"
    assert resp["response"]["uid"] == "u-1"
    assert resp["response"]["result"] == {"status": "Success"}
    modes = [o["spec"]["operatingMode"] for o in resp["response"]["convertedObjects"]]
    assert modes == ["Suspended", "Running"]

    review["apiVersion"] = "apiextensions.k8s.io/v1beta1"
    review["request"]["objects"].append({"apiVersion": "v1", "kind": "Pod"})
    resp = convert_review(review)
    assert resp["apiVersion"] == "apiextensions.k8s.io/v1beta1"
    assert resp["response"]["result"]["status"] == "Failure"
    assert "unsupported kind" in resp["response"]["result"]["message"]
    assert resp["response"]["convertedObjects"] == []


def test_a_claim_snapshot_outside_the_v1alpha1_schema_is_ignored() -> None:
    hub = to_hub(alpha_claim("my-pool"))
    hub["metadata"]["annotations"].pop(c.ANNOTATION_V1ALPHA1_SANDBOXCLAIM_STATE)
    plain = to_spoke(copy.deepcopy(hub))
    for bad in ('{"spec": {"warmpool": 5}}', '{"spec": {"sandboxTemplateRef": "x"}}', '{"spec": []}', "oops"):
        hub["metadata"]["annotations"][c.ANNOTATION_V1ALPHA1_SANDBOXCLAIM_STATE] = bad
        assert to_spoke(copy.deepcopy(hub)) == plain, bad
