"""Wire-level value types shared by the client, informers and fakes.

Objects travel as the JSON exactly as decoded ("raw"): `Object` is a plain `dict[str, Any]`. Controllers
that want typed models build them from these dicts; the runtime never does, to keep per-event cost low.
Objects handed out by caches are shared and must be treated as read-only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeAlias

__all__ = [
    "LabelSelector",
    "ListPage",
    "Object",
    "PatchType",
    "PropagationPolicy",
    "WatchEvent",
    "WatchEventType",
    "object_key",
]

Object: TypeAlias = dict[str, Any]
"""A Kubernetes object as decoded JSON (apiVersion, kind, metadata, spec, status...)."""

LabelSelector: TypeAlias = str | Mapping[str, str]
"""A label selector in string form ("a=b,c in (d),!e") or an equality map."""

WatchEventType: TypeAlias = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
PropagationPolicy: TypeAlias = Literal["Foreground", "Background", "Orphan"]


class PatchType(enum.StrEnum):
    """Patch flavours, valued by their Content-Type."""

    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON = "application/json-patch+json"
    APPLY = "application/apply-patch+yaml"


class WatchEvent(NamedTuple):
    """One decoded watch event. ERROR events are raised as `ApiError`, never yielded."""

    type: WatchEventType
    object: Object


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a list call.

    Attributes:
        items: the objects, each with `apiVersion` and `kind` filled in.
        resource_version: the list's resourceVersion (start a watch from it).
        continue_token: non-empty when more pages follow.
    """

    items: list[Object]
    resource_version: str
    continue_token: str = ""


def object_key(obj: Mapping[str, Any]) -> str:
    """The cache key of an object: "namespace/name", or "name" for cluster-scoped objects."""
    meta = obj["metadata"]
    ns = meta.get("namespace")
    name: str = meta["name"]
    return f"{ns}/{name}" if ns else name
