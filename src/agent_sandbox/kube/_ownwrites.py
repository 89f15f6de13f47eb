"""Read-your-own-writes over an informer cache: the answers of our writes until the cache shows them.

Why: a controller often writes an object and is re-triggered (by that write's own watch event, or by the
event of an earlier write) before the informer has delivered the write. A pass that reads the cache then
sees an object older than the one it just wrote, and would repeat the write or - for a claim - bind a
second Sandbox.

How: `remember` keeps the object a write returned; `view` answers with it while the cached copy is
strictly older, and drops it (answering with the cache) as soon as the cache shows the same or a newer
version, when the versions are not comparable, after `ttl` seconds (an informer event that never came),
or on `forget` (a delete event). Losing the overlay (a restart) only costs the redundant writes it avoids.
Expired answers are also swept from `remember` once per `ttl`: an answer that arrives after its object's
delete event (the write's response and the watch event travel on different connections) is never read
or forgotten again, and without the sweep such answers - whole objects - piled up until `max_entries`.

The one resourceVersion rule: versions of one resource type are compared as integers (KEP-5504,
Kubernetes 1.35, `api.meta.compare_resource_versions`); a version that is not comparable means "not
newer", so the overlay steps aside and the cache is trusted. docs/design/resource-version-order.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..api.kinds import ResourceKind
from ..api.meta import is_newer
from ._types import Object

__all__ = ["OwnWrites"]

_Key = tuple[str, str, str, str]


class OwnWrites:
    """Per-object latest answer of our own writes, superseding older cached versions (module docstring)."""

    def __init__(
        self, *, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic, max_entries: int = 4096
    ) -> None:
        """Args: ttl: seconds an answer may stand in for the cache; clock: monotonic; max_entries: sweep above
        (besides the sweep every `ttl` seconds)."""
        self._ttl = ttl
        self._clock = clock
        self._max = max_entries
        self._objects: dict[_Key, tuple[Object, float]] = {}
        self._swept_at = clock()

    def __len__(self) -> int:
        return len(self._objects)

    @staticmethod
    def _key(kind: ResourceKind, namespace: str, name: str) -> _Key:
        return (kind.group, kind.plural, namespace, name)

    @property
    def ttl(self) -> float:
        return self._ttl

    def now(self) -> float:
        """The clock entries are stamped with."""
        return self._clock()

    def remember(self, kind: ResourceKind, obj: Object) -> None:
        """Record the object a write of ours returned (an older answer never replaces a newer one)."""
        meta = obj["metadata"]
        key = self._key(kind, meta.get("namespace", ""), meta["name"])
        held = self._objects.get(key)
        if held is not None and is_newer(held[0], obj):
            return
        now = self._clock()
        self._objects[key] = (obj, now)
        if len(self._objects) > self._max or now - self._swept_at > self._ttl:
            self.sweep(now)

    def view(self, kind: ResourceKind, namespace: str, name: str, cached: Object | None) -> Object | None:
        """`cached`, or our newer written copy while the cache still shows an older version."""
        key = self._key(kind, namespace, name)
        held = self._objects.get(key)
        if held is None:
            return cached
        obj, at = held
        if cached is not None and not is_newer(obj, cached):
            del self._objects[key]  # the cache caught up (or someone wrote after us)
            return cached
        if self._clock() - at > self._ttl:
            del self._objects[key]
            return cached
        return obj

    def forget(self, kind: ResourceKind, namespace: str, name: str) -> None:
        """Drop what we remember of the object (it was deleted)."""
        self._objects.pop(self._key(kind, namespace, name), None)

    def sweep(self, now: float) -> None:
        """Drop every answer older than `ttl` (bounds memory when events never came)."""
        self._swept_at = now
        for key in [k for k, (_, at) in self._objects.items() if now - at > self._ttl]:
            del self._objects[key]
