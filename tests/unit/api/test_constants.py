"""Wire constants, name hash vectors and ownership helpers (api spec §7, controllers spec §0)."""

from __future__ import annotations

import pytest

from agent_sandbox.api import constants as c

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("name", "expected"), sorted(c.NAME_HASH_TEST_VECTORS.items()))
def test_name_hash_vectors(name: str, expected: str) -> None:
    assert c.name_hash(name) == expected


def test_name_hash_is_utf8_and_zero_padded() -> None:
    # FNV-1a over UTF-8 bytes, not code points: a non-ASCII name hashes its 2-byte encoding.
    utf8, latin1 = "é".encode(), "é".encode("latin-1")
    assert utf8 == b"\xc3\xa9"
    assert c.name_hash("é") == format(c.fnv1a_32(utf8), "08x")
    assert c.name_hash("é") != format(c.fnv1a_32(latin1), "08x")
    for name in ("x", "sandbox-1", "a" * 300):
        digest = c.name_hash(name)
        assert len(digest) == 8
        assert digest == digest.lower()
        int(digest, 16)


def test_selectors() -> None:
    assert c.sandbox_selector("my-sandbox") == "agents.x-k8s.io/sandbox-name-hash=374de8f5"
    assert c.warm_pool_selector("pool") == "agents.x-k8s.io/warm-pool-sandbox=91dd7983"


def test_kind_infos_match_spec_table() -> None:
    rows = {
        (k.kind, k.group, k.crd_name, k.plural, k.singular, k.list_kind, k.short_names) for k in c.ALL_KINDS
    }
    assert rows == {
        ("Sandbox", "agents.x-k8s.io", "sandboxes.agents.x-k8s.io", "sandboxes", "sandbox", "SandboxList",
         ("sandbox",)),
        ("SandboxTemplate", "extensions.agents.x-k8s.io", "sandboxtemplates.extensions.agents.x-k8s.io",
         "sandboxtemplates", "sandboxtemplate", "SandboxTemplateList", ("sandboxtemplate",)),
        ("SandboxClaim", "extensions.agents.x-k8s.io", "sandboxclaims.extensions.agents.x-k8s.io",
         "sandboxclaims", "sandboxclaim", "SandboxClaimList", ("sandboxclaim",)),
        ("SandboxWarmPool", "extensions.agents.x-k8s.io", "sandboxwarmpools.extensions.agents.x-k8s.io",
         "sandboxwarmpools", "sandboxwarmpool", "SandboxWarmPoolList", ("swp",)),
    }  # fmt: skip
    assert c.SANDBOX.api_version() == "agents.x-k8s.io/v1beta1"
    assert c.SANDBOX_WARM_POOL.api_version("v1alpha1") == "extensions.agents.x-k8s.io/v1alpha1"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("go-client", "go-client"),
        ("python-client", "python-client"),
        ("controller", "controller"),
        ("", "unknown"),
        (None, "unknown"),
        ("kubectl", "unknown"),
        ("Python-Client", "unknown"),
    ],
)
def test_normalize_created_by(value: str | None, expected: str) -> None:
    assert c.normalize_created_by(value) == expected


@pytest.mark.parametrize(
    ("key", "label", "annotation"),
    [
        ("agents.x-k8s.io/foo", True, True),
        ("extensions.agents.x-k8s.io/foo", True, True),
        ("opentelemetry.io/trace-context", False, True),
        ("sandbox.users.io/team", False, False),
        ("api.agents.x-k8s.io/v1alpha1-sandbox-state", False, False),
        ("app", False, False),
    ],
)
def test_reserved_keys(key: str, label: bool, annotation: bool) -> None:
    assert c.is_reserved_label(key) is label
    assert c.is_reserved_annotation(key) is annotation


def test_owner_matching_ignores_version() -> None:
    old = {"apiVersion": "extensions.agents.x-k8s.io/v1alpha1", "kind": "SandboxWarmPool", "name": "p"}
    assert c.owner_ref_matches(old, c.EXTENSIONS_GROUP, "SandboxWarmPool")
    assert not c.owner_ref_matches(old, c.GROUP, "SandboxWarmPool")
    assert not c.owner_ref_matches({"apiVersion": "v1", "kind": "SandboxWarmPool"}, c.EXTENSIONS_GROUP,
                                   "SandboxWarmPool")  # fmt: skip
    assert c.api_group("v1") == ""
    assert c.api_group("apps/v1") == "apps"


def test_classify_ownership() -> None:
    ref = c.new_controller_ref(api_version="agents.x-k8s.io/v1beta1", kind="Sandbox", name="s", uid="u1")
    assert ref["controller"] is True
    assert ref["blockOwnerDeletion"] is True
    non_controller = dict(ref, controller=False, uid="u9")
    assert c.classify_ownership({}, "u1") is c.Ownership.UNOWNED
    assert c.classify_ownership({"ownerReferences": [non_controller]}, "u1") is c.Ownership.UNOWNED
    assert c.classify_ownership({"ownerReferences": [non_controller, ref]}, "u1") is c.Ownership.OWNED
    assert c.classify_ownership({"ownerReferences": [ref]}, "u2") is c.Ownership.FOREIGN


def test_enums_are_wire_strings() -> None:
    assert c.OperatingMode.SUSPENDED == "Suspended"
    assert [m.value for m in c.EnvVarsInjectionPolicy] == ["Allowed", "Overrides", "Disallowed"]
    assert [m.value for m in c.VolumeClaimTemplatesPolicy] == ["Disallowed", "Allowed", "Overrides"]
    assert [m.value for m in c.UpdateStrategyType] == ["Recreate", "OnReplenish"]
    assert [m.value for m in c.ClaimShutdownPolicy] == ["Delete", "DeleteForeground", "Retain"]
    assert c.FINALIZERS == ()
    assert set(c.STATE_ANNOTATIONS) == {k.kind for k in c.ALL_KINDS}
