"""Every wire string of the agent-sandbox API, in one place.

Owns: API groups, versions, kind names and plurals; label and annotation keys; condition types and
reasons; event reasons; the string enums used in specs; the finalizer list (empty); the webhook /
certificate names (api spec §7, controllers spec §0).

Does not own logic: the kinds as types live in `api.kinds`, the name hash in `api.naming`, ownership,
conditions, time and label rules in `api.meta`. All values are copied verbatim from upstream
kubernetes-sigs/agent-sandbox; changing one breaks wire compatibility.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

# ---------------------------------------------------------------------------
# Groups, versions, kinds (api spec §1.1, controllers spec §0.1)
# ---------------------------------------------------------------------------

GROUP: Final = "agents.x-k8s.io"
EXTENSIONS_GROUP: Final = "extensions.agents.x-k8s.io"
V1BETA1: Final = "v1beta1"
V1ALPHA1: Final = "v1alpha1"
#: Hub (storage) version of every kind; the only version controllers read and write.
HUB_VERSION: Final = V1BETA1
#: The only spoke version; served (deprecated) through the conversion webhook.
SPOKE_VERSION: Final = V1ALPHA1

SANDBOX_API_VERSION: Final = f"{GROUP}/{V1BETA1}"
EXTENSIONS_API_VERSION: Final = f"{EXTENSIONS_GROUP}/{V1BETA1}"
SANDBOX_API_VERSION_V1ALPHA1: Final = f"{GROUP}/{V1ALPHA1}"
EXTENSIONS_API_VERSION_V1ALPHA1: Final = f"{EXTENSIONS_GROUP}/{V1ALPHA1}"

KIND_SANDBOX: Final = "Sandbox"
KIND_SANDBOX_TEMPLATE: Final = "SandboxTemplate"
KIND_SANDBOX_CLAIM: Final = "SandboxClaim"
KIND_SANDBOX_WARM_POOL: Final = "SandboxWarmPool"

PLURAL_SANDBOXES: Final = "sandboxes"
PLURAL_SANDBOX_TEMPLATES: Final = "sandboxtemplates"
PLURAL_SANDBOX_CLAIMS: Final = "sandboxclaims"
PLURAL_SANDBOX_WARM_POOLS: Final = "sandboxwarmpools"


# ---------------------------------------------------------------------------
# String enums used in specs (api spec §3-§6). StrEnum members compare equal to the
# plain wire strings, so `mode == "Suspended"` works either way.
# ---------------------------------------------------------------------------


class OperatingMode(enum.StrEnum):
    """Sandbox v1beta1 ``spec.operatingMode``."""

    RUNNING = "Running"
    SUSPENDED = "Suspended"


class ShutdownPolicy(enum.StrEnum):
    """Sandbox ``spec.shutdownPolicy``."""

    DELETE = "Delete"
    RETAIN = "Retain"


class ClaimShutdownPolicy(enum.StrEnum):
    """SandboxClaim ``spec.lifecycle.shutdownPolicy``."""

    DELETE = "Delete"
    DELETE_FOREGROUND = "DeleteForeground"
    RETAIN = "Retain"


class NetworkPolicyManagement(enum.StrEnum):
    """SandboxTemplate ``spec.networkPolicyManagement``."""

    MANAGED = "Managed"
    UNMANAGED = "Unmanaged"


class EnvVarsInjectionPolicy(enum.StrEnum):
    """SandboxTemplate ``spec.envVarsInjectionPolicy`` (enum order as in the upstream CRD)."""

    ALLOWED = "Allowed"
    OVERRIDES = "Overrides"
    DISALLOWED = "Disallowed"


class VolumeClaimTemplatesPolicy(enum.StrEnum):
    """SandboxTemplate v1beta1 ``spec.volumeClaimTemplatesPolicy`` (enum order as upstream)."""

    DISALLOWED = "Disallowed"
    ALLOWED = "Allowed"
    OVERRIDES = "Overrides"


class UpdateStrategyType(enum.StrEnum):
    """SandboxWarmPool ``spec.updateStrategy.type`` (enum order as upstream)."""

    RECREATE = "Recreate"
    ON_REPLENISH = "OnReplenish"


class ConditionStatus(enum.StrEnum):
    """``metav1.Condition.status``."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


# v1alpha1 claim `spec.warmpool` reserved values (api spec §5.2).
WARMPOOL_POLICY_NONE: Final = "none"
WARMPOOL_POLICY_DEFAULT: Final = "default"

# ---------------------------------------------------------------------------
# Labels (api spec §7.1)
# ---------------------------------------------------------------------------

