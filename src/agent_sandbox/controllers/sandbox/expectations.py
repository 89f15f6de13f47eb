"""Creation/deletion expectations for Sandbox children: read-your-writes over a lagging cache.

Owns the Sandbox controller's use of `kube.Expectations`: one record per (child kind, namespace, Sandbox
name). The executor raises a record before it creates Pods/PVCs/Services or deletes a Pod; informer
handlers registered on the child informers lower it when the ADDED event (or, for deletions, the
deletionTimestamp / DELETED event) of a child controlled by that Sandbox arrives. While any record of a
Sandbox is unsatisfied, `decide` waits instead of acting on a cache that does not yet show its own writes,
so a lagging cache can neither duplicate a child nor report a just-created Pod as missing.

Ordering duty: the handlers must be registered on the informers before the controller registers its
enqueue handler (done by `watches.setup`), so the record is lowered before the reconcile is queued.

Failure modes: a lost event (e.g. an object created and deleted inside one relist gap) is bounded by the
TTL, after which the cache is trusted again; the worst case is one create answered AlreadyExists, which the
controller handles (controllers spec §1.5.1).
"""

from __future__ import annotations

from collections.abc import Iterable

from agent_sandbox.api.kinds import SANDBOX
from agent_sandbox.api.meta import controller_name
from agent_sandbox.kube import Clock, Expectations, HandlerFuncs, Object, RealClock, ResourceKind

__all__ = ["DEFAULT_TTL", "ChildExpectations"]

DEFAULT_TTL = 60.0
"""How long unobserved writes are waited for. Shorter than client-go's 5 min: every child has a fixed name,
so trusting a stale cache too early costs at most one AlreadyExists, never a duplicate."""

_Key = tuple[str, str, str]


def _owner_sandbox(obj: Object) -> str | None:
    return controller_name(obj, SANDBOX)


class ChildExpectations:
    """Pending child creates (counts per kind) and Pod deletes (UIDs) per Sandbox."""

    def __init__(self, *, ttl: float = DEFAULT_TTL, clock: Clock | None = None) -> None:
        self.ttl = ttl
        self._exp = Expectations(ttl=ttl, clock=clock or RealClock())

    @staticmethod
    def _key(kind: ResourceKind, namespace: str, sandbox: str) -> _Key:
        return (kind.plural, namespace, sandbox)

    def expect_creations(self, kind: ResourceKind, namespace: str, sandbox: str, count: int) -> None:
        """Record `count` creates about to be issued (call before the first request)."""
        self._exp.try_expect_creations(self._key(kind, namespace, sandbox), count)

    def creations_abandoned(self, kind: ResourceKind, namespace: str, sandbox: str, count: int) -> None:
        """Creates that failed or were skipped will never be observed: stop waiting for them."""
        self._exp.lower_creations(self._key(kind, namespace, sandbox), count)

    def expect_deletion(self, kind: ResourceKind, namespace: str, sandbox: str, uid: str) -> None:
        """Record a delete about to be issued."""
        self._exp.expect_deletion(self._key(kind, namespace, sandbox), uid)

    def deletion_abandoned(self, kind: ResourceKind, namespace: str, sandbox: str, uid: str) -> None:
        """The delete failed: roll the record back."""
        self._exp.deletion_observed(self._key(kind, namespace, sandbox), uid)

    def pending(self, kinds: Iterable[ResourceKind], namespace: str, sandbox: str) -> bool:
        """Whether any create/delete of these kinds is still unobserved (expired records do not count)."""
        return not all(self._exp.satisfied(self._key(k, namespace, sandbox)) for k in kinds)

    def deleting(
        self, kind: ResourceKind, namespace: str, sandbox: str, uids: Iterable[str]
    ) -> frozenset[str]:
        """Those of `uids` whose delete is in flight."""
        key = self._key(kind, namespace, sandbox)
        return frozenset(u for u in uids if self._exp.is_pending_deletion(key, u))

    def forget(self, kinds: Iterable[ResourceKind], namespace: str, sandbox: str) -> None:
        """Drop every record of a Sandbox (it was deleted)."""
        for kind in kinds:
            self._exp.forget(self._key(kind, namespace, sandbox))

    def handler(self, kind: ResourceKind) -> HandlerFuncs:
        """Informer handler lowering the records of `kind` as the cache catches up."""

        def key(obj: Object) -> _Key | None:
            sandbox = _owner_sandbox(obj)
            if sandbox is None:
                return None
            return self._key(kind, (obj.get("metadata") or {}).get("namespace") or "", sandbox)

        def on_add(obj: Object) -> None:
            k = key(obj)
            if k is not None:
                self._exp.creation_observed(k)

        def on_update(old: Object, new: Object) -> None:
            meta = new.get("metadata") or {}
            if meta.get("deletionTimestamp") and not (old.get("metadata") or {}).get("deletionTimestamp"):
                k = key(new)
                if k is not None:
                    self._exp.deletion_observed(k, meta.get("uid", ""))

        def on_delete(obj: Object) -> None:
            k = key(obj)
            if k is not None:
                self._exp.deletion_observed(k, (obj.get("metadata") or {}).get("uid", ""))

        return HandlerFuncs(add=on_add, update=on_update, delete=on_delete)
