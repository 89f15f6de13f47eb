"""Assemble the four CustomResourceDefinitions (api spec §1-§6, operations spec §2.4).

Everything wire-visible that is not a field schema lives in the tables below: versions
and their order (v1beta1 first), served/storage/deprecation, subresources, printer
columns and the conversion stanza. Field schemas come from the models (``_models``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api import kinds, v1alpha1, v1beta1
from agent_sandbox.api._common import KubeObject
from agent_sandbox.api.crdgen._models import JSONSchema, model_schema
from agent_sandbox.api.kinds import ResourceKind

_AGE = {"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"}
_READY_STATUS = {
    "jsonPath": ".status.conditions[?(@.type=='Ready')].status",
    "name": "Ready",
    "type": "string",
}
_READY_REASON = {
    "jsonPath": ".status.conditions[?(@.type=='Ready')].reason",
    "name": "Reason",
    "type": "string",
}
_POOL_COLUMNS = (
    {"jsonPath": ".status.readyReplicas", "name": "Ready", "type": "integer"},
    {"jsonPath": ".spec.replicas", "name": "Desired", "type": "integer"},
    _AGE,
)
#: Same paths on every scale subresource (Sandbox v1alpha1, SandboxWarmPool both versions).
SCALE = {
    "labelSelectorPath": ".status.selector",
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
}


@dataclass(frozen=True)
class Version:
    """One entry of ``spec.versions``."""

    name: str
    model: type[KubeObject]
    status: bool
    scale: bool = False
    columns: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class KindSpec:
    """A CRD: the kind's names plus its versions, hub first."""

    info: ResourceKind
    versions: tuple[Version, ...] = field(default_factory=tuple)


KIND_SPECS: tuple[KindSpec, ...] = (
    KindSpec(
        kinds.SANDBOX,
        (
            Version(c.V1BETA1, v1beta1.Sandbox, status=True, columns=(_READY_STATUS, _READY_REASON, _AGE)),
            Version(c.V1ALPHA1, v1alpha1.Sandbox, status=True, scale=True),
        ),
    ),
    KindSpec(
        kinds.SANDBOX_CLAIM,
        (
            Version(
                c.V1BETA1,
                v1beta1.SandboxClaim,
                status=True,
                columns=(
                    _READY_STATUS,
                    {"jsonPath": ".status.sandbox.name", "name": "Sandbox", "type": "string"},
                    _READY_REASON,
                    _AGE,
                ),
            ),
            Version(c.V1ALPHA1, v1alpha1.SandboxClaim, status=True),
        ),
    ),
    KindSpec(
        kinds.SANDBOX_TEMPLATE,
        (
            Version(c.V1BETA1, v1beta1.SandboxTemplate, status=False),
            Version(c.V1ALPHA1, v1alpha1.SandboxTemplate, status=False),
        ),
    ),
    KindSpec(
        kinds.SANDBOX_WARM_POOL,
        (
            Version(c.V1BETA1, v1beta1.SandboxWarmPool, status=True, scale=True, columns=_POOL_COLUMNS),
            Version(c.V1ALPHA1, v1alpha1.SandboxWarmPool, status=True, scale=True, columns=_POOL_COLUMNS),
        ),
    ),
)


def deprecation_warning(info: ResourceKind, version: str) -> str:
    """The exact upstream ``deprecationWarning`` of a spoke version."""
    return f"{info.group}/{version} {info.kind} is deprecated; use {info.group}/{c.HUB_VERSION} {info.kind} instead"


def root_schema(model: type[KubeObject]) -> JSONSchema:
    """``openAPIV3Schema`` of one version: the model schema with a fixed object header."""
    schema = model_schema(model)
    props = schema["properties"]
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}
    schema["required"] = ["spec"]
    return schema


def _version(info: ResourceKind, ver: Version) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": ver.name,
        "schema": {"openAPIV3Schema": root_schema(ver.model)},
        "served": True,
        "storage": ver.name == c.HUB_VERSION,
    }
    if ver.name != c.HUB_VERSION:
        out["deprecated"] = True
        out["deprecationWarning"] = deprecation_warning(info, ver.name)
    if ver.columns:
        out["additionalPrinterColumns"] = [dict(col) for col in ver.columns]
    subresources: dict[str, Any] = {}
    if ver.scale:
        subresources["scale"] = dict(SCALE)
    if ver.status:
        subresources["status"] = {}
    if subresources:
        out["subresources"] = subresources
    return out


def conversion_stanza() -> dict[str, Any]:
    """``spec.conversion`` as shipped (no caBundle; the controller injects it at start-up)."""
    return {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {
                "service": {
                    "name": c.WEBHOOK_SERVICE_NAME,
                    "namespace": c.WEBHOOK_NAMESPACE,
                    "path": c.WEBHOOK_PATH,
                }
            },
            "conversionReviewVersions": list(c.CONVERSION_REVIEW_VERSIONS),
        },
    }


def build_crd(spec: KindSpec) -> dict[str, Any]:
    """The CustomResourceDefinition object for one kind."""
    info = spec.info
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": info.crd_name},
        "spec": {
            "conversion": conversion_stanza(),
            "group": info.group,
            "names": {
                "kind": info.kind,
                "listKind": info.list_kind,
                "plural": info.plural,
                "shortNames": list(info.short_names),
                "singular": info.singular,
            },
            "scope": "Namespaced",
            "versions": [_version(info, v) for v in spec.versions],
        },
    }