LABEL_SANDBOX_NAME_HASH: Final = "agents.x-k8s.io/sandbox-name-hash"
LABEL_ADOPTABLE: Final = "agents.x-k8s.io/adoptable"
LABEL_WARM_POOL_SANDBOX: Final = "agents.x-k8s.io/warm-pool-sandbox"
LABEL_SANDBOX_TEMPLATE_REF_HASH: Final = "agents.x-k8s.io/sandbox-template-ref-hash"
LABEL_SANDBOX_TEMPLATE_HASH: Final = "agents.x-k8s.io/sandbox-template-hash"
#: Deprecated upstream; still written for external consumers.
LABEL_SANDBOX_POD_TEMPLATE_HASH: Final = "agents.x-k8s.io/sandbox-pod-template-hash"
LABEL_LAUNCH_TYPE: Final = "agents.x-k8s.io/launch-type"
LABEL_CREATED_BY: Final = "agents.x-k8s.io/created-by"
LABEL_CLAIM_UID: Final = "agents.x-k8s.io/claim-uid"
#: Legacy *label* on SandboxClaim (migrated to the annotation of the same key).
LABEL_SANDBOX_NAME_LEGACY: Final = "agents.x-k8s.io/sandbox-name"
#: Label on pool members' Pods used by the default NetworkPolicy ingress rule.
LABEL_APP: Final = "app"
SANDBOX_ROUTER_APP: Final = "sandbox-router"

LAUNCH_TYPE_COLD: Final = "cold"
LAUNCH_TYPE_WARM: Final = "warm"
ADOPTABLE_TRUE: Final = "true"

CREATED_BY_GO_CLIENT: Final = "go-client"
CREATED_BY_PYTHON_CLIENT: Final = "python-client"
CREATED_BY_CONTROLLER: Final = "controller"
CREATED_BY_UNKNOWN: Final = "unknown"

# ---------------------------------------------------------------------------
# Annotations (api spec §7.2)
# ---------------------------------------------------------------------------

ANNOTATION_POD_NAME: Final = "agents.x-k8s.io/pod-name"
ANNOTATION_SANDBOX_TEMPLATE_REF: Final = "agents.x-k8s.io/sandbox-template-ref"
ANNOTATION_PROPAGATED_LABELS: Final = "agents.x-k8s.io/propagated-labels"
ANNOTATION_PROPAGATED_ANNOTATIONS: Final = "agents.x-k8s.io/propagated-annotations"
ANNOTATION_SANDBOX_NAME: Final = "agents.x-k8s.io/sandbox-name"
ANNOTATION_CLIENT_FIRST_REQUESTED_AT: Final = "agents.x-k8s.io/client-first-requested-at"
ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT: Final = "agents.x-k8s.io/controller-first-observed-at"
ANNOTATION_CLAIM_FIRST_READY_AT: Final = "agents.x-k8s.io/claim-first-ready-at"
ANNOTATION_WEBHOOK_FIRST_OBSERVED_AT: Final = "agents.x-k8s.io/webhook-first-observed-at"
#: Constant only; not written by current upstream controllers.
ANNOTATION_CREATION_LATENCY_RECORDED: Final = "agents.x-k8s.io/creation-latency-recorded"
ANNOTATION_TRACE_CONTEXT: Final = "opentelemetry.io/trace-context"
ANNOTATION_SAFE_TO_EVICT: Final = "cluster-autoscaler.kubernetes.io/safe-to-evict"
CLAIM_FIRST_READY_UNKNOWN: Final = "unknown"

# Conversion bookkeeping (api spec §8.2, §8.5).
ANNOTATION_V1ALPHA1_SANDBOX_STATE: Final = "api.agents.x-k8s.io/v1alpha1-sandbox-state"
ANNOTATION_V1ALPHA1_SANDBOXCLAIM_STATE: Final = "api.agents.x-k8s.io/v1alpha1-sandboxclaim-state"
ANNOTATION_V1ALPHA1_SANDBOXTEMPLATE_STATE: Final = "api.agents.x-k8s.io/v1alpha1-sandboxtemplate-state"
ANNOTATION_V1ALPHA1_SANDBOXWARMPOOL_STATE: Final = "api.agents.x-k8s.io/v1alpha1-sandboxwarmpool-state"
ANNOTATION_V1BETA1_VCT_POLICY: Final = "api.agents.x-k8s.io/v1beta1-volume-claim-templates-policy"
#: Snapshot annotation per kind name.
STATE_ANNOTATIONS: Final[Mapping[str, str]] = {
    KIND_SANDBOX: ANNOTATION_V1ALPHA1_SANDBOX_STATE,
    KIND_SANDBOX_CLAIM: ANNOTATION_V1ALPHA1_SANDBOXCLAIM_STATE,
    KIND_SANDBOX_TEMPLATE: ANNOTATION_V1ALPHA1_SANDBOXTEMPLATE_STATE,
    KIND_SANDBOX_WARM_POOL: ANNOTATION_V1ALPHA1_SANDBOXWARMPOOL_STATE,
}

