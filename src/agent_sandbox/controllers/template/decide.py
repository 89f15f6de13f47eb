"""SandboxTemplate decisions (controllers spec §2): a pure function from a snapshot to a plan.

Owns: the desired shared NetworkPolicy `<template>-network-policy` (the secure default of §2, or the
template's own rules), the "controlled by this template" test, drift detection, and the ref-hash label
stamped on the template itself. Nothing here awaits, reads a clock or calls a client.

Does not own: reading the cache (`reconciler`) or the API calls (`execute`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controlled_by, new_controller_ref
from agent_sandbox.api.naming import template_ref_hash
from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, Object

from ..blueprint import semantic_equal

__all__ = [
    "ROUTER_NAMESPACE",
    "Action",
    "CreatePolicy",
    "DeletePolicy",
    "PatchTemplateLabel",
    "RefuseForeignPolicy",
    "TemplatePlan",
    "TemplateSnapshot",
    "UpdatePolicy",
    "decide",
    "desired_policy_spec",
    "policy_name",
]

ROUTER_NAMESPACE: Final = "agent-sandbox-system"
"""Namespace of the sandbox router; the only ingress source of the default policy."""
PRIVATE_V4: Final = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")
PRIVATE_V6: Final = ("fc00::/7", "fe80::/10")


@dataclass(frozen=True, slots=True)
class TemplateSnapshot:
    """What one pass observed: the template and the same-named policy (None when absent).

    `policy_uncached`: the policy is the answer of this controller's own write, which the informer has
    not delivered yet (the reconciler then looks again soon); decisions do not depend on it.
    """

    template: Object
    policy: Object | None
    policy_uncached: bool = False


@dataclass(frozen=True, slots=True)
class PatchTemplateLabel:
    """Merge-patch `agents.x-k8s.io/sandbox-template-ref-hash` onto the template."""

    value: str

    def patch(self) -> Object:
        return {"metadata": {"labels": {c.LABEL_SANDBOX_TEMPLATE_REF_HASH: self.value}}}


@dataclass(frozen=True, slots=True)
class CreatePolicy:
    """Create the NetworkPolicy `body` (template as controller owner)."""

    body: Object


@dataclass(frozen=True, slots=True)
class UpdatePolicy:
    """Replace the whole spec of the controlled policy (`body` carries the cached resourceVersion)."""

    body: Object


@dataclass(frozen=True, slots=True)
class DeletePolicy:
    """Delete the controlled policy (management switched to `Unmanaged`)."""

    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class RefuseForeignPolicy:
    """A same-named policy exists that this template does not control: never touch it, report it."""

    message: str


Action: TypeAlias = PatchTemplateLabel | CreatePolicy | UpdatePolicy | DeletePolicy | RefuseForeignPolicy


@dataclass(frozen=True, slots=True)
class TemplatePlan:
    """Actions in execution order; an empty plan means the template is converged."""

    actions: tuple[Action, ...] = ()


def policy_name(template_name: str) -> str:
    """`<template>-network-policy` (§2 step 5)."""
    return f"{template_name}-network-policy"


def _default_rules() -> tuple[list[Any], list[Any]]:
    ingress = [
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ROUTER_NAMESPACE}},
                    "podSelector": {"matchLabels": {c.LABEL_APP: c.SANDBOX_ROUTER_APP}},
                }
            ]
        }
    ]
    egress = [
        {
            "to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_V4)}},
                {"ipBlock": {"cidr": "::/0", "except": list(PRIVATE_V6)}},
            ]
        }
    ]
    return ingress, egress


def desired_policy_spec(template: Object) -> dict[str, Any]:
    """The NetworkPolicy spec for a `Managed` template (§2 step 8)."""
    custom = (template.get("spec") or {}).get("networkPolicy")
    if custom is None:
        ingress, egress = _default_rules()
    else:
        # An empty (or absent) list means deny everything in that direction.
        ingress = copy.deepcopy(custom.get("ingress") or [])
        egress = copy.deepcopy(custom.get("egress") or [])
    return {
        "podSelector": {
            "matchLabels": {
                c.LABEL_SANDBOX_TEMPLATE_REF_HASH: template_ref_hash(template["metadata"]["name"])
            }
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": ingress,
        "egress": egress,
    }


def _normalized(spec: Any) -> Any:
    """The spec as the API server stores it: NetworkPolicy ports default their protocol to TCP.

    Without this a custom rule `ports: [{port: 53}]` would read back with `protocol: TCP` and look
    like drift on every pass.
    """
    spec = copy.deepcopy(spec or {})
    for direction in ("ingress", "egress"):
        for rule in spec.get(direction) or ():
            for port in rule.get("ports") or ():
                port.setdefault("protocol", "TCP")
    return spec


def policy_in_sync(existing: Object, desired_spec: Mapping[str, Any]) -> bool:
    """Semantic equality of the stored spec and the desired one (missing list == empty list)."""
    return semantic_equal(_normalized(existing.get("spec")), _normalized(desired_spec))


def _new_policy(template: Object, spec: dict[str, Any]) -> Object:
    meta = template["metadata"]
    return {
        "apiVersion": NETWORK_POLICY.api_version,
        "kind": NETWORK_POLICY.kind,
        "metadata": {
            "name": policy_name(meta["name"]),
            "namespace": meta["namespace"],
            "ownerReferences": [
                new_controller_ref(
                    api_version=SANDBOX_TEMPLATE.api_version,
                    kind=SANDBOX_TEMPLATE.kind,
                    name=meta["name"],
                    uid=meta["uid"],
                )
            ],
        },
        "spec": spec,
    }


def decide(snap: TemplateSnapshot) -> TemplatePlan:
    """The plan of one reconcile pass (§2 steps 3-10)."""
    template, policy = snap.template, snap.policy
    meta = template["metadata"]
    actions: list[Action] = []
    if meta.get("deletionTimestamp"):
        return TemplatePlan()  # the policy goes away with the template (garbage collection)
    want_hash = template_ref_hash(meta["name"])
    if (meta.get("labels") or {}).get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH, "") != want_hash:
        actions.append(PatchTemplateLabel(want_hash))

    management = (template.get("spec") or {}).get(
        "networkPolicyManagement"
    ) or c.NetworkPolicyManagement.MANAGED
    controlled = policy is not None and controlled_by(policy, uid=meta.get("uid", ""))
    if management == c.NetworkPolicyManagement.UNMANAGED:
        if policy is not None and controlled:
            actions.append(DeletePolicy(policy["metadata"]["name"], policy["metadata"].get("uid", "")))
        return TemplatePlan(tuple(actions))

    spec = desired_policy_spec(template)
    if policy is None:
        actions.append(CreatePolicy(_new_policy(template, spec)))
    elif not controlled:
        actions.append(
            RefuseForeignPolicy(
                f"refusing to update NetworkPolicy {meta['namespace']}/{policy_name(meta['name'])}: "
                f"not controlled by SandboxTemplate {meta['name']}"
            )
        )
    elif not policy_in_sync(policy, spec):
        body = copy.deepcopy(policy)
        body["spec"] = spec
        actions.append(UpdatePolicy(body))
    return TemplatePlan(tuple(actions))
