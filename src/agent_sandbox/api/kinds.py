"""The kinds: one definition of each resource type the project names, for REST and for its CRD.

Owns `ResourceKind` (group, version, kind, plural, scope, and for our CRDs the singular, list kind and
short names) and the four agent-sandbox kinds at the hub version (api spec §1.1, controllers spec §0.1),
plus their v1alpha1 (spoke) variants. The core kinds the runtime touches (Pod, Service, ...) are defined
with the same type in `agent_sandbox.kube`.

Pure data: building a REST path is string formatting, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final
from urllib.parse import quote

from .constants import (
    EXTENSIONS_GROUP,
    GROUP,
    HUB_VERSION,
    KIND_SANDBOX,
    KIND_SANDBOX_CLAIM,
    KIND_SANDBOX_TEMPLATE,
    KIND_SANDBOX_WARM_POOL,
    PLURAL_SANDBOX_CLAIMS,
    PLURAL_SANDBOX_TEMPLATES,
    PLURAL_SANDBOX_WARM_POOLS,
    PLURAL_SANDBOXES,
    SPOKE_VERSION,
)

__all__ = [
    "ALL_KINDS",
    "KINDS_BY_NAME",
    "SANDBOX",
    "SANDBOX_CLAIM",
    "SANDBOX_CLAIM_V1ALPHA1",
    "SANDBOX_TEMPLATE",
    "SANDBOX_TEMPLATE_V1ALPHA1",
    "SANDBOX_V1ALPHA1",
    "SANDBOX_WARM_POOL",
    "SANDBOX_WARM_POOL_V1ALPHA1",
    "ResourceKind",
]


@dataclass(frozen=True, slots=True)
class ResourceKind:
    """Everything needed to address one resource type over REST, and to name it in a CRD.

    Attributes:
        group: API group, "" for the core group.
        version: API version inside the group (e.g. "v1").
        kind: the Kind (e.g. "Pod").
        plural: the lower-case REST resource name (e.g. "pods").
        namespaced: whether objects live in a namespace.
        singular, list_kind, short_names: the CRD `spec.names` (our own kinds only).
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    singular: str = field(default="", compare=False)
    list_kind: str = field(default="", compare=False)
    short_names: tuple[str, ...] = field(default=(), compare=False)
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

    @property
    def crd_name(self) -> str:
        """`<plural>.<group>`, the CustomResourceDefinition object name."""
        return f"{self.plural}.{self.group}"

    def at_version(self, version: str) -> ResourceKind:
        """The same kind served at another version of its group."""
        return replace(self, version=version)

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """Build the REST path for a collection (name None) or one object.

        Raises:
            ValueError: a namespaced kind addressed by name without a namespace, an empty name, or a
                subresource without a name.
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
            if not name:
                # `<plural>/` is the collection to the API server: a DELETE there deletes every object
                raise ValueError(f"{self.kind} name must not be empty")
            parts.append("/")
            parts.append(quote(name, safe=""))
            if subresource:
                parts.append("/")
                parts.append(subresource)
        elif subresource:
            raise ValueError("a subresource needs an object name")
        return "".join(parts)


def _crd_kind(group: str, kind: str, plural: str, short_names: tuple[str, ...]) -> ResourceKind:
    return ResourceKind(
        group,
        HUB_VERSION,
        kind,
        plural,
        singular=kind.lower(),
        list_kind=f"{kind}List",
        short_names=short_names,
    )


SANDBOX: Final = _crd_kind(GROUP, KIND_SANDBOX, PLURAL_SANDBOXES, ("sandbox",))
SANDBOX_TEMPLATE: Final = _crd_kind(
    EXTENSIONS_GROUP, KIND_SANDBOX_TEMPLATE, PLURAL_SANDBOX_TEMPLATES, ("sandboxtemplate",)
)
SANDBOX_CLAIM: Final = _crd_kind(
    EXTENSIONS_GROUP, KIND_SANDBOX_CLAIM, PLURAL_SANDBOX_CLAIMS, ("sandboxclaim",)
)
SANDBOX_WARM_POOL: Final = _crd_kind(
    EXTENSIONS_GROUP, KIND_SANDBOX_WARM_POOL, PLURAL_SANDBOX_WARM_POOLS, ("swp",)
)

#: The four kinds in CRD-file order (core first, then extensions alphabetically by plural).
ALL_KINDS: Final[tuple[ResourceKind, ...]] = (SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL)
KINDS_BY_NAME: Final[Mapping[str, ResourceKind]] = {k.kind: k for k in ALL_KINDS}

# The deprecated spoke version, served through the conversion webhook (conversion tests address it).
SANDBOX_V1ALPHA1: Final = SANDBOX.at_version(SPOKE_VERSION)
SANDBOX_CLAIM_V1ALPHA1: Final = SANDBOX_CLAIM.at_version(SPOKE_VERSION)
SANDBOX_TEMPLATE_V1ALPHA1: Final = SANDBOX_TEMPLATE.at_version(SPOKE_VERSION)
SANDBOX_WARM_POOL_V1ALPHA1: Final = SANDBOX_WARM_POOL.at_version(SPOKE_VERSION)
