"""Every wire string of the agent-sandbox API, in one place.

Owns: API groups, versions, kinds, plurals and CRD names; label and annotation keys;
condition types and reasons; event reasons; the string enums used in specs; the
finalizer list (empty); ownership rules (reserved prefixes, owner matching by group +
kind, created-by normalisation); the webhook / certificate names; and the name hash
(api spec §7.5, controllers spec §0.2).

Does not own: any I/O, defaults applied by controllers, or the CRD schemas themselves
(see ``agent_sandbox.api.crdgen``). All values are copied verbatim from upstream
kubernetes-sigs/agent-sandbox; changing one breaks wire compatibility.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

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


@dataclass(frozen=True, slots=True)
class KindInfo:
    """Names of one kind, as they appear in its CRD (api spec §1.1)."""

    group: str
    kind: str
    plural: str
    singular: str
    list_kind: str
    short_names: tuple[str, ...]

    @property
    def crd_name(self) -> str:
        """``<plural>.<group>``, the CustomResourceDefinition object name."""
        return f"{self.plural}.{self.group}"

    def api_version(self, version: str = HUB_VERSION) -> str:
        """``<group>/<version>`` for this kind."""
        return f"{self.group}/{version}"


SANDBOX: Final = KindInfo(GROUP, KIND_SANDBOX, PLURAL_SANDBOXES, "sandbox", "SandboxList", ("sandbox",))
SANDBOX_TEMPLATE: Final = KindInfo(
    EXTENSIONS_GROUP,
    KIND_SANDBOX_TEMPLATE,
    PLURAL_SANDBOX_TEMPLATES,
    "sandboxtemplate",
    "SandboxTemplateList",
    ("sandboxtemplate",),
)
SANDBOX_CLAIM: Final = KindInfo(
    EXTENSIONS_GROUP,
    KIND_SANDBOX_CLAIM,
    PLURAL_SANDBOX_CLAIMS,
    "sandboxclaim",
    "SandboxClaimList",
    ("sandboxclaim",),
)
SANDBOX_WARM_POOL: Final = KindInfo(
    EXTENSIONS_GROUP,
    KIND_SANDBOX_WARM_POOL,
    PLURAL_SANDBOX_WARM_POOLS,
    "sandboxwarmpool",
    "SandboxWarmPoolList",
    ("swp",),
)
#: The four kinds in CRD-file order (core first, then extensions alphabetically by plural).
ALL_KINDS: Final[tuple[KindInfo, ...]] = (SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL)
KINDS_BY_NAME: Final[Mapping[str, KindInfo]] = {k.kind: k for k in ALL_KINDS}

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
_CREATED_BY_KNOWN: Final = frozenset({CREATED_BY_GO_CLIENT, CREATED_BY_PYTHON_CLIENT, CREATED_BY_CONTROLLER})

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
# Ownership rules (api spec §7.4, controllers spec §0.3-§0.4)
# ---------------------------------------------------------------------------

#: Label/annotation prefixes never copied from a user pod template onto a Pod.
RESERVED_PREFIXES: Final[tuple[str, ...]] = (f"{GROUP}/", f"{EXTENSIONS_GROUP}/")
#: Annotation keys additionally never copied onto a Pod.
RESERVED_ANNOTATION_KEYS: Final = frozenset({ANNOTATION_TRACE_CONTEXT})


def is_reserved_label(key: str) -> bool:
    """True if a pod-template label key must not be propagated to the Pod."""
    return key.startswith(RESERVED_PREFIXES)


def is_reserved_annotation(key: str) -> bool:
    """True if a pod-template annotation key must not be propagated to the Pod."""
    return key.startswith(RESERVED_PREFIXES) or key in RESERVED_ANNOTATION_KEYS


def normalize_created_by(value: str | None) -> str:
    """Normalise a ``created-by`` label value for the Pod (controllers spec §0.3).

    ``go-client``, ``python-client`` and ``controller`` pass through; anything else,
    including a missing or empty value, becomes ``unknown``.
    """
    if value is not None and value in _CREATED_BY_KNOWN:
        return value
    return CREATED_BY_UNKNOWN


def api_group(api_version: str) -> str:
    """The group part of an ``apiVersion`` (``""`` for the core group ``v1``)."""
    group, sep, _ = api_version.rpartition("/")
    return group if sep else ""


def owner_ref_matches(ref: Mapping[str, Any], group: str, kind: str) -> bool:
    """True if an owner reference points at ``group``/``kind``, whatever its version.

    Owner references keep the apiVersion current when they were written (a pool member
    may still say ``extensions.agents.x-k8s.io/v1alpha1``), so upstream compares group and
    kind only; so must we.
    """
    return ref.get("kind") == kind and api_group(str(ref.get("apiVersion", ""))) == group


def controller_ref(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference with ``controller: true`` in ``metadata``, if any."""
    for ref in metadata.get("ownerReferences") or ():
        if ref.get("controller") is True:
            found: Mapping[str, Any] = ref
            return found
    return None


class Ownership(enum.StrEnum):
    """Classification of an object relative to a would-be owner (controllers spec §0.4)."""

    OWNED = "owned"
    UNOWNED = "unowned"
    FOREIGN = "foreign"


def classify_ownership(metadata: Mapping[str, Any], owner_uid: str) -> Ownership:
    """Classify an object by its controller owner reference against ``owner_uid``."""
    ref = controller_ref(metadata)
    if ref is None:
        return Ownership.UNOWNED
    return Ownership.OWNED if ref.get("uid") == owner_uid else Ownership.FOREIGN


def new_controller_ref(*, api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    """A controller owner reference as every agent-sandbox controller writes it."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# ---------------------------------------------------------------------------
# Name hash (api spec §7.5, controllers spec §0.2)
# ---------------------------------------------------------------------------

_FNV32_OFFSET: Final = 0x811C9DC5
_FNV32_PRIME: Final = 0x01000193

#: Known-good vectors from the upstream spec; asserted by the unit tests.
NAME_HASH_TEST_VECTORS: Final[Mapping[str, str]] = {
    "": "811c9dc5",
    "a": "e40c292c",
    "pool": "91dd7983",
    "my-sandbox": "374de8f5",
    "sandbox-name": "ab179450",
    "test-template": "69155462",
}


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a of ``data``."""
    h = _FNV32_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV32_PRIME) & 0xFFFFFFFF
    return h


def name_hash(name: str) -> str:
    """``NameHash``: FNV-1a 32 of the UTF-8 bytes, as 8 lowercase zero-padded hex digits.

    Used as the value of ``sandbox-name-hash``, ``warm-pool-sandbox`` and
    ``sandbox-template-ref-hash``; must match upstream bit for bit.
    """
    return f"{fnv1a_32(name.encode('utf-8')):08x}"


def sandbox_selector(sandbox_name: str) -> str:
    """Sandbox ``status.selector``: ``agents.x-k8s.io/sandbox-name-hash=<hash>``."""
    return f"{LABEL_SANDBOX_NAME_HASH}={name_hash(sandbox_name)}"


def warm_pool_selector(pool_name: str) -> str:
    """SandboxWarmPool ``status.selector``: ``agents.x-k8s.io/warm-pool-sandbox=<hash>``."""
    return f"{LABEL_WARM_POOL_SANDBOX}={name_hash(pool_name)}"
