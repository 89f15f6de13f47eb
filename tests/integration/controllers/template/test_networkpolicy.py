"""SandboxTemplate controller on a real control plane (controllers spec §2): the shared NetworkPolicy.

The real `agent-sandbox-controller --extensions` process runs against the session's local control plane;
no mocks. One journey: default secure policy + ref-hash label -> custom rules -> drift repaired ->
Unmanaged deletes it -> Managed again -> the template's deletion garbage-collects it; and a same-named
policy the template does not control is never touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, ApiClient, NotFound, Object
from tests.helpers import eventually
from tests.integration.controllers.builders import EXT, template_body

pytestmark = pytest.mark.integration


async def policy(kube: ApiClient, ns: str, name: str = "tmpl-network-policy") -> Object | None:
    try:
        return await kube.get(NETWORK_POLICY, name, namespace=ns)
    except NotFound:
        return None


async def test_shared_network_policy_lifecycle(kube: ApiClient, namespace: str, controller: Started) -> None:
    ns = namespace
    tmpl = await kube.create(SANDBOX_TEMPLATE, template_body(), namespace=ns)
    ref_hash = naming.name_hash("tmpl")

    pol = await eventually(lambda: policy(kube, ns), "the default NetworkPolicy")
    assert pol["metadata"]["ownerReferences"] == [
        {
            "apiVersion": EXT,
            "kind": "SandboxTemplate",
            "name": "tmpl",
            "uid": tmpl["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = pol["spec"]
    assert spec["podSelector"] == {"matchLabels": {c.LABEL_SANDBOX_TEMPLATE_REF_HASH: ref_hash}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [
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
    ]
    assert spec["egress"] == [
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
    ]

    async def labelled() -> bool:
        got = await kube.get(SANDBOX_TEMPLATE, "tmpl", namespace=ns)
        return (got["metadata"].get("labels") or {}).get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH) == ref_hash

    await eventually(labelled, "the ref-hash label on the template")

    # Custom rules replace the default (ports read back with the server-defaulted protocol).
    custom = {"ingress": [], "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}
    await kube.patch(SANDBOX_TEMPLATE, "tmpl", {"spec": {"networkPolicy": custom}}, namespace=ns)

    async def customised() -> Object | None:
        p = await policy(kube, ns)
        return (
            p if p and p["spec"].get("egress") == custom["egress"] and not p["spec"].get("ingress") else None
        )

    pol = await eventually(customised, "the custom rules")
    rv = pol["metadata"]["resourceVersion"]

    # Drift on the policy itself is repaired from the template.
    await kube.patch(NETWORK_POLICY, "tmpl-network-policy", {"spec": {"egress": None}}, namespace=ns)
    await eventually(customised, "drift repaired")

    # Unmanaged: the controlled policy is deleted; Managed again: recreated.
    await kube.patch(
        SANDBOX_TEMPLATE, "tmpl", {"spec": {"networkPolicyManagement": "Unmanaged"}}, namespace=ns
    )
    await eventually(lambda: _absent(policy(kube, ns)), "the policy deleted under Unmanaged")
    await kube.patch(SANDBOX_TEMPLATE, "tmpl", {"spec": {"networkPolicyManagement": "Managed"}}, namespace=ns)
    pol = await eventually(customised, "the policy recreated under Managed")
    assert pol["metadata"]["resourceVersion"] != rv

    # Deleting the template garbage-collects its policy.
    await kube.delete(SANDBOX_TEMPLATE, "tmpl", namespace=ns)
    await eventually(lambda: _absent(policy(kube, ns)), "the policy garbage-collected", within=90)


async def test_foreign_policy_of_the_same_name_is_never_touched(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    foreign = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "tmpl-network-policy"},
        "spec": {"podSelector": {"matchLabels": {"mine": "yes"}}, "policyTypes": ["Ingress"]},
    }
    created = await kube.create(NETWORK_POLICY, foreign, namespace=ns)
    await kube.create(SANDBOX_TEMPLATE, template_body(), namespace=ns)

    async def labelled() -> bool:
        got = await kube.get(SANDBOX_TEMPLATE, "tmpl", namespace=ns)
        return c.LABEL_SANDBOX_TEMPLATE_REF_HASH in (got["metadata"].get("labels") or {})

    await eventually(labelled, "the template reconciled")
    # Give the controller a few (failing, backed-off) passes; the policy must stay exactly as it was.
    await asyncio.sleep(2)
    await kube.patch(
        SANDBOX_TEMPLATE, "tmpl", {"spec": {"networkPolicyManagement": "Unmanaged"}}, namespace=ns
    )
    await asyncio.sleep(1)
    pol = await policy(kube, ns)
    assert pol is not None
    assert pol["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert pol["spec"] == created["spec"]


async def _absent(obj: Awaitable[Object | None]) -> bool:
    return await obj is None