# Storage migration (api spec §7.2, §8.7).
ANNOTATION_STORAGE_MIGRATED_AT: Final = "agents.x-k8s.io/storage-migrated-at"
ANNOTATION_MIGRATION_SHADOW: Final = "agents.x-k8s.io/migration-shadow"
ANNOTATION_MIGRATION_SOURCE_TEMPLATE: Final = "agents.x-k8s.io/migration-source-template"
SHADOW_POOL_PREFIX: Final = "shadow-pool-"

# ---------------------------------------------------------------------------
# Finalizers (api spec §7.3): none. Cleanup is owner-reference garbage collection.
# ---------------------------------------------------------------------------

FINALIZERS: Final[tuple[str, ...]] = ()

# ---------------------------------------------------------------------------
# Conditions (api spec §3.4, §5.4)
# ---------------------------------------------------------------------------

CONDITION_READY: Final = "Ready"
CONDITION_SUSPENDED: Final = "Suspended"
CONDITION_FINISHED: Final = "Finished"
CONDITION_POD_SCHEDULED: Final = "PodScheduled"

# Sandbox Ready reasons.
REASON_DEPENDENCIES_READY: Final = "DependenciesReady"
REASON_DEPENDENCIES_NOT_READY: Final = "DependenciesNotReady"
REASON_SANDBOX_SUSPENDED: Final = "SandboxSuspended"
REASON_POD_SUCCEEDED: Final = "PodSucceeded"
REASON_POD_FAILED: Final = "PodFailed"
REASON_SANDBOX_EXPIRED: Final = "SandboxExpired"
REASON_RECONCILER_ERROR: Final = "ReconcilerError"
REASON_MULTIPLE_PODS: Final = "MultiplePods"
#: Prefix of ReconcilerError messages.
RECONCILER_ERROR_MESSAGE_PREFIX: Final = "Error seen: "

# Sandbox Suspended reasons.
REASON_NOT_SUSPENDED: Final = "NotSuspended"
REASON_POD_TERMINATING: Final = "PodTerminating"
REASON_POD_NOT_OWNED: Final = "PodNotOwned"
REASON_POD_TERMINATED: Final = "PodTerminated"
REASON_POD_STATE_UNKNOWN: Final = "PodStateUnknown"
#: v1alpha1 name, defined but not written (superseded by PodTerminating).
REASON_POD_NOT_TERMINATED: Final = "PodNotTerminated"

# Sandbox PodScheduled reasons (otherwise the Pod's own reason is mirrored).
REASON_POD_SCHEDULED: Final = "PodScheduled"
REASON_POD_SCHEDULING_UNKNOWN: Final = "PodSchedulingUnknown"

# SandboxClaim Ready reasons (besides the mirrored Sandbox reasons).
REASON_SANDBOX_NOT_READY: Final = "SandboxNotReady"
REASON_SANDBOX_MISSING: Final = "SandboxMissing"
REASON_CLAIM_EXPIRED: Final = "ClaimExpired"
REASON_WARM_POOL_NOT_FOUND: Final = "WarmPoolNotFound"
REASON_TEMPLATE_NOT_FOUND: Final = "TemplateNotFound"
REASON_INVALID_METADATA: Final = "InvalidMetadata"
REASON_ENV_VARS_INJECTION_REJECTED: Final = "EnvVarsInjectionRejected"
REASON_VOLUME_CLAIM_TEMPLATES_ERROR: Final = "VolumeClaimTemplatesError"
REASON_ADOPTION_CONFLICT: Final = "AdoptionConflict"
REASON_SANDBOX_CREATE_PENDING: Final = "SandboxCreatePending"

#: Claim Ready reasons the upstream Python SDK treats as terminal.
TERMINAL_CLAIM_REASONS: Final = frozenset(
    {
        REASON_INVALID_METADATA,
        REASON_ENV_VARS_INJECTION_REJECTED,
        REASON_VOLUME_CLAIM_TEMPLATES_ERROR,
        REASON_CLAIM_EXPIRED,
        REASON_SANDBOX_EXPIRED,
    }
)

# ---------------------------------------------------------------------------
# Event reasons (api spec §5.4, §6.3; controllers spec §5.10)
# ---------------------------------------------------------------------------

