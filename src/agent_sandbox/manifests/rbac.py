"""The controller's RBAC, in one place (operations spec §2.3): every rule and why the controller needs it.

Owns: the rules of ClusterRole ``agent-sandbox-controller`` (core), ClusterRole
``agent-sandbox-controller-extensions``, the namespaced Roles for the webhook certificate Secret and for the
leader-election Lease, and their rendering. ``k8s/rbac.generated.yaml``, ``k8s/extensions-rbac.generated.yaml``
and the Helm chart's byte-identical copies are generated from here (``agent-sandbox generate``); the Roles
inside ``k8s/controller.yaml`` are hand-written like upstream's and a unit test holds them equal to
``WEBHOOK_CERT_ROLE`` and ``LEADER_ELECTION_ROLE`` (the chart's, an integration test through ``helm template``).

The rule sets are upstream's, verb for verb (an install that grants less would break upstream-compatible
tooling that inspects them; one that grants more would not be least privilege), with one exception: the
Lease grants, cluster-wide in upstream's two ClusterRoles, are a Role in the leader-election namespace with
only the verbs the code sends (``LEADER_ELECTION_ROLE``). ``reason`` says which code
path uses a rule; the integration suite runs the controller with exactly these grants
(``AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount``) and ``tests/integration/install/test_rbac.py`` removes
rules one at a time to show that a missing grant is surfaced (a logged, retried 403), never a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import yaml

from agent_sandbox.api import constants as c

__all__ = [
    "CONTROLLER_NAME",
    "CORE_RULES",
    "EXTENSIONS_NAME",
    "EXTENSIONS_RULES",
    "LEADER_ELECTION_NAME",
    "LEADER_ELECTION_ROLE",
    "LEASE_NAME",
    "WEBHOOK_CERT_ROLE",
    "Rule",
    "cluster_role",
    "render_cluster_role",
    "role",
    "role_binding",
]

CONTROLLER_NAME: Final = "agent-sandbox-controller"
EXTENSIONS_NAME: Final = "agent-sandbox-controller-extensions"

_ALL: Final = ("create", "delete", "get", "list", "patch", "update", "watch")
_SUB: Final = ("get", "patch", "update")


@dataclass(frozen=True, slots=True)
class Rule:
    """One PolicyRule plus the reason the controller holds it."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    reason: str
    resource_names: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The PolicyRule as the API (and controller-gen) spells it; keys in controller-gen's order."""
        out: dict[str, Any] = {"apiGroups": list(self.api_groups)}
        if self.resource_names:
            out["resourceNames"] = list(self.resource_names)
        out["resources"] = list(self.resources)
        out["verbs"] = list(self.verbs)
        return out

    @property
    def label(self) -> str:
        """Short name for test ids and logs, e.g. ``pods/create`` or ``agents.x-k8s.io:sandboxes``."""
        groups = ",".join(g or "core" for g in self.api_groups)
        return f"{groups}:{','.join(self.resources)}"


CORE_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        ("",),
        ("persistentvolumeclaims", "pods", "services"),
        _ALL,
        "Sandbox children: the pod, its headless Service and volumeClaimTemplates PVCs are created, "
        "adopted (patch), watched through informers and deleted on shutdown.",
    ),
    Rule(
        ("", "events.k8s.io"),
        ("events",),
        ("create", "patch"),
        "Events on Sandboxes (the recorder posts events.k8s.io/v1 and patches series counts).",
    ),
    Rule(
        (c.GROUP,),
        (c.PLURAL_SANDBOXES,),
        _ALL,
        "The Sandbox controller's own kind (informer, finalizer and metadata patches); the warm pool "
        "controller creates and deletes pool members.",
    ),
    Rule(
        (c.GROUP,),
        (f"{c.PLURAL_SANDBOXES}/finalizers", f"{c.PLURAL_SANDBOXES}/status"),
        _SUB,
        "Status writes and owner references with blockOwnerDeletion on Sandboxes.",
    ),
    Rule(
        ("apiextensions.k8s.io",),
        ("customresourcedefinitions",),
        _SUB,
        "Start-up: the conversion webhook's caBundle and Service reference are patched into the four CRDs "
        "(operations spec §4.1); restricted to those CRDs by name.",
        resource_names=tuple(k.crd_name for k in c.ALL_KINDS),
    ),
)

