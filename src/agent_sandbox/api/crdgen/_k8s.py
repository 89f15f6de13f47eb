"""Turn the snapshotted Kubernetes OpenAPI v3 definitions into structural CRD schemas.

Input: ``agent_sandbox/api/k8s_openapi.json`` (written by ``hack/snapshot-openapi.py`` from
the API server of our pinned release). Output: the schema controller-gen would emit for the
same Go type, i.e. what upstream's CRDs embed:

* ``$ref``/``allOf`` are inlined (CRD schemas cannot reference definitions);
* apimachinery "known types" get controller-gen's fixed shapes: ``Quantity`` and
  ``IntOrString`` become ``anyOf: [integer, string]`` + ``x-kubernetes-int-or-string``,
  ``Time`` a ``date-time`` string, an embedded ``ObjectMeta`` a bare ``type: object``;
* only *declared* defaults survive. The apiserver's OpenAPI also carries zero-value defaults
  that openapi-gen adds for required/non-omitempty members (``containerPort: 0``,
  ``items: {default: {}}``, ...). controller-gen emits only literal ``+default=`` markers,
  and a ``{}`` default on an item with required fields would even make the CRD invalid.
  A default is kept when its property is optional, sits directly under ``properties`` and
  is not the empty object; ``+default=ref(...)`` markers, which controller-gen cannot
  evaluate, are dropped explicitly (:data:`UNRENDERED_DEFAULTS`);
* strategic-merge hints, unions and descriptions are dropped (CRDs have no such fields), and
  so are ``enum`` lists from Go ``+enum`` markers, which controller-gen does not render.

Raises ``KeyError`` on an unknown schema keyword so that a new snapshot with new
constructs fails loudly instead of producing a silently wrong CRD.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

Schema = dict[str, Any]

SNAPSHOT_RESOURCE = "k8s_openapi.json"
_REF_PREFIX = "#/components/schemas/"

QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"
MICRO_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

#: controller-gen's pattern for resource.Quantity.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)"
    r"|(\.[0-9]+))))?$"
)

_KNOWN: dict[str, Schema] = {
    QUANTITY: {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": True,
    },
    INT_OR_STRING: {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True},
    TIME: {"format": "date-time", "type": "string"},
    MICRO_TIME: {"format": "date-time", "type": "string"},
    OBJECT_META: {"type": "object"},
}

#: (definition, property) pairs whose default is a Go ``+default=ref(Const)`` marker.
#: openapi-gen resolves them; controller-gen cannot and omits them, so upstream CRDs lack them.
UNRENDERED_DEFAULTS = frozenset(
    {
        ("io.k8s.api.core.v1.AzureDiskVolumeSource", "cachingMode"),
        ("io.k8s.api.core.v1.AzureDiskVolumeSource", "kind"),
    }
)

# Keywords copied verbatim to the CRD schema.
_COPY = (
    "type",
    "format",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
# Keywords handled structurally or deliberately dropped.
_HANDLED = frozenset({"$ref", "allOf", "properties", "items", "additionalProperties", "required", "default"})
# ``enum`` comes from Go ``+enum`` markers, which controller-gen does not render: upstream
# CRDs accept any string there and leave enum checks to Pod validation (and values a newer
# Kubernetes adds keep working), so we drop it too.
_DROPPED = frozenset(
    {
        "description",
        "enum",
        "x-kubernetes-unions",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
    }
)


@functools.cache
def load_snapshot() -> dict[str, Any]:
    """The checked-in OpenAPI snapshot (``kubernetesVersion``, ``roots``, ``schemas``)."""
    text = resources.files("agent_sandbox.api").joinpath(SNAPSHOT_RESOURCE).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def kubernetes_version() -> str:
    """Kubernetes release the embedded schemas come from (e.g. ``v1.35.4``)."""
    return str(load_snapshot()["kubernetesVersion"])


def k8s_schema(definition: str) -> Schema:
    """Structural CRD schema for an OpenAPI definition name (a fresh, mutable dict)."""
    return _Converter(load_snapshot()["schemas"]).definition(definition)


class _Converter:
    def __init__(self, schemas: dict[str, Any]) -> None:
        self._schemas = schemas
        self._stack: list[str] = []

    def definition(self, name: str) -> Schema:
        if name in _KNOWN:
            return json.loads(json.dumps(_KNOWN[name]))  # type: ignore[no-any-return]
        if name in self._stack:
            raise ValueError(f"recursive definition {' -> '.join([*self._stack, name])}")
        self._stack.append(name)
        try:
            return self.node(self._schemas[name], owner=name)
        finally:
            self._stack.pop()

    def node(self, raw: Schema, *, owner: str) -> Schema:
        if "$ref" in raw:
            return self.definition(raw["$ref"].removeprefix(_REF_PREFIX))
        if "allOf" in raw:
            if len(raw["allOf"]) != 1:
                raise KeyError(f"{owner}: allOf with {len(raw['allOf'])} members")
            base = self.node(raw["allOf"][0], owner=owner)
            return base | {k: v for k, v in self._plain(raw, owner).items() if k not in base}
        out = self._plain(raw, owner)
        if "properties" in raw:
            required = set(raw.get("required", ()))
            props: Schema = {}
            for prop, sub in raw["properties"].items():
                child = self.node(sub, owner=owner)
                child.pop("default", None)
                if "default" in sub and self._keep_default(owner, prop, sub["default"], required):
                    child["default"] = sub["default"]
                props[prop] = child
            out["properties"] = props
            if raw.get("required"):
                out["required"] = sorted(raw["required"])
        if "items" in raw:
            item = self.node(raw["items"], owner=owner)
            item.pop("default", None)  # openapi-gen's zero value for struct items, never declared
            out["items"] = item
        if isinstance(raw.get("additionalProperties"), dict):
            value = self.node(raw["additionalProperties"], owner=owner)
            value.pop("default", None)
            out["additionalProperties"] = value
        return out

    @staticmethod
    def _plain(raw: Schema, owner: str) -> Schema:
        out: Schema = {}
        for key, value in raw.items():
            if key in _COPY:
                out[key] = value
            elif key not in _HANDLED and key not in _DROPPED:
                raise KeyError(f"{owner}: unsupported OpenAPI keyword {key!r}")
        return out

    @staticmethod
    def _keep_default(owner: str, prop: str, value: Any, required: set[str]) -> bool:
        if prop in required or value == {}:
            return False
        return (owner, prop) not in UNRENDERED_DEFAULTS
