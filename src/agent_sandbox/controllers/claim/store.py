"""Synchronous cache reads for the claim controller, and a read-your-writes overlay over them.

`Store` is what observation needs: get by name and list by index, synchronously, so warm-candidate
selection can judge and reserve in one uninterrupted step (see `queue`). `InformerStore` serves it from
the manager's informers (the reads never await; controllers start only after the caches synced).

`Freshest` is the runtime's read-your-writes overlay (`kube.OwnWrites`: the objects our own writes
returned, until the informer catches up). A claim pass triggered by, say, our status write may run before
the informer has seen our previous metadata patch or the takeover of its Sandbox; reading the newer of
(cache, our last write) keeps that pass from repeating a write or - worse - binding a second Sandbox.
On top, it records which Sandboxes this process bound to which claim, so a claim whose status write was
lost still finds its Sandbox before the cache shows it, and which claims this process deleted, so a pass
that runs before the informer delivers the deletion (our own status write's event, or a Sandbox event)
neither deletes the claim again nor repeats its Event (same `ttl`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from agent_sandbox.kube import Cache, Object, OwnWrites, ResourceKind

__all__ = ["Freshest", "InformerStore", "Store"]


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


class Freshest(OwnWrites):
    """Read-your-writes overlay (`kube.OwnWrites`) plus this process's claim -> Sandbox bindings."""

    def __init__(self, *, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(ttl=ttl, clock=clock)
        self._bound: dict[str, dict[str, float]] = {}  # claim uid -> {sandbox name: when}
        self._uncertain: dict[str, str] = {}  # claim uid -> sandbox name of an ambiguous takeover
        self._deleted: dict[str, float] = {}  # claim uid -> when this process deleted it

    def bind(self, claim_uid: str, sandbox_name: str) -> None:
        """This process gave `sandbox_name` to the claim (takeover or create succeeded)."""
        self._bound.setdefault(claim_uid, {})[sandbox_name] = self.now()

    def bound_to(self, claim_uid: str) -> list[str]:
        held = self._bound.get(claim_uid)
        if not held:
            return []
        now = self.now()
        for name in [n for n, at in held.items() if now - at > self.ttl]:
            del held[name]
        if not held:
            del self._bound[claim_uid]
        return list(held)

    def unbind_claim(self, claim_uid: str) -> None:
        self._bound.pop(claim_uid, None)
        self._uncertain.pop(claim_uid, None)
        self._deleted.pop(claim_uid, None)

    def mark_deleted(self, claim_uid: str) -> None:
        """This process deleted the claim (or found it gone): its delete event is on the way."""
        self._deleted[claim_uid] = self.now()

    def deleted(self, claim_uid: str) -> bool:
        """True while the claim is one this process deleted less than `ttl` ago."""
        at = self._deleted.get(claim_uid)
        if at is None:
            return False
        if self.now() - at > self.ttl:
            del self._deleted[claim_uid]
            return False
        return True

    def mark_uncertain(self, claim_uid: str, sandbox_name: str) -> None:
        """A takeover ended without an answer (timeout, connection loss): it may or may not have applied."""
        self._uncertain[claim_uid] = sandbox_name

    def take_uncertain(self, claim_uid: str) -> str | None:
        return self._uncertain.pop(claim_uid, None)

    def sweep(self, now: float) -> None:
        super().sweep(now)
        for uid in [u for u, held in self._bound.items() if all(now - at > self.ttl for at in held.values())]:
            del self._bound[uid]
        for uid in [u for u, at in self._deleted.items() if now - at > self.ttl]:
            del self._deleted[uid]
