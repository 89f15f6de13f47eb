"""examples/rbac/sandbox-spec-guard.yaml keeps up with the CRDs: every field of a Sandbox's and a SandboxArchive's
spec but the ones suspend/resume write is held, so a field added to the CRD later is not a new way around it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
GUARD = ROOT / "examples" / "rbac" / "sandbox-spec-guard.yaml"


def _policy(name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(GUARD.read_text()) if d["kind"] == "ValidatingAdmissionPolicy"]
    return next(d for d in docs if d["metadata"]["name"] == name)


def _spec_fields(crd: Path, version: str) -> set[str]:
    doc = yaml.safe_load(crd.read_text())
    schema = next(v for v in doc["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    return set(schema["properties"]["spec"]["properties"])


def _held(policy: dict[str, Any]) -> set[str]:
    """The spec fields whose old and new values a validation compares."""
    text = " ".join(v["expression"] for v in policy["spec"]["validations"])
    return set(re.findall(r"object\.spec\.\??(\w+) ==", text))


def test_every_sandbox_spec_field_but_the_operating_mode_is_held() -> None:
    fields = _spec_fields(ROOT / "k8s" / "crds" / "agents.x-k8s.io_sandboxes.yaml", "v1beta1")
    assert "podTemplate" in fields
    assert _held(_policy("agent-sandbox-sandbox-guard")) == fields - {"operatingMode"}
    # What the Pod's labels follow (the claim's or warm pool's controller reference, the Sandbox's labels).
    text = " ".join(v["expression"] for v in _policy("agent-sandbox-sandbox-guard")["spec"]["validations"])
    assert set(re.findall(r"object\.metadata\.\?(\w+) ==", text)) == {"labels", "ownerReferences"}


def test_every_archive_spec_field_but_the_restore_request_is_held() -> None:
    crd = ROOT / "k8s" / "lifecycle" / "lifecycle.agents.x-k8s.io_sandboxarchives.yaml"
    fields = _spec_fields(crd, "v1alpha1")
    assert "sandbox" in fields
    assert _held(_policy("agent-sandbox-archive-guard")) == fields - {"restore"}


def test_principals_that_may_create_pods_are_not_checked_and_denials_name_the_field() -> None:
    for name in ("agent-sandbox-sandbox-guard", "agent-sandbox-archive-guard", "agent-sandbox-claim-guard"):
        spec = _policy(name)["spec"]
        (condition,) = spec["matchConditions"]
        assert condition["expression"] == (
            "!authorizer.group('').resource('pods').namespace(request.namespace).check('create').allowed()"
        )
        for validation in spec["validations"]:
            assert re.search(
                r"may (not )?create Pods in ' \+ request\.namespace", validation["messageExpression"]
            )


def test_a_claim_is_deleted_without_orphaning_its_sandbox() -> None:
    """An orphaned claim's Sandbox loses the controller reference its Pod's NetworkPolicy label follows: the claim
    guard holds deletes (propagationPolicy, orphanDependents) and the `orphan` finalizer of new claims."""
    spec = _policy("agent-sandbox-claim-guard")["spec"]
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["resources"], set(rule["operations"])) == (["sandboxclaims"], {"CREATE", "UPDATE", "DELETE"})
    text = " ".join(v["expression"] for v in [*spec["validations"], *spec["variables"]])
    for needle in ("propagationPolicy", "orphanDependents", "'orphan' in object.metadata.?finalizers"):
        assert needle in text, needle
    bindings = [
        d for d in yaml.safe_load_all(GUARD.read_text()) if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    assert {b["spec"]["policyName"] for b in bindings} == {
        "agent-sandbox-sandbox-guard",
        "agent-sandbox-archive-guard",
        "agent-sandbox-claim-guard",
    }
