"""v1beta1 models of the four kinds: the hub and storage version (api spec §3.1, §4.1, §5.1, §6.1).

Controllers read and write only this version. Python defaults equal the CRD defaults,
so an object built in code behaves like one read back from the API server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar

from pydantic import Field

from agent_sandbox.api._common import (
    ApiModel,
    Condition,
    KubeObject,
    ListMeta,
    NameRef,
    PodMetadata,
    PodTemplate,
    VolumeClaimTemplates,
)
from agent_sandbox.api._schema import EgressRuleDict, IngressRuleDict, Int32, Int64, Schema
from agent_sandbox.api.constants import (
    EXTENSIONS_API_VERSION,
    KIND_SANDBOX,
    KIND_SANDBOX_CLAIM,
    KIND_SANDBOX_TEMPLATE,
    KIND_SANDBOX_WARM_POOL,
    SANDBOX_API_VERSION,
    ClaimShutdownPolicy,
    EnvVarsInjectionPolicy,
    NetworkPolicyManagement,
    OperatingMode,
    ShutdownPolicy,
    UpdateStrategyType,
    VolumeClaimTemplatesPolicy,
)

#: CEL transition rule on the v1beta1 Sandbox ``spec`` (api spec §3.3).
VCT_IMMUTABLE_RULE = (
    "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && "
    "(!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)"
)
VCT_IMMUTABLE_MESSAGE = "volumeClaimTemplates is immutable"

# ---------------------------------------------------------------------------
# Sandbox (agents.x-k8s.io)
# ---------------------------------------------------------------------------


class SandboxSpec(ApiModel):
    """Sandbox spec: blueprint (podTemplate, volumeClaimTemplates, service) + lifecycle + mode."""

    pod_template: PodTemplate = Field(alias="podTemplate")
    volume_claim_templates: VolumeClaimTemplates | None = Field(default=None, alias="volumeClaimTemplates")
    #: Tri-state: True = keep a headless Service, False = delete it, None = keep only an existing one.
    service: bool | None = None
    shutdown_time: datetime | None = Field(default=None, alias="shutdownTime")
    shutdown_policy: ShutdownPolicy = Field(default=ShutdownPolicy.RETAIN, alias="shutdownPolicy")
    operating_mode: OperatingMode = Field(default=OperatingMode.RUNNING, alias="operatingMode")


class SandboxStatus(ApiModel):
    """Sandbox status."""

    service_fqdn: str | None = Field(default=None, alias="serviceFQDN")
    service: str | None = None
    conditions: list[Condition] | None = None
    selector: str | None = None
    pod_ips: list[str] | None = Field(default=None, alias="podIPs")
    node_name: str | None = Field(default=None, alias="nodeName")


class Sandbox(KubeObject):
    """``agents.x-k8s.io/v1beta1`` Sandbox: one singleton, stateful Pod."""

    API_VERSION: ClassVar[str] = SANDBOX_API_VERSION
    KIND: ClassVar[str] = KIND_SANDBOX

    spec: Annotated[SandboxSpec, Schema(validations=((VCT_IMMUTABLE_RULE, VCT_IMMUTABLE_MESSAGE),))]
    status: SandboxStatus = Field(default_factory=SandboxStatus)


class SandboxList(ApiModel):
    """``SandboxList``."""

    api_version: str = Field(default=SANDBOX_API_VERSION, alias="apiVersion")
    kind: str = "SandboxList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[Sandbox] = Field(default_factory=list)


# ---------------------------------------------------------------------------
# SandboxTemplate (extensions.agents.x-k8s.io)
# ---------------------------------------------------------------------------


class NetworkPolicySpec(ApiModel):
    """Restricted NetworkPolicy spec of a template: only ingress and egress rules."""

    ingress: list[IngressRuleDict] | None = None
    egress: list[EgressRuleDict] | None = None


class SandboxTemplateSpec(ApiModel):
    """SandboxTemplate spec: the blueprint plus network and claim-customisation policies."""

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
    volume_claim_templates_policy: VolumeClaimTemplatesPolicy = Field(
        default=VolumeClaimTemplatesPolicy.DISALLOWED, alias="volumeClaimTemplatesPolicy"
    )


class SandboxTemplate(KubeObject):
    """``extensions.agents.x-k8s.io/v1beta1`` SandboxTemplate (no status)."""

    API_VERSION: ClassVar[str] = EXTENSIONS_API_VERSION
    KIND: ClassVar[str] = KIND_SANDBOX_TEMPLATE

    spec: SandboxTemplateSpec


class SandboxTemplateList(ApiModel):
    """``SandboxTemplateList``."""

    api_version: str = Field(default=EXTENSIONS_API_VERSION, alias="apiVersion")
    kind: str = "SandboxTemplateList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[SandboxTemplate] = Field(default_factory=list)


# ---------------------------------------------------------------------------
# SandboxClaim (extensions.agents.x-k8s.io)
# ---------------------------------------------------------------------------


class ClaimLifecycle(ApiModel):
    """Claim expiry: absolute time and/or TTL after ``Finished``, plus the policy."""

    shutdown_time: datetime | None = Field(default=None, alias="shutdownTime")
    ttl_seconds_after_finished: Annotated[Int32 | None, Schema(minimum=0)] = Field(
        default=None, alias="ttlSecondsAfterFinished"
    )
    shutdown_policy: ClaimShutdownPolicy = Field(default=ClaimShutdownPolicy.RETAIN, alias="shutdownPolicy")


class EnvVar(ApiModel):
    """A literal environment variable injected by a claim (not core/v1 EnvVar)."""

    name: str
    value: str
    container_name: str | None = Field(default=None, alias="containerName")


class SandboxClaimSpec(ApiModel):
    """SandboxClaim spec: the pool to draw from plus per-claim customisation."""

    warm_pool_ref: NameRef = Field(alias="warmPoolRef")
    lifecycle: ClaimLifecycle | None = None
    additional_pod_metadata: PodMetadata | None = Field(default=None, alias="additionalPodMetadata")
    env: Annotated[list[EnvVar] | None, Schema(list_type="atomic")] = None
    volume_claim_templates: VolumeClaimTemplates | None = Field(default=None, alias="volumeClaimTemplates")


class SandboxRef(ApiModel):
    """``status.sandbox``: the bound Sandbox."""

    name: str | None = None
    pod_ips: list[str] | None = Field(default=None, alias="podIPs")


class SandboxClaimStatus(ApiModel):
    """SandboxClaim status."""

    conditions: list[Condition] | None = None
    sandbox: SandboxRef | None = None


class SandboxClaim(KubeObject):
    """``extensions.agents.x-k8s.io/v1beta1`` SandboxClaim: a request for one Sandbox."""

    API_VERSION: ClassVar[str] = EXTENSIONS_API_VERSION
    KIND: ClassVar[str] = KIND_SANDBOX_CLAIM

    spec: SandboxClaimSpec
    status: SandboxClaimStatus = Field(default_factory=SandboxClaimStatus)


class SandboxClaimList(ApiModel):
    """``SandboxClaimList``."""

    api_version: str = Field(default=EXTENSIONS_API_VERSION, alias="apiVersion")
    kind: str = "SandboxClaimList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[SandboxClaim] = Field(default_factory=list)


# ---------------------------------------------------------------------------
# SandboxWarmPool (extensions.agents.x-k8s.io)
# ---------------------------------------------------------------------------


class UpdateStrategy(ApiModel):
    """How stale unclaimed pool members are replaced."""

    type: UpdateStrategyType = UpdateStrategyType.ON_REPLENISH


class SandboxWarmPoolSpec(ApiModel):
    """SandboxWarmPool spec."""

    replicas: Annotated[Int32, Schema(minimum=0)] = 1
    sandbox_template_ref: NameRef = Field(alias="sandboxTemplateRef")
    update_strategy: UpdateStrategy | None = Field(default=None, alias="updateStrategy")


class SandboxWarmPoolStatus(ApiModel):
    """SandboxWarmPool status (``replicas``/``selector`` back the scale subresource)."""

    replicas: Int32 | None = None
    ready_replicas: Int32 | None = Field(default=None, alias="readyReplicas")
    selector: str | None = None
    observed_generation: Annotated[Int64 | None, Schema(minimum=0)] = Field(
        default=None, alias="observedGeneration"
    )


class SandboxWarmPool(KubeObject):
    """``extensions.agents.x-k8s.io/v1beta1`` SandboxWarmPool: N pre-provisioned Sandboxes."""

    API_VERSION: ClassVar[str] = EXTENSIONS_API_VERSION
    KIND: ClassVar[str] = KIND_SANDBOX_WARM_POOL

    spec: SandboxWarmPoolSpec
    status: SandboxWarmPoolStatus = Field(default_factory=SandboxWarmPoolStatus)


class SandboxWarmPoolList(ApiModel):
    """``SandboxWarmPoolList``."""

    api_version: str = Field(default=EXTENSIONS_API_VERSION, alias="apiVersion")
    kind: str = "SandboxWarmPoolList"
    metadata: ListMeta = Field(default_factory=ListMeta)
    items: list[SandboxWarmPool] = Field(default_factory=list)


#: v1beta1 model per kind name.
MODELS: dict[str, type[KubeObject]] = {
    KIND_SANDBOX: Sandbox,
    KIND_SANDBOX_TEMPLATE: SandboxTemplate,
    KIND_SANDBOX_CLAIM: SandboxClaim,
    KIND_SANDBOX_WARM_POOL: SandboxWarmPool,
}
