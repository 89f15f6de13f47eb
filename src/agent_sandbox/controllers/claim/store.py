"""Synchronous cache reads for the claim controller, and a read-your-writes overlay over them.

`Store` is what observation needs: get by name and list by index, synchronously, so warm-candidate
selection can judge and reserve in one uninterrupted step (see `queue`). `InformerStore` serves it from
the manager's informers (the reads never await; controllers start only after the caches synced).

`Freshest` remembers the objects our own writes returned, until the informer catches up. A claim pass
triggered by, say, our status write may run before the informer has seen our previous metadata patch or
the takeover of its Sandbox; reading the newer of (cache, our last write) keeps that pass from repeating
a write or - worse - binding a second Sandbox. It also records which Sandboxes this process bound to
which claim, so a claim whose status write was lost still finds its Sandbox before the cache shows it.
Entries are dropped when the cache shows the same or a newer resourceVersion, on delete events, and
after `ttl` seconds (a safety net for entries whose informer event never came).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from agent_sandbox.kube import Cache, Object, ResourceKind

__all__ = ["Freshest", "InformerStore", "Store", "newer"]


class Store(Protocol):
    """Synchronous, read-only view of the cache; returned objects are shared: never mutate them."""

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Object | None: ...

    def by_index(self, kind: ResourceKind, index: str, value: str, namespace: str) -> list[Object]: ...


class InformerStore:
    """`Store` over the manager's informers."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Object | None:
        return self._cache.informer(kind).get(f"{namespace}/{name}")

    def by_index(self, kind: ResourceKind, index: str, value: str, namespace: str) -> list[Object]:
        return self._cache.informer(kind).by_index(index, value, namespace)


def _rv(obj: Object) -> int | None:
    try:
        return int(obj["metadata"].get("resourceVersion") or "")
    except ValueError:
        return None


def newer(a: Object, b: Object) -> bool:
    """True if `a` carries a strictly newer resourceVersion than `b` (etcd revisions are integers; an
    unparsable version is never considered newer)."""
    ra, rb = _rv(a), _rv(b)
    return ra is not None and rb is not None and ra > rb


_Key = tuple[str, str, str, str]


class Freshest:
    """Read-your-writes overlay; see the module docstring."""

    def __init__(self, *, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._objects: dict[_Key, tuple[Object, float]] = {}
        self._bound: dict[str, dict[str, float]] = {}  # claim uid -> {sandbox name: when}
        self._uncertain: dict[str, str] = {}  # claim uid -> sandbox name of an ambiguous takeover

    def __len__(self) -> int:
        return len(self._objects)

    @staticmethod
    def _key(kind: ResourceKind, namespace: str, name: str) -> _Key:
        return (kind.group, kind.plural, namespace, name)

    def remember(self, kind: ResourceKind, obj: Object) -> None:
        """Record the object a write returned."""
        meta = obj["metadata"]
        now = self._clock()
        self._objects[self._key(kind, meta.get("namespace", ""), meta["name"])] = (obj, now)
        if len(self._objects) > 4096:
            self._sweep(now)

    def view(self, kind: ResourceKind, namespace: str, name: str, cached: Object | None) -> Object | None:
        """The newer of `cached` and our last write of that object."""
        key = self._key(kind, namespace, name)
        held = self._objects.get(key)
        if held is None:
            return cached
        obj, at = held
        if cached is not None and not newer(obj, cached):
            del self._objects[key]  # the informer caught up
            return cached
        if self._clock() - at > self._ttl:
            del self._objects[key]
            return cached
        return obj

    def forget(self, kind: ResourceKind, namespace: str, name: str) -> None:
        self._objects.pop(self._key(kind, namespace, name), None)

    def bind(self, claim_uid: str, sandbox_name: str) -> None:
        """This process gave `sandbox_name` to the claim (takeover or create succeeded)."""
        self._bound.setdefault(claim_uid, {})[sandbox_name] = self._clock()

    def bound_to(self, claim_uid: str) -> list[str]:
        held = self._bound.get(claim_uid)
        if not held:
            return []
        now = self._clock()
        for name in [n for n, at in held.items() if now - at > self._ttl]:
            del held[name]
        if not held:
            del self._bound[claim_uid]
        return list(held)

    def unbind_claim(self, claim_uid: str) -> None:
        self._bound.pop(claim_uid, None)
        self._uncertain.pop(claim_uid, None)

    def mark_uncertain(self, claim_uid: str, sandbox_name: str) -> None:
        """A takeover ended without an answer (timeout, connection loss): it may or may not have applied."""
        self._uncertain[claim_uid] = sandbox_name

    def take_uncertain(self, claim_uid: str) -> str | None:
        return self._uncertain.pop(claim_uid, None)

    def _sweep(self, now: float) -> None:
        for key in [k for k, (_, at) in self._objects.items() if now - at > self._ttl]:
            del self._objects[key]
        for uid in [
            u for u, held in self._bound.items() if all(now - at > self._ttl for at in held.values())
        ]:
            del self._bound[uid]
