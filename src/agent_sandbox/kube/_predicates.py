"""Event filters: pure `(old, new) -> bool` predicates deciding whether an event enqueues anything.

Owns `Predicate` (four booleans: create / update / delete / generic, controller-runtime
`pkg/predicate`), its function adapter `PredicateFuncs`, the combinators `and_`/`or_`/`not_`, and the
stock predicates `GENERATION_CHANGED`, `RESOURCE_VERSION_CHANGED`, `label_selector_predicate`,
`has_label`. Predicates are synchronous and must not do I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ._selectors import compile_selector
from ._types import LabelSelector, Object

__all__ = [
    "GENERATION_CHANGED",
    "RESOURCE_VERSION_CHANGED",
    "Predicate",
    "PredicateFuncs",
    "and_",
    "has_label",
    "label_selector_predicate",
    "not_",
    "object_predicate",
    "or_",
]


class Predicate(Protocol):
    """Filters informer events before they reach a controller's queue."""

    def create(self, obj: Object) -> bool: ...

    def update(self, old: Object, new: Object) -> bool: ...

    def delete(self, obj: Object) -> bool: ...

    def generic(self, obj: Object) -> bool: ...


@dataclass(frozen=True, slots=True)
class PredicateFuncs:
    """Function adapter; a None field means "let the event through"."""

    on_create: Callable[[Object], bool] | None = None
    on_update: Callable[[Object, Object], bool] | None = None
    on_delete: Callable[[Object], bool] | None = None
    on_generic: Callable[[Object], bool] | None = None

    def create(self, obj: Object) -> bool:
        return self.on_create is None or self.on_create(obj)

    def update(self, old: Object, new: Object) -> bool:
        return self.on_update is None or self.on_update(old, new)

    def delete(self, obj: Object) -> bool:
        return self.on_delete is None or self.on_delete(obj)

    def generic(self, obj: Object) -> bool:
        return self.on_generic is None or self.on_generic(obj)


def object_predicate(fn: Callable[[Object], bool]) -> PredicateFuncs:
    """A predicate applying `fn` to the object of every event (the new object for updates)."""
    return PredicateFuncs(fn, lambda _old, new: fn(new), fn, fn)


def and_(*preds: Predicate) -> PredicateFuncs:
    """All predicates must pass."""
    return PredicateFuncs(
        lambda o: all(p.create(o) for p in preds),
        lambda a, b: all(p.update(a, b) for p in preds),
        lambda o: all(p.delete(o) for p in preds),
        lambda o: all(p.generic(o) for p in preds),
    )


def or_(*preds: Predicate) -> PredicateFuncs:
    """Any predicate must pass."""
    return PredicateFuncs(
        lambda o: any(p.create(o) for p in preds),
        lambda a, b: any(p.update(a, b) for p in preds),
        lambda o: any(p.delete(o) for p in preds),
        lambda o: any(p.generic(o) for p in preds),
    )


def not_(pred: Predicate) -> PredicateFuncs:
    """Invert a predicate."""
    return PredicateFuncs(
        lambda o: not pred.create(o),
        lambda a, b: not pred.update(a, b),
        lambda o: not pred.delete(o),
        lambda o: not pred.generic(o),
    )


def _meta(obj: Object, field: str) -> object:
    return (obj.get("metadata") or {}).get(field)


GENERATION_CHANGED = PredicateFuncs(
    on_update=lambda old, new: _meta(old, "generation") != _meta(new, "generation")
)
"""Passes updates only when metadata.generation changed (spec changes, not status writes)."""

RESOURCE_VERSION_CHANGED = PredicateFuncs(
    on_update=lambda old, new: _meta(old, "resourceVersion") != _meta(new, "resourceVersion")
)
"""Drops resync updates (same resourceVersion)."""


def label_selector_predicate(selector: LabelSelector) -> PredicateFuncs:
    """Passes events whose object's labels match `selector`."""
    match = compile_selector(selector)
    return object_predicate(lambda o: match((o.get("metadata") or {}).get("labels") or {}))


def has_label(key: str) -> PredicateFuncs:
    """Passes events whose object has label `key` (any value), e.g. the sandbox tracking label."""
    return object_predicate(lambda o: key in ((o.get("metadata") or {}).get("labels") or {}))
