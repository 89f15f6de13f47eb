"""Schema hints attached to model fields, read by the CRD generator.

The pydantic models are the single source of truth for the CRD schemas: field names
(aliases), Python types, defaults and required-ness come from the models, and anything
pydantic cannot express (OpenAPI ``format``, list types, the embedded Kubernetes type a
``dict[str, Any]`` stands for, CEL rules) is attached with ``Annotated[..., Schema(...)]``.
Pydantic ignores unknown ``Annotated`` metadata, so these hints cost nothing at parse time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any


@dataclass(frozen=True, slots=True)
class Schema:
    """OpenAPI details for one field that its Python type does not carry.

    Attributes:
        format: OpenAPI ``format`` (``int32``, ``int64``, ``date-time``).
        minimum: inclusive ``minimum``.
        maximum: inclusive ``maximum``.
        min_length: ``minLength`` of a string.
        max_length: ``maxLength`` of a string.
        pattern: ``pattern`` of a string.
        list_type: ``x-kubernetes-list-type`` of an array (``atomic``).
        k8s_ref: OpenAPI definition name of an embedded Kubernetes type; the field's
            Python type is ``dict[str, Any]`` and the generator inlines the definition.
        validations: ``x-kubernetes-validations`` as ``(rule, message)`` pairs.
    """

    format: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    list_type: str | None = None
    k8s_ref: str | None = None
    validations: tuple[tuple[str, str], ...] = ()


def find_schema(metadata: list[Any]) -> Schema:
    """Merge all :class:`Schema` hints found in a pydantic field's metadata list."""
    merged: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, Schema):
            for name in Schema.__slots__:
                value = getattr(item, name)
                if value not in (None, ()):
                    merged[name] = value
    return Schema(**merged)


# Embedded Kubernetes types (OpenAPI v3 definition names of k8s.io/api v1.35).
POD_SPEC_REF = "io.k8s.api.core.v1.PodSpec"
PVC_SPEC_REF = "io.k8s.api.core.v1.PersistentVolumeClaimSpec"
INGRESS_RULE_REF = "io.k8s.api.networking.v1.NetworkPolicyIngressRule"
EGRESS_RULE_REF = "io.k8s.api.networking.v1.NetworkPolicyEgressRule"

Int32 = Annotated[int, Schema(format="int32")]
Int64 = Annotated[int, Schema(format="int64")]
#: A core/v1 PodSpec kept as a plain dict (controllers read it on hot paths).
PodSpecDict = Annotated[dict[str, Any], Schema(k8s_ref=POD_SPEC_REF)]
#: A core/v1 PersistentVolumeClaimSpec kept as a plain dict.
PVCSpecDict = Annotated[dict[str, Any], Schema(k8s_ref=PVC_SPEC_REF)]
#: A networking/v1 NetworkPolicyIngressRule kept as a plain dict.
IngressRuleDict = Annotated[dict[str, Any], Schema(k8s_ref=INGRESS_RULE_REF)]
#: A networking/v1 NetworkPolicyEgressRule kept as a plain dict.
EgressRuleDict = Annotated[dict[str, Any], Schema(k8s_ref=EGRESS_RULE_REF)]
