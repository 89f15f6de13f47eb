"""Event handlers: map informer events to reconcile `Request`s and feed a work queue.

Owns the three mappings of controller-runtime's `pkg/handler` as plain functions of an object:
`request_for_object` (the object itself - `For`), `requests_for_owner(kind)` (its controlling owner of
that group+kind - `Owns`; versions are ignored because pre-upgrade owner references still say
v1alpha1, controllers spec §0.1) and arbitrary `MapFunc`s (`Watches`), plus `EnqueueHandler`, the
informer `EventHandler` that applies predicates and adds the mapped requests to a queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ._predicates import Predicate
from ._reconcile import Request
from ._resources import ResourceKind
from ._types import Object
from ._workqueue import WorkQueue

__all__ = ["EnqueueHandler", "MapFunc", "request_for_object", "requests_for_owner"]

MapFunc = Callable[[Object], Iterable[Request]]
"""Maps an object to the requests it should trigger (may be empty)."""


def request_for_object(obj: Object) -> list[Request]:
    """The object's own key."""
    meta = obj["metadata"]
    return [Request(meta.get("namespace") or "", meta["name"])]


def requests_for_owner(owner: ResourceKind, *, controller_only: bool = True) -> MapFunc:
    """Map an object to its owner(s) of `owner`'s group+kind (only the controlling one by default)."""
    group, kind = owner.group, owner.kind

    def mapper(obj: Object) -> list[Request]:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences")
        if not refs:
            return []
        out = []
        for ref in refs:
            if controller_only and not ref.get("controller"):
                continue
            api_version: str = ref.get("apiVersion", "")
            ref_group = api_version.rpartition("/")[0]
            if ref.get("kind") == kind and ref_group == group:
                out.append(Request((meta.get("namespace") or "") if owner.namespaced else "", ref["name"]))
        return out

    return mapper


class EnqueueHandler:
    """Informer event handler: predicates first, then map, then `queue.add` (duplicates collapse)."""

    __slots__ = ("_map", "_predicates", "_queue")

    def __init__(
        self, queue: WorkQueue[Request], map_fn: MapFunc, predicates: Sequence[Predicate] = ()
    ) -> None:
        self._queue = queue
        self._map = map_fn
        self._predicates = tuple(predicates)

    def on_add(self, obj: Object) -> None:
        for p in self._predicates:
            if not p.create(obj):
                return
        for req in self._map(obj):
            self._queue.add(req)

    def on_update(self, old: Object, new: Object) -> None:
        for p in self._predicates:
            if not p.update(old, new):
                return
        if self._map is request_for_object:
            # Identity mapping: old and new have the same key; skip the second map and the set.
            self._queue.add(Request(new["metadata"].get("namespace") or "", new["metadata"]["name"]))
            return
        # Both sides: an owner reference that moved must wake the old owner too.
        reqs = set(self._map(new))
        if old is not new:
            reqs.update(self._map(old))
        for req in reqs:
            self._queue.add(req)

    def on_delete(self, obj: Object) -> None:
        for p in self._predicates:
            if not p.delete(obj):
                return
        for req in self._map(obj):
            self._queue.add(req)
