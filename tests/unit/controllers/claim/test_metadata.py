"""additionalPodMetadata validation and merge (controllers spec §4.7.1-§4.7.2, api spec §5.6)."""

from __future__ import annotations

import pytest

from agent_sandbox.controllers.claim.errors import InvalidMetadata, ReconcilerError
from agent_sandbox.controllers.claim.metadata import merge_no_override, validate_additional_metadata

pytestmark = pytest.mark.unit


def _claim(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, object]:
    return {"spec": {"additionalPodMetadata": {"labels": labels or {}, "annotations": annotations or {}}}}


VALID = [
    ("allowed domain", {"sandbox.users.io/team": "a"}, {}, ()),
    ("subdomain of allowed", {"eu.sandbox.users.io/team": "a"}, {}, ()),
    ("empty label value", {"sandbox.users.io/flag": ""}, {}, ()),
    ("custom allowed domain", {"corp.example.com/x": "y"}, {}, ("corp.example.com",)),
    ("unprefixed annotation", {}, {"note": "anything <goes> & here"}, ()),
    ("safe-to-evict allowed", {}, {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}, ()),
    ("foreign annotation domain", {}, {"example.com/owner": "me"}, ()),
]


@pytest.mark.parametrize(("case", "labels", "annotations", "domains"), VALID, ids=[v[0] for v in VALID])
def test_valid_metadata(
    case: str, labels: dict[str, str], annotations: dict[str, str], domains: tuple[str, ...]
) -> None:
    validate_additional_metadata(_claim(labels, annotations), domains)


INVALID = [
    ("no domain", {"team": "a"}, {}, (), 'label "team": domain prefix required'),
    ("long value", {"sandbox.users.io/t": "v" * 64}, {}, (), "no more than 63"),
    ("bad value pattern", {"sandbox.users.io/t": "-bad-"}, {}, (), "valid label"),
    ("bad key", {"sandbox.users.io/bad key!": "a"}, {}, (), 'label "sandbox.users.io/bad key!"'),
    ("upper-case prefix is not a DNS subdomain", {"Sandbox.Users.IO/t": "a"}, {}, (), "RFC 1123 subdomain"),
    ("domain not allowed", {"evil.com/t": "a"}, {}, (), "not in the allowed label domains"),
    (
        "default list replaced by custom",
        {"sandbox.users.io/t": "a"},
        {},
        ("corp.example.com",),
        "not in the allowed",
    ),
    ("suffix without dot", {"notsandbox.users.io/t": "a"}, {}, (), "not in the allowed"),
    (
        "router spoofing",
        {"app": "sandbox-router"},
        {},
        ("sandbox.users.io",),
        "reserved for the sandbox router",
    ),
    ("router spoofing any case", {"APP": "Sandbox-Router"}, {}, (), "reserved for the sandbox router"),
    ("restricted annotation k8s.io", {}, {"k8s.io/x": "1"}, (), 'annotation "k8s.io/x": domain'),
    ("restricted annotation subdomain", {}, {"node.kubernetes.io/x": "1"}, (), "restricted"),
    ("restricted agents domain", {}, {"agents.x-k8s.io/pod-name": "p"}, (), "restricted"),
    ("restricted extensions subdomain", {}, {"extensions.agents.x-k8s.io/x": "1"}, (), "restricted"),
    ("bad annotation key", {}, {"a/b/c": "1"}, (), 'annotation "a/b/c"'),
]


@pytest.mark.parametrize(
    ("case", "labels", "annotations", "domains", "fragment"), INVALID, ids=[v[0] for v in INVALID]
)
def test_invalid_metadata(
    case: str, labels: dict[str, str], annotations: dict[str, str], domains: tuple[str, ...], fragment: str
) -> None:
    with pytest.raises(InvalidMetadata) as err:
        validate_additional_metadata(_claim(labels, annotations), domains)
    assert str(err.value).startswith("invalid additionalPodMetadata: failed to validate ")
    assert fragment in str(err.value)
    assert err.value.reason == "InvalidMetadata"
    assert err.value.suppressed


def test_merge_allows_equal_values_and_rejects_overrides() -> None:
    target = {"app": "demo"}
    merge_no_override(target, {"app": "demo", "sandbox.users.io/t": "1"}, what="label")
    assert target == {"app": "demo", "sandbox.users.io/t": "1"}
    with pytest.raises(ReconcilerError) as err:
        merge_no_override(target, {"app": "other"}, what="label")
    assert str(err.value) == (
        'metadata override conflict: label "app" is defined in template with value "demo", but claim requests "other"'
    )
    assert err.value.message.startswith("Error seen: metadata override conflict")
