"""Building blocks shared by every kind and both versions (api spec §2).

Models use snake_case attributes with explicit camelCase aliases; they accept either
spelling on input and always emit aliases. Unknown fields are kept (``extra="allow"``)
so a read-modify-write through these models never drops data written by a newer
server or client. Embedded Kubernetes types (PodSpec, PersistentVolumeClaimSpec,
NetworkPolicy rules) stay plain dicts: controllers only pass them through or patch a
few keys, and parsing a full PodSpec model on every reconcile would dominate CPU.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from agent_sandbox.api._schema import Int64, PodSpecDict, PVCSpecDict, Schema
from agent_sandbox.api.constants import ConditionStatus


class ApiModel(BaseModel):
    """Base of every API model: alias-aware, lossless for unknown fields."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with wire (camelCase) names; ``None`` fields are omitted."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Parse a wire dict (as decoded from JSON/YAML)."""
        return cls.model_validate(data)


# ---------------------------------------------------------------------------
# Kubernetes object metadata (not part of the CRD schemas: `metadata` is `type: object`)
# ---------------------------------------------------------------------------


class OwnerReference(ApiModel):
    """``metav1.OwnerReference``."""

    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = Field(default=None, alias="blockOwnerDeletion")


class ObjectMeta(ApiModel):
    """``metav1.ObjectMeta`` (the fields controllers use; the rest round-trips as extras)."""

    name: str | None = None
    generate_name: str | None = Field(default=None, alias="generateName")
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = Field(default=None, alias="resourceVersion")
    generation: int | None = None
    creation_timestamp: datetime | None = Field(default=None, alias="creationTimestamp")
    deletion_timestamp: datetime | None = Field(default=None, alias="deletionTimestamp")
    deletion_grace_period_seconds: int | None = Field(default=None, alias="deletionGracePeriodSeconds")
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[OwnerReference] | None = Field(default=None, alias="ownerReferences")
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = Field(default=None, alias="managedFields")


class ListMeta(ApiModel):
    """``metav1.ListMeta``."""

    resource_version: str | None = Field(default=None, alias="resourceVersion")
    continue_: str | None = Field(default=None, alias="continue")
    remaining_item_count: int | None = Field(default=None, alias="remainingItemCount")


class KubeObject(ApiModel):
    """Root of every top-level object: ``apiVersion``, ``kind``, ``metadata``.

    Subclasses set ``API_VERSION`` and ``KIND`` and default the two wire fields to them.
    """

    API_VERSION: ClassVar[str] = ""
    KIND: ClassVar[str] = ""

    api_version: str = Field(default="", alias="apiVersion")
    kind: str = ""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)

    def to_dict(self) -> dict[str, Any]:
        """Wire dict; an empty ``status`` is omitted (upstream's ``omitzero``)."""
        data = super().to_dict()
        if "status" in data and not data["status"]:
            del data["status"]
        return data

    def model_post_init(self, context: Any, /) -> None:
        """Fill ``apiVersion``/``kind`` from the class when not given."""
        if not self.api_version:
            self.api_version = self.API_VERSION
        if not self.kind:
            self.kind = self.KIND


# ---------------------------------------------------------------------------
# Pod template and PVC templates (api spec §2.1-§2.3)
# ---------------------------------------------------------------------------


class PodMetadata(ApiModel):
    """Labels and annotations for a Pod (also ``SandboxClaim.spec.additionalPodMetadata``)."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class EmbeddedObjectMetadata(ApiModel):
    """Metadata of a PVC template: only name, labels and annotations."""

    name: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class PodTemplate(ApiModel):
    """``spec.podTemplate``: Pod metadata plus a core/v1 PodSpec (kept as a dict)."""

    metadata: PodMetadata = Field(default_factory=PodMetadata)
    spec: PodSpecDict


class PersistentVolumeClaimTemplate(ApiModel):
    """One item of ``volumeClaimTemplates``; the PVC is named ``<metadata.name>-<sandbox>``."""

    metadata: EmbeddedObjectMetadata = Field(default_factory=EmbeddedObjectMetadata)
    spec: PVCSpecDict


#: ``volumeClaimTemplates`` arrays are atomic lists.
VolumeClaimTemplates = Annotated[list[PersistentVolumeClaimTemplate], Schema(list_type="atomic")]


class NameRef(ApiModel):
    """A same-namespace reference by name (``sandboxTemplateRef``, ``warmPoolRef``)."""

    name: str


# ---------------------------------------------------------------------------
# Conditions (api spec §2.5, the standard metav1.Condition)
# ---------------------------------------------------------------------------

_CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(ApiModel):
    """``metav1.Condition``."""

    type: Annotated[str, Schema(max_length=316, pattern=_CONDITION_TYPE_PATTERN)]
    status: ConditionStatus
    observed_generation: Annotated[Int64 | None, Schema(minimum=0)] = Field(
        default=None, alias="observedGeneration"
    )
    last_transition_time: datetime = Field(alias="lastTransitionTime")
    reason: Annotated[str, Schema(min_length=1, max_length=1024, pattern=_CONDITION_REASON_PATTERN)]
    message: Annotated[str, Schema(max_length=32768)]


def find_condition(conditions: list[Condition] | None, type_: str) -> Condition | None:
    """The condition of ``type_`` in ``conditions``, or None."""
    for cond in conditions or ():
        if cond.type == type_:
            return cond
    return None
