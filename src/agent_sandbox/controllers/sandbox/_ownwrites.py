"""Read-your-own-writes for the Sandbox object itself: fresher-than-cache copies from write responses.

Why: one pass often writes the Sandbox twice (the pod-name annotation, then the status). The first write's
watch event re-queues the Sandbox while the second one's event is still in flight, so the next pass sees
a cache without our status and would recompute and re-send the same status patch. Under load that is
roughly one redundant write per Sandbox.

How: after a pass, the API's answer to its last Sandbox write is remembered together with the set of
resourceVersions known to be older than it (the version the pass started from and the answers to its
earlier writes). A later pass whose cached Sandbox has one of those versions uses the remembered answer
instead. Any other version means the cache caught up with us or someone else wrote since; the entry is
dropped and the cache is used. resourceVersions are only compared for equality, never ordered (they are
opaque). Losing the map (restart) only costs the redundant writes it avoids.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from agent_sandbox.kube import Object

__all__ = ["OwnWrites"]


def _rv(obj: Object) -> str:
    rv: str = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return rv


@dataclass(slots=True)
class _Entry:
    older: frozenset[str]
    latest: Object


class OwnWrites:
    """Per-key latest written copy of the primary object, superseding older cached versions."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}

    def fresh(self, key: Hashable, cached: Object) -> Object:
        """`cached`, or our newer written copy if the cache still shows a version older than it."""
        entry = self._entries.get(key)
        if entry is None:
            return cached
        if _rv(cached) in entry.older:
            return entry.latest
        del self._entries[key]
        return cached

    def record(self, key: Hashable, used: Object, answers: Sequence[Object]) -> None:
        """After a pass that started from `used` and wrote the object, getting `answers` (in order)."""
        if not answers:
            return
        latest = answers[-1]
        previous = self._entries.get(key)
        older = {_rv(used), *(_rv(a) for a in answers[:-1])}
        if previous is not None:
            older |= previous.older
        older.discard(_rv(latest))  # a no-op write answers with the unchanged version
        older.discard("")
        self._entries[key] = _Entry(frozenset(older), latest)

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
