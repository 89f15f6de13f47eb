"""v1alpha1 models of the four kinds: served, deprecated, never stored (api spec §3.2, §4.2, §5.2, §6.2).

Controllers never use these; they exist for the CRD generator, the conversion tests and
clients that still speak v1alpha1. Shared building blocks are structurally identical to
v1beta1 and are reused from :mod:`agent_sandbox.api._common`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar

from pydantic import Field

from agent_sandbox.api._common import (
    ApiModel,
    Condition,
    KubeObject,
    NameRef,
    PodMetadata,
    PodTemplate,
    VolumeClaimTemplates,
)
from agent_sandbox.api._schema import Int32, Schema
from agent_sandbox.api.constants import (
    EXTENSIONS_API_VERSION_V1ALPHA1,
    KIND_SANDBOX,
    KIND_SANDBOX_CLAIM,
    KIND_SANDBOX_TEMPLATE,
    KIND_SANDBOX_WARM_POOL,
    SANDBOX_API_VERSION_V1ALPHA1,
    WARMPOOL_POLICY_DEFAULT,
    EnvVarsInjectionPolicy,
    NetworkPolicyManagement,
    ShutdownPolicy,
)
from agent_sandbox.api.v1beta1 import (
    ClaimLifecycle,
    EnvVar,
    NetworkPolicySpec,
    SandboxRef,
    UpdateStrategy,
)

# ---------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------


class SandboxSpec(ApiModel):
    """v1alpha1 Sandbox spec: ``replicas`` (0/1) instead of ``operatingMode``."""

    pod_template: PodTemplate = Field(alias="podTemplate")
    volume_claim_templates: VolumeClaimTemplates | None = Field(default=None, alias="volumeClaimTemplates")
    service: bool | None = None
    shutdown_time: datetime | None = Field(default=None, alias="shutdownTime")
    shutdown_policy: ShutdownPolicy = Field(default=ShutdownPolicy.RETAIN, alias="shutdownPolicy")
    replicas: Annotated[Int32, Schema(minimum=0, maximum=1)] = 1


class SandboxStatus(ApiModel):
    """v1alpha1 Sandbox status: ``replicas`` (synthesised by conversion), no ``nodeName``."""

    service_fqdn: str | None = Field(default=None, alias="serviceFQDN")
    service: str | None = None
    conditions: list[Condition] | None = None
    replicas: Annotated[Int32 | None, Schema(minimum=0)] = None
    selector: str | None = None
    pod_ips: list[str] | None = Field(default=None, alias="podIPs")


class Sandbox(KubeObject):
    """``agents.x-k8s.io/v1alpha1`` Sandbox (deprecated)."""

    API_VERSION: ClassVar[str] = SANDBOX_API_VERSION_V1ALPHA1
    KIND: ClassVar[str] = KIND_SANDBOX

    spec: SandboxSpec
    status: SandboxStatus = Field(default_factory=SandboxStatus)


# ---------------------------------------------------------------------------
# SandboxTemplate
# ---------------------------------------------------------------------------


class SandboxTemplateSpec(ApiModel):
    """v1alpha1 SandboxTemplate spec: v1beta1 minus ``volumeClaimTemplatesPolicy``."""

    pod_template: PodTemplate = Field(alias="podTemplate")
    volume_claim_templates: VolumeClaimTemplates | None = Field(default=None, alias="volumeClaimTemplates")
    service: bool | None = None
    network_policy: NetworkPolicySpec | None = Field(default=None, alias="networkPolicy")
    network_policy_management: NetworkPolicyManagement = Field(
        default=NetworkPolicyManagement.MANAGED, alias="networkPolicyManagement"
    )
    env_vars_injection_policy: EnvVarsInjectionPolicy = Field(
        default=EnvVarsInjectionPolicy.DISALLOWED, alias="envVarsInjectionPolicy"
    )


class SandboxTemplate(KubeObject):
    """``extensions.agents.x-k8s.io/v1alpha1`` SandboxTemplate (deprecated, no status)."""

    API_VERSION: ClassVar[str] = EXTENSIONS_API_VERSION_V1ALPHA1
    KIND: ClassVar[str] = KIND_SANDBOX_TEMPLATE

    spec: SandboxTemplateSpec


# ---------------------------------------------------------------------------
# SandboxClaim
# ---------------------------------------------------------------------------


class SandboxClaimSpec(ApiModel):
    """v1alpha1 SandboxClaim spec: template ref plus the lowercase ``warmpool`` policy."""

    sandbox_template_ref: NameRef = Field(alias="sandboxTemplateRef")
    #: ``none``, ``default`` (or empty) or a specific pool name. The JSON key is all lowercase.
    warmpool: str = WARMPOOL_POLICY_DEFAULT
    lifecycle: ClaimLifecycle | None = None
    additional_pod_metadata: PodMetadata | None = Field(default=None, alias="additionalPodMetadata")
    env: Annotated[list[EnvVar] | None, Schema(list_type="atomic")] = None


class SandboxClaimStatus(ApiModel):
    """v1alpha1 SandboxClaim status (same shape as v1beta1)."""

    conditions: list[Condition] | None = None
    sandbox: SandboxRef | None = None


class SandboxClaim(KubeObject):
    """``extensions.agents.x-k8s.io/v1alpha1`` SandboxClaim (deprecated)."""

    API_VERSION: ClassVar[str] = EXTENSIONS_API_VERSION_V1ALPHA1
    KIND: ClassVar[str] = KIND_SANDBOX_CLAIM

    spec: SandboxClaimSpec
    status: SandboxClaimStatus = Field(default_factory=SandboxClaimStatus)


# ---------------------------------------------------------------------------
# SandboxWarmPool
# ---------------------------------------------------------------------------


class SandboxWarmPoolSpec(ApiModel):
    """v1alpha1 SandboxWarmPool spec: ``replicas`` is required and has no default."""

    replicas: Annotated[Int32, Schema(minimum=0)]
    sandbox_template_ref: NameRef = Field(alias="sandboxTemplateRef")
    update_strategy: UpdateStrategy | None = Field(default=None, alias="updateStrategy")


class SandboxWarmPoolStatus(ApiModel):
    """v1alpha1 SandboxWarmPool status: no ``observedGeneration``."""

    replicas: Int32 | None = None
    ready_replicas: Int32 | None = Field(default=None, alias="readyReplicas")
    selector: str | None = None


class SandboxWarmPool(KubeObject):
    """``extensions.agents.x-k8s.io/v1alpha1`` SandboxWarmPool (deprecated)."""

    API_VERSION: ClassVar[str] = EXTENSIONS_API_VERSION_V1ALPHA1
    KIND: ClassVar[str] = KIND_SANDBOX_WARM_POOL

    spec: SandboxWarmPoolSpec
    status: SandboxWarmPoolStatus = Field(default_factory=SandboxWarmPoolStatus)


#: v1alpha1 model per kind name.
MODELS: dict[str, type[KubeObject]] = {
    KIND_SANDBOX: Sandbox,
    KIND_SANDBOX_TEMPLATE: SandboxTemplate,
    KIND_SANDBOX_CLAIM: SandboxClaim,
    KIND_SANDBOX_WARM_POOL: SandboxWarmPool,
}
