"""agent_sandbox.api: typed models, constants, CRD generation and conversion (no I/O).

Controllers use the v1beta1 (hub) models re-exported here; v1alpha1 models live in
:mod:`agent_sandbox.api.v1alpha1`, wire strings in :mod:`agent_sandbox.api.constants`.
"""

from __future__ import annotations

from agent_sandbox.api import constants
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
from agent_sandbox.api.constants import name_hash
from agent_sandbox.api.errortext import describe_error
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
    "name_hash",
]
