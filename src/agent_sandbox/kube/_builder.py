"""Declarative controller wiring (controller-runtime `builder`):

    Builder(mgr).for_(SANDBOX).owns(POD, has_label(TRACKING)).owns(SERVICE)
        .watches(SANDBOX_TEMPLATE, map_fn).with_predicates(...).named("sandbox")
        .with_options(workers=100).complete(reconciler)

`for_` watches the primary kind and enqueues the object itself; `owns` watches children and enqueues
their controlling owner of the primary kind (group + kind, version ignored); `watches` maps any kind
with a function. `with_predicates` filters every watch (`WithEventFilter`). The name defaults to the
lower-cased primary kind and labels the controller's metrics. `complete` creates the informers through
the manager's cache, builds the `Controller` and adds it to the manager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Self

from ._cache import Cache
from ._controller import Controller
from ._handlers import MapFunc, request_for_object, requests_for_owner
from ._predicates import Predicate
from ._ratelimit import RateLimiter
from ._reconcile import Reconciler
from ._resources import ResourceKind

__all__ = ["Builder"]


class _ManagerLike(Protocol):
    cache: Cache

    def add(self, runnable: Controller) -> None: ...


@dataclass(frozen=True, slots=True)
class _Spec:
    kind: ResourceKind
    map_fn: MapFunc | None  # None: owner mapping, resolved once the primary kind is known
    predicates: tuple[Predicate, ...]


class Builder:
    """Fluent controller builder; see module docstring."""

    def __init__(self, mgr: _ManagerLike) -> None:
        self._mgr = mgr
        self._for: _Spec | None = None
        self._specs: list[_Spec] = []
        self._global: list[Predicate] = []
        self._name: str | None = None
        self._workers = 1
        self._rate_limiter: RateLimiter | None = None
        self._drain_timeout = 30.0

    def for_(self, kind: ResourceKind, *predicates: Predicate) -> Self:
        """The primary kind: its events enqueue the object itself."""
        if self._for is not None:
            raise ValueError("for_() may only be called once")
        self._for = _Spec(kind, request_for_object, predicates)
        return self

    def owns(self, kind: ResourceKind, *predicates: Predicate) -> Self:
        """A child kind: its events enqueue the controlling owner of the primary kind."""
        self._specs.append(_Spec(kind, None, predicates))
        return self

    def watches(self, kind: ResourceKind, map_fn: MapFunc, *predicates: Predicate) -> Self:
        """Any kind, mapped to requests by `map_fn`."""
        self._specs.append(_Spec(kind, map_fn, predicates))
        return self

    def with_predicates(self, *predicates: Predicate) -> Self:
        """Filters applied to every watch of this controller."""
        self._global.extend(predicates)
        return self

    def named(self, name: str) -> Self:
        """Controller name (metrics label, logs); default: lower-cased primary kind."""
        self._name = name
        return self

    def with_options(
        self,
        *,
        workers: int | None = None,
        rate_limiter: RateLimiter | None = None,
        drain_timeout: float | None = None,
    ) -> Self:
        """Concurrency (`--*-concurrent-workers`), backoff policy and shutdown drain bound."""
        if workers is not None:
            self._workers = workers
        if rate_limiter is not None:
            self._rate_limiter = rate_limiter
        if drain_timeout is not None:
            self._drain_timeout = drain_timeout
        return self

    def complete(self, reconciler: Reconciler) -> Controller:
        """Build the controller, register its watches and add it to the manager."""
        if self._for is None:
            raise ValueError("for_() is required")
        primary = self._for.kind
        ctrl = Controller(
            self._name or primary.kind.lower(),
            reconciler,
            workers=self._workers,
            rate_limiter=self._rate_limiter,
            drain_timeout=self._drain_timeout,
        )
        cache = self._mgr.cache
        for spec in (self._for, *self._specs):
            map_fn = spec.map_fn or requests_for_owner(primary)
            ctrl.watch(cache.informer(spec.kind), map_fn, *self._global, *spec.predicates)
        self._mgr.add(ctrl)
        return ctrl
