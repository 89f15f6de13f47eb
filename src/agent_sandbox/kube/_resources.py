"""Typed resource descriptors: the data that turns a kind into REST paths.

Owns: `ResourceKind` (group/version/kind/plural/namespaced) and the descriptors of the core kinds the
project touches plus our four CRDs (served version v1beta1, the hub; v1alpha1 variants for conversion
tests). Does not own any wire model: objects travel as plain decoded JSON dicts.

The CRD group/version/kind/plural strings come from `agent_sandbox.api.constants` (controllers spec §0.1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import quote

from ..api import constants as _c

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


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """Everything needed to address one resource type over REST.

    Attributes:
        group: API group, "" for the core group.
        version: API version inside the group (e.g. "v1").
        kind: the Kind (e.g. "Pod").
        plural: the lower-case REST resource name (e.g. "pods").
        namespaced: whether objects live in a namespace.
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    _prefix: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Precomputed once: path building is on the hot path of every request.
        prefix = f"/api/{self.version}" if self.group == "" else f"/apis/{self.group}/{self.version}"
        object.__setattr__(self, "_prefix", prefix)

    @property
    def api_version(self) -> str:
        """`apiVersion` as written in manifests: "v1" or "group/version"."""
        return self.version if self.group == "" else f"{self.group}/{self.version}"

    @property
    def group_kind(self) -> str:
        """ "Kind.group" (e.g. "Sandbox.agents.x-k8s.io"), the version-free identity used for ownership."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """Build the REST path for a collection (name None) or one object.

        Raises:
            ValueError: a namespaced kind addressed by name without a namespace, or a subresource without
                a name.
        """
        parts = [self._prefix]
        if self.namespaced and namespace:
            parts.append("/namespaces/")
            parts.append(quote(namespace, safe=""))
        elif self.namespaced and name is not None:
            raise ValueError(f"{self.kind} is namespaced: namespace is required to address {name!r}")
        parts.append("/")
        parts.append(self.plural)
        if name is not None:
            parts.append("/")
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append("/")
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "".join(parts)


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

SANDBOX = ResourceKind(_c.GROUP, _c.HUB_VERSION, _c.KIND_SANDBOX, _c.PLURAL_SANDBOXES)
SANDBOX_CLAIM = ResourceKind(
    _c.EXTENSIONS_GROUP, _c.HUB_VERSION, _c.KIND_SANDBOX_CLAIM, _c.PLURAL_SANDBOX_CLAIMS
)
SANDBOX_TEMPLATE = ResourceKind(
    _c.EXTENSIONS_GROUP, _c.HUB_VERSION, _c.KIND_SANDBOX_TEMPLATE, _c.PLURAL_SANDBOX_TEMPLATES
)
SANDBOX_WARM_POOL = ResourceKind(
    _c.EXTENSIONS_GROUP, _c.HUB_VERSION, _c.KIND_SANDBOX_WARM_POOL, _c.PLURAL_SANDBOX_WARM_POOLS
)
SANDBOX_V1ALPHA1 = ResourceKind(_c.GROUP, _c.SPOKE_VERSION, _c.KIND_SANDBOX, _c.PLURAL_SANDBOXES)
SANDBOX_CLAIM_V1ALPHA1 = ResourceKind(
    _c.EXTENSIONS_GROUP, _c.SPOKE_VERSION, _c.KIND_SANDBOX_CLAIM, _c.PLURAL_SANDBOX_CLAIMS
)
SANDBOX_TEMPLATE_V1ALPHA1 = ResourceKind(
    _c.EXTENSIONS_GROUP, _c.SPOKE_VERSION, _c.KIND_SANDBOX_TEMPLATE, _c.PLURAL_SANDBOX_TEMPLATES
)
SANDBOX_WARM_POOL_V1ALPHA1 = ResourceKind(
    _c.EXTENSIONS_GROUP, _c.SPOKE_VERSION, _c.KIND_SANDBOX_WARM_POOL, _c.PLURAL_SANDBOX_WARM_POOLS
)
