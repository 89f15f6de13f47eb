"""The four kinds: REST addressing and CRD names (api spec §1.1)."""

from __future__ import annotations

import pytest

from agent_sandbox.api import kinds

pytestmark = pytest.mark.unit


def test_kind_infos_match_spec_table() -> None:
    rows = {
        (k.kind, k.group, k.crd_name, k.plural, k.singular, k.list_kind, k.short_names)
        for k in kinds.ALL_KINDS
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
    assert kinds.SANDBOX.api_version == "agents.x-k8s.io/v1beta1"
    assert kinds.SANDBOX_WARM_POOL.at_version("v1alpha1").api_version == "extensions.agents.x-k8s.io/v1alpha1"
    assert kinds.SANDBOX_CLAIM.at_version("v1alpha1") == kinds.SANDBOX_CLAIM_V1ALPHA1
    assert kinds.KINDS_BY_NAME["SandboxWarmPool"] is kinds.SANDBOX_WARM_POOL


def test_paths() -> None:
    assert kinds.SANDBOX.path("ns", "a b") == "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes/a%20b"
    assert (
        kinds.SANDBOX_CLAIM.path("ns")
        == "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims"
    )
    assert kinds.SANDBOX.path("ns", "x", "status").endswith("/sandboxes/x/status")
    with pytest.raises(ValueError, match="namespace is required"):
        kinds.SANDBOX.path(None, "x")