EVENT_CLAIM_EXPIRED: Final = "ClaimExpired"
EVENT_SANDBOX_ADOPTED: Final = "SandboxAdopted"
EVENT_SANDBOX_PROVISIONED: Final = "SandboxProvisioned"
EVENT_WARM_POOL_PROGRESSING: Final = "WarmPoolProgressing"
EVENT_WARM_POOL_NOT_PROGRESSING: Final = "WarmPoolNotProgressing"
EVENT_MULTIPLE_PODS: Final = "MultiplePods"
#: Ours (not upstream's): a child the API server refused to create, as a ReplicaSet's Warning.
EVENT_FAILED_CREATE: Final = "FailedCreate"
#: Ours: a warm pool's template does not exist (Warning) / exists again (Normal); warmpool-quirks.md.
EVENT_SANDBOX_TEMPLATE_NOT_FOUND: Final = "SandboxTemplateNotFound"
EVENT_SANDBOX_TEMPLATE_FOUND: Final = "SandboxTemplateFound"

# ---------------------------------------------------------------------------
# Conversion webhook and certificates (api spec §1.3, §8.2; controllers spec §5.7)
# ---------------------------------------------------------------------------

WEBHOOK_SERVICE_NAME: Final = "agent-sandbox-webhook-service"
WEBHOOK_NAMESPACE: Final = "agent-sandbox-system"
WEBHOOK_PATH: Final = "/convert"
WEBHOOK_PORT: Final = 9443
WEBHOOK_CERTS_SECRET: Final = "agent-sandbox-webhook-certs"
WEBHOOK_CA_COMMON_NAME: Final = "agent-sandbox-conversion-webhook-ca"
CONVERSION_REVIEW_VERSIONS: Final[tuple[str, ...]] = ("v1", "v1beta1")
DEFAULT_CLUSTER_DOMAIN: Final = "cluster.local"


# ---------------------------------------------------------------------------
# Moved out (logic, not wire strings). Still importable from here so code written against the old layout
# keeps working; new code imports them from `api.meta`, `api.naming` or `api.kinds`.
# ---------------------------------------------------------------------------

_MOVED: Final[Mapping[str, str]] = {
    **dict.fromkeys(
        (
            "RESERVED_ANNOTATION_KEYS",
            "RESERVED_PREFIXES",
            "Ownership",
            "api_group",
            "classify_ownership",
            "controller_ref",
            "is_reserved_annotation",
            "is_reserved_label",
            "new_controller_ref",
            "normalize_created_by",
            "owner_ref_matches",
        ),
        "agent_sandbox.api.meta",
    ),
    **dict.fromkeys(
        ("NAME_HASH_TEST_VECTORS", "fnv1a_32", "name_hash", "sandbox_selector", "warm_pool_selector"),
        "agent_sandbox.api.naming",
    ),
    **dict.fromkeys(
        ("ALL_KINDS", "KINDS_BY_NAME", "SANDBOX", "SANDBOX_CLAIM", "SANDBOX_TEMPLATE", "SANDBOX_WARM_POOL"),
        "agent_sandbox.api.kinds",
    ),
}

if TYPE_CHECKING:  # explicit re-exports, so type checkers see the real signatures
    from .kinds import (
        ALL_KINDS as ALL_KINDS,
    )
    from .kinds import (
        KINDS_BY_NAME as KINDS_BY_NAME,
    )
    from .kinds import (
        SANDBOX as SANDBOX,
    )
    from .kinds import (
        SANDBOX_CLAIM as SANDBOX_CLAIM,
    )
    from .kinds import (
        SANDBOX_TEMPLATE as SANDBOX_TEMPLATE,
    )
    from .kinds import (
        SANDBOX_WARM_POOL as SANDBOX_WARM_POOL,
    )
    from .meta import (
        RESERVED_ANNOTATION_KEYS as RESERVED_ANNOTATION_KEYS,
    )
    from .meta import (
        RESERVED_PREFIXES as RESERVED_PREFIXES,
    )
    from .meta import (
        Ownership as Ownership,
    )
    from .meta import (
        api_group as api_group,
    )
    from .meta import (
        classify_ownership as classify_ownership,
    )
    from .meta import (
        controller_ref as controller_ref,
    )
    from .meta import (
        is_reserved_annotation as is_reserved_annotation,
    )
    from .meta import (
        is_reserved_label as is_reserved_label,
    )
    from .meta import (
        new_controller_ref as new_controller_ref,
    )
    from .meta import (
        normalize_created_by as normalize_created_by,
    )
    from .meta import (
        owner_ref_matches as owner_ref_matches,
    )
    from .naming import (
        NAME_HASH_TEST_VECTORS as NAME_HASH_TEST_VECTORS,
    )
    from .naming import (
        fnv1a_32 as fnv1a_32,
    )
    from .naming import (
        name_hash as name_hash,
    )
    from .naming import (
        sandbox_selector as sandbox_selector,
    )
    from .naming import (
        warm_pool_selector as warm_pool_selector,
    )


def __getattr__(name: str) -> Any:
    # Lazy: meta, naming and kinds import this module.
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
