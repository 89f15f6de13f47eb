"""The core resource kinds the runtime touches (Pod, Service, Lease, ...), as `ResourceKind`s.

`ResourceKind` and our four CRD kinds are defined once, in `agent_sandbox.api.kinds`; they are re-exported
here so runtime code addresses every kind from one import. Does not own any wire model: objects travel as
plain decoded JSON dicts.
"""

from __future__ import annotations

from ..api.kinds import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_CLAIM_V1ALPHA1,
    SANDBOX_TEMPLATE,
    SANDBOX_TEMPLATE_V1ALPHA1,
    SANDBOX_V1ALPHA1,
    SANDBOX_WARM_POOL,
    SANDBOX_WARM_POOL_V1ALPHA1,
    ResourceKind,
)

__all__ = [
    "CONFIG_MAP",
    "CRD",
    "EVENT",
    "LEASE",
    "NAMESPACE",
    "NETWORK_POLICY",
    "NODE",
    "POD",
    "PVC",
    "SANDBOX",
    "SANDBOX_CLAIM",
    "SANDBOX_CLAIM_V1ALPHA1",
    "SANDBOX_TEMPLATE",
    "SANDBOX_TEMPLATE_V1ALPHA1",
    "SANDBOX_V1ALPHA1",
    "SANDBOX_WARM_POOL",
    "SANDBOX_WARM_POOL_V1ALPHA1",
    "SECRET",
    "SERVICE",
    "SERVICE_ACCOUNT",
    "ResourceKind",
]


POD = ResourceKind("", "v1", "Pod", "pods")
SERVICE = ResourceKind("", "v1", "Service", "services")
PVC = ResourceKind("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
SECRET = ResourceKind("", "v1", "Secret", "secrets")
CONFIG_MAP = ResourceKind("", "v1", "ConfigMap", "configmaps")
SERVICE_ACCOUNT = ResourceKind("", "v1", "ServiceAccount", "serviceaccounts")
NAMESPACE = ResourceKind("", "v1", "Namespace", "namespaces", namespaced=False)
NODE = ResourceKind("", "v1", "Node", "nodes", namespaced=False)
EVENT = ResourceKind("events.k8s.io", "v1", "Event", "events")
LEASE = ResourceKind("coordination.k8s.io", "v1", "Lease", "leases")
NETWORK_POLICY = ResourceKind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies")
CRD = ResourceKind(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False
)
