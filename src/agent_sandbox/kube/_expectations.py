"""Expectations: an in-memory guard against acting twice on a stale cache (controllers spec §3.6).

A controller that creates or deletes children records what it expects to observe; informer handlers
lower the record as the corresponding add/delete events arrive; until the record is satisfied the
controller must not compute another create/delete batch from its (possibly stale) cache. Records expire
`ttl` seconds (default 5 min, client-go's ExpectationsTimeout) after they were last raised, after which the
cache is trusted again.

All operations are synchronous on the event-loop thread, which makes `try_expect_creations` atomic:
two overlapping passes can never both win. Ordering duty of callers: update expectations in the watch
handler *before* enqueueing; record a deletion *before* issuing the delete and roll it back
(`deletion_observed`) if the call fails.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from ._clock import REAL_CLOCK, Clock

__all__ = ["Expectations"]

DEFAULT_TTL = 300.0


@dataclass(slots=True)
class _Record:
    creations: int
    deletions: set[str] = field(default_factory=set)
    raised_at: float = 0.0


class Expectations:
    """Pending creations (a count) and deletions (a set of UIDs) per controller key."""

    def __init__(self, *, ttl: float = DEFAULT_TTL, clock: Clock = REAL_CLOCK) -> None:
        self._ttl = ttl
        self._clock = clock
        self._records: dict[Hashable, _Record] = {}

    def _expired(self, rec: _Record) -> bool:
        return self._clock.now() - rec.raised_at > self._ttl

    def satisfied(self, key: Hashable) -> bool:
        """True if nothing is pending for `key` or its record expired (the record is then dropped)."""
        rec = self._records.get(key)
        if rec is None:
            return True
        if (rec.creations <= 0 and not rec.deletions) or self._expired(rec):
            del self._records[key]
            return True
        return False

    def try_expect_creations(self, key: Hashable, count: int) -> bool:
        """Atomically claim the right to create `count` children: only when currently satisfied."""
        if count <= 0 or not self.satisfied(key):
            return False
        self._records[key] = _Record(count, set(), self._clock.now())
        return True

    def lower_creations(self, key: Hashable, count: int = 1, *, raised: object | None = None) -> None:
        """Record `count` observed (or abandoned) creations; floor at 0.

        `raised` (a `current_record` token): only if the record is still that one, not a later batch's.
        """
        rec = self._records.get(key)
        if rec is None or (raised is not None and rec is not raised):
            return
        rec.creations = max(0, rec.creations - count)
        self._drop_if_idle(key, rec)

    def current_record(self, key: Hashable) -> object | None:
        """An opaque token for `key`'s record, for a deferred `lower_creations(..., raised=token)`."""
        return self._records.get(key)

    def creation_observed(self, key: Hashable) -> None:
        """One created child was seen in the cache."""
        self.lower_creations(key, 1)

    def expect_deletion(self, key: Hashable, uid: str) -> None:
        """Record that the child `uid` is about to be deleted (call before the delete request)."""
        if not uid:
            return
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = _Record(0)
        rec.deletions.add(uid)
        rec.raised_at = self._clock.now()

    def deletion_observed(self, key: Hashable, uid: str) -> None:
        """The child `uid` disappeared from the cache (or its delete failed: roll back)."""
        rec = self._records.get(key)
        if rec is None:
            return
        rec.deletions.discard(uid)
        self._drop_if_idle(key, rec)

    def is_pending_deletion(self, key: Hashable, uid: str) -> bool:
        """Whether `uid` is a deletion in flight for `key` (False once the record expired)."""
        if not uid:
            return False
        rec = self._records.get(key)
        if rec is None or self._expired(rec):
            return False
        return uid in rec.deletions

    def pending(self, key: Hashable) -> tuple[int, frozenset[str]]:
        """(pending creations, pending deletion UIDs) for `key`; (0, {}) if none."""
        rec = self._records.get(key)
        return (rec.creations, frozenset(rec.deletions)) if rec else (0, frozenset())

    def forget(self, key: Hashable) -> None:
        """Drop the record of `key` (e.g. its owner was deleted)."""
        self._records.pop(key, None)

    def _drop_if_idle(self, key: Hashable, rec: _Record) -> None:
        if rec.creations <= 0 and not rec.deletions:
            self._records.pop(key, None)
