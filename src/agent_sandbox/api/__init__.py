"""agent_sandbox.api: the vocabulary of the four kinds, with no I/O.

* `constants` - every wire string (labels, annotations, conditions, reasons, enums);
* `kinds` - `ResourceKind` and the four kinds (REST addressing and CRD names);
* `meta` - what code says about raw objects: conditions, times, ownership, references, label rules,
  the resourceVersion order;
* `naming` - the name hash and the selectors built from it;
* typed models: v1beta1 (hub) re-exported here, v1alpha1 in `v1alpha1`; `crdgen`, `conversion`.
"""

from __future__ import annotations

from agent_sandbox.api import constants, kinds, meta, naming
from agent_sandbox.api._common import (
    ApiModel,
    Condition,
    EmbeddedObjectMetadata,
    KubeObject,
    ListMeta,
    NameRef,
    ObjectMeta,
    OwnerReference,
    PersistentVolumeClaimTemplate,
    PodMetadata,
    PodTemplate,
    find_condition,
)
from agent_sandbox.api.errortext import describe_error
from agent_sandbox.api.naming import name_hash
from agent_sandbox.api.v1beta1 import (
    ClaimLifecycle,
    EnvVar,
    NetworkPolicySpec,
    Sandbox,
    SandboxClaim,
    SandboxClaimList,
    SandboxClaimSpec,
    SandboxClaimStatus,
    SandboxList,
    SandboxRef,
    SandboxSpec,
    SandboxStatus,
    SandboxTemplate,
    SandboxTemplateList,
    SandboxTemplateSpec,
    SandboxWarmPool,
    SandboxWarmPoolList,
    SandboxWarmPoolSpec,
    SandboxWarmPoolStatus,
    UpdateStrategy,
)

__all__ = [
    "ApiModel",
    "ClaimLifecycle",
    "Condition",
    "EmbeddedObjectMetadata",
    "EnvVar",
    "KubeObject",
    "ListMeta",
    "NameRef",
    "NetworkPolicySpec",
    "ObjectMeta",
    "OwnerReference",
    "PersistentVolumeClaimTemplate",
    "PodMetadata",
    "PodTemplate",
    "Sandbox",
    "SandboxClaim",
    "SandboxClaimList",
    "SandboxClaimSpec",
    "SandboxClaimStatus",
    "SandboxList",
    "SandboxRef",
    "SandboxSpec",
    "SandboxStatus",
    "SandboxTemplate",
    "SandboxTemplateList",
    "SandboxTemplateSpec",
    "SandboxWarmPool",
    "SandboxWarmPoolList",
    "SandboxWarmPoolSpec",
    "SandboxWarmPoolStatus",
    "UpdateStrategy",
    "constants",
    "describe_error",
    "find_condition",
    "kinds",
    "meta",
    "name_hash",
    "naming",
]