EXTENSIONS_RULES: Final[tuple[Rule, ...]] = (
    Rule(
        ("",),
        ("pods",),
        ("get", "list", "patch", "update", "watch"),
        "Claim adoption re-labels a warm pool member's pod; the warm pool watches member pods.",
    ),
    Rule(
        ("", "events.k8s.io"),
        ("events",),
        ("create", "patch", "update"),
        "Events on claims, templates and warm pools.",
    ),
    Rule(
        (c.GROUP,),
        (c.PLURAL_SANDBOXES,),
        _ALL,
        "Warm pools create and delete member Sandboxes; claims adopt or create them.",
    ),
    Rule(
        (c.EXTENSIONS_GROUP,),
        (c.PLURAL_SANDBOX_CLAIMS, c.PLURAL_SANDBOX_TEMPLATES, c.PLURAL_SANDBOX_WARM_POOLS),
        _ALL,
        "The three extension kinds: informers, finalizers, metadata patches.",
    ),
    Rule(
        (c.EXTENSIONS_GROUP,),
        (
            f"{c.PLURAL_SANDBOX_CLAIMS}/finalizers",
            f"{c.PLURAL_SANDBOX_CLAIMS}/status",
            f"{c.PLURAL_SANDBOX_TEMPLATES}/finalizers",
            f"{c.PLURAL_SANDBOX_WARM_POOLS}/finalizers",
            f"{c.PLURAL_SANDBOX_WARM_POOLS}/status",
        ),
        _SUB,
        "Status writes and owner references on claims and warm pools; template finalizers.",
    ),
    Rule(
        ("networking.k8s.io",),
        ("networkpolicies",),
        _ALL,
        "The template controller's managed NetworkPolicy (threat model: cross-tenant network attack).",
    ),
)

#: The Lease every controller of the process elects its leader with (``controllers.main.LEADER_ELECTION_ID``).
LEASE_NAME: Final = "a3317529.agent-sandbox.x-k8s.io"
LEADER_ELECTION_NAME: Final = "agent-sandbox-controller-leader-election"

#: Role ``agent-sandbox-controller-leader-election`` in the leader-election namespace (the controller's own
#: unless ``--leader-election-namespace`` names another). Upstream grants leases cluster-wide in both
#: ClusterRoles; here they are namespaced and cut to the verbs ``kube/_leaderelection.py`` sends, so that a
#: compromised controller cannot renew node heartbeats (kube-node-lease) or take the scheduler's Lease in
#: kube-system (docs/design/install-manifests.md).
LEADER_ELECTION_ROLE: Final[tuple[Rule, ...]] = (
    Rule(
        ("coordination.k8s.io",),
        ("leases",),
        ("create",),
        "The first candidate creates the Lease (create cannot be limited to a name).",
    ),
    Rule(
        ("coordination.k8s.io",),
        ("leases",),
        ("get", "update", "watch"),
        "Acquire, renew and release the Lease (get, update); a waiting candidate watches it "
        "(fieldSelector metadata.name) to take over as soon as it is released.",
        resource_names=(LEASE_NAME,),
    ),
)

#: Role ``agent-sandbox-controller`` in the webhook namespace: the shared serving-certificate Secret.
WEBHOOK_CERT_ROLE: Final[tuple[Rule, ...]] = (
    Rule(("",), ("secrets",), ("create",), "First replica stores the generated webhook certificate."),
    Rule(
        ("",),
        ("secrets",),
        ("get", "patch", "update"),
        "Load (and replace an expired) webhook certificate; restricted to that one Secret.",
        resource_names=(c.WEBHOOK_CERTS_SECRET,),
    ),
)


def cluster_role(name: str, rules: tuple[Rule, ...]) -> dict[str, Any]:
    """A ClusterRole object holding ``rules``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [r.to_dict() for r in rules],
    }


def role(name: str, namespace: str, rules: tuple[Rule, ...]) -> dict[str, Any]:
    """A namespaced Role object holding ``rules``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [r.to_dict() for r in rules],
    }


def role_binding(name: str, namespace: str, subject_namespace: str) -> dict[str, Any]:
    """A RoleBinding of Role ``name`` in ``namespace`` to the controller's ServiceAccount."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": subject_namespace}],
    }


def render_cluster_role(name: str, rules: tuple[Rule, ...]) -> str:
    """YAML text of a generated ClusterRole file (provenance header, controller-gen layout)."""
    body = yaml.safe_dump(cluster_role(name, rules), sort_keys=False, default_flow_style=False)
    body = body.replace("- ''\n", '- ""\n')  # the core API group as controller-gen spells it
    return (
        "# Generated by agent_sandbox.manifests.rbac (the controller's RBAC, one source for k8s/ and helm/).\n"
        "# DO NOT EDIT; run `make generate`.\n"
        f"---\n{body}"
    )
