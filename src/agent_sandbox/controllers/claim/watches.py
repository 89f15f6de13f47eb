"""SandboxClaim controller wiring: watches, predicates, map functions, the warm-queue feeder (§4.1, §4.2).

| Source | Enqueues | Filter |
|---|---|---|
| SandboxClaim | itself | none; the timing predicate only records first-observed times |
| Sandbox (owned) | the controlling claim | create/delete; updates that change deletion, podIPs, Ready or Finished |
| Sandbox (all) | nothing: feeds the warm queue, wakes claims waiting for a networked member | - |
| SandboxWarmPool | unbound, non-deleting claims of the pool (index) | create, delete, generation change |
| SandboxWarmPool | nothing: a deleted pool drops its queue | delete |
| SandboxTemplate | non-deleting claims of every pool using it (two index lookups) | create only |
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import (
    claim_sandbox_name,
    drop_unapplied_managed_fields,
    is_ready,
    pool_key,
    sandbox_pool_name,
    status_condition,
)
from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Builder,
    Cache,
    Controller,
    KindOptions,
    Manager,
    NullEventRecorder,
    Object,
    PredicateFuncs,
    Request,
)

from ..claim_pressure import ClaimPressure
from ..context import ControllerContext
from ..indexes import (
    CLAIM_BY_POOL,
    INDEX_CLAIM_POOL,
    INDEX_POOL_TEMPLATE_REF,
    POOL_BY_TEMPLATE,
    SANDBOX_BY_CLAIM_UID,
    SANDBOX_BY_POOL,
    ensure_indexes,
)
from .adoption import is_adoptable
from .observability import ClaimMetrics, ObservedTimes
from .queue import WarmQueue
from .reconciler import REPORTER, ClaimConfig, ClaimReconciler
from .store import Freshest, InformerStore

__all__ = [
    "CONTROLLER_NAME",
    "POOL_EVENTS",
    "SANDBOX_STATUS_CHANGED",
    "TEMPLATE_CREATED",
    "ClaimLifecycleHandler",
    "PoolDeletionHandler",
    "WarmQueueFeeder",
    "claim_cache_transform",
    "map_pool_to_claims",
    "map_template_to_claims",
    "sandbox_status_changed",
    "setup",
    "timing_predicate",
]

CONTROLLER_NAME = "sandboxclaim"

# --------------------------------------------------------------------------- predicates


def timing_predicate(observed: ObservedTimes, now: Callable[[], Any]) -> PredicateFuncs:
    """Passes every claim event; records the first time each (name, UID) is seen, forgets on delete."""

    def seen(obj: Object) -> bool:
        meta = obj["metadata"]
        observed.record(meta.get("namespace", ""), meta["name"], meta.get("uid", ""), now())
        return True

    def gone(obj: Object) -> bool:
        meta = obj["metadata"]
        observed.drain(meta.get("namespace", ""), meta["name"], meta.get("uid", ""))
        return True

    return PredicateFuncs(on_create=seen, on_update=lambda _old, new: seen(new), on_delete=gone)


def _mirrored_ready(obj: Mapping[str, Any]) -> Any:
    cond = status_condition(obj, c.CONDITION_READY)
    if cond is None:
        return None
    return {k: v for k, v in cond.items() if k != "observedGeneration"}


def sandbox_status_changed(old: Object, new: Object) -> bool:
    """§4.1 owned-Sandbox update filter: deletion, podIPs, or the Ready / Finished condition changed.

    Ready is compared without its observedGeneration: the claim mirrors Ready with its *own* generation,
    so a Sandbox generation bump alone (every adoption causes one) cannot change the claim and would only
    cost a pass. Finished is mirrored verbatim, so it is compared whole.
    """
    if bool(old["metadata"].get("deletionTimestamp")) != bool(new["metadata"].get("deletionTimestamp")):
        return True
    if (old.get("status") or {}).get("podIPs") != (new.get("status") or {}).get("podIPs"):
        return True
    if _mirrored_ready(old) != _mirrored_ready(new):
        return True
    return bool(status_condition(old, c.CONDITION_FINISHED) != status_condition(new, c.CONDITION_FINISHED))


SANDBOX_STATUS_CHANGED = PredicateFuncs(on_update=sandbox_status_changed)
POOL_EVENTS = PredicateFuncs(
    on_update=lambda old, new: old["metadata"].get("generation") != new["metadata"].get("generation"),
    on_generic=lambda _obj: False,
)
"""Pool create/delete and spec changes wake claims; status-only updates (every refill) do not."""
TEMPLATE_CREATED = PredicateFuncs(
    on_update=lambda _old, _new: False, on_delete=lambda _obj: False, on_generic=lambda _obj: False
)
"""Only a newly created template can unblock a claim (TemplateNotFound); edits never do."""


# --------------------------------------------------------------------------- map functions


def map_pool_to_claims(cache: Cache) -> Callable[[Object], list[Request]]:
    """Pool -> its claims that are not bound yet and not being deleted."""
    claims = cache.informer(SANDBOX_CLAIM)

    def mapper(pool: Object) -> list[Request]:
        ns = pool["metadata"].get("namespace", "")
        return [
            Request(ns, cl["metadata"]["name"])
            for cl in claims.by_index(INDEX_CLAIM_POOL, pool["metadata"]["name"], ns)
            if not cl["metadata"].get("deletionTimestamp") and not claim_sandbox_name(cl)
        ]

    return mapper


def map_template_to_claims(cache: Cache) -> Callable[[Object], list[Request]]:
    """Template -> non-deleting claims (bound or not) of every pool in its namespace that uses it."""
    pools = cache.informer(SANDBOX_WARM_POOL)
    claims = cache.informer(SANDBOX_CLAIM)

    def mapper(template: Object) -> list[Request]:
        ns = template["metadata"].get("namespace", "")
        out: dict[str, Request] = {}
        for pool in pools.by_index(INDEX_POOL_TEMPLATE_REF, template["metadata"]["name"], ns):
            for cl in claims.by_index(INDEX_CLAIM_POOL, pool["metadata"]["name"], ns):
                if not cl["metadata"].get("deletionTimestamp"):
                    out[cl["metadata"]["name"]] = Request(ns, cl["metadata"]["name"])
        return list(out.values())

    return mapper


# --------------------------------------------------------------------------- warm queue feeding (§4.2)


def _node(obj: Object) -> str:
    return str((obj.get("status") or {}).get("nodeName") or "")


def _networked(obj: Object | None) -> bool:
    return obj is not None and bool((obj.get("status") or {}).get("podIPs"))


class WarmQueueFeeder:
    """Sandbox informer handler keeping the warm queue current (never enqueues claims itself, except
    waking the ones waiting for a pool member to get its Pod IP)."""

    def __init__(self, queue: WarmQueue, fresh: Freshest, wake: Callable[[Hashable], None]) -> None:
        self._queue = queue
        self._fresh = fresh
        self._wake = wake

    def on_add(self, obj: Object) -> None:
        self.on_update(None, obj)

    def on_update(self, old: Object | None, new: Object) -> None:
        if not is_adoptable(new):
            return  # a key that stopped being adoptable is discarded lazily when judged
        pool = sandbox_pool_name(new)
        if pool is None:
            return
        meta = new["metadata"]
        key = pool_key(meta.get("namespace", ""), pool)
        if old is None or not is_adoptable(old) or sandbox_pool_name(old) != pool or _node(old) != _node(new):
            self._queue.add(key, meta["name"], _node(new))
        if _networked(new) and (not _networked(old) or (is_ready(new) and not is_ready(old or {}))):
            for waiter in self._queue.pop_waiters(key):
                self._wake(waiter)

    def on_delete(self, obj: Object) -> None:
        meta = obj["metadata"]
        self._fresh.forget(SANDBOX, meta.get("namespace", ""), meta["name"])
        pool = sandbox_pool_name(obj)
        if pool is not None:
            self._queue.remove(pool_key(meta.get("namespace", ""), pool), meta["name"])


class PoolDeletionHandler:
    """A deleted SandboxWarmPool takes its whole in-memory queue with it."""

    def __init__(self, queue: WarmQueue) -> None:
        self._queue = queue

    def on_add(self, obj: Object) -> None:
        return None

    def on_update(self, old: Object, new: Object) -> None:
        return None

    def on_delete(self, obj: Object) -> None:
        meta = obj["metadata"]
        self._queue.remove_queue(pool_key(meta.get("namespace", ""), meta["name"]))


class ClaimLifecycleHandler:
    """Note new claims as claim pressure; forget read-your-writes state of a deleted claim."""

    def __init__(self, fresh: Freshest, pressure: ClaimPressure) -> None:
        self._fresh = fresh
        self._pressure = pressure

    def on_add(self, obj: Object) -> None:
        # A claim that still needs a Sandbox: bookkeeping writes elsewhere wait behind it (claim_pressure).
        if not obj["metadata"].get("deletionTimestamp") and not is_ready(obj):
            self._pressure.note_arrival()

    def on_update(self, old: Object, new: Object) -> None:
        return None

    def on_delete(self, obj: Object) -> None:
        meta = obj["metadata"]
        self._fresh.forget(SANDBOX_CLAIM, meta.get("namespace", ""), meta["name"])
        self._fresh.unbind_claim(meta.get("uid", ""))


def claim_cache_transform(obj: Object) -> Object:
    """The claim cache drops `managedFields` (§5.5) unless someone server-side applied the claim.

    The claim intent patch drops a claim's entries only when none is an Apply (`decide_claim_intent`), so
    the cache keeps exactly the entries that decision reads; applied claims are rare, so it costs little.
    """
    return drop_unapplied_managed_fields(obj)


# --------------------------------------------------------------------------- setup (§5.3 step 8)


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """Build the claim controller and add it to `mgr` (a `main.SETUPS` entry, `--extensions`)."""
    opts = ctx.options
    cache = mgr.cache
    cache.set_kind_options(SANDBOX_CLAIM, KindOptions(transform=claim_cache_transform))
    ensure_indexes(cache, SANDBOX_BY_POOL, POOL_BY_TEMPLATE, CLAIM_BY_POOL, SANDBOX_BY_CLAIM_UID)
    cache.informer(NETWORK_POLICY)  # legacy per-claim policy cleanup reads it (§4.3 step 2)
    queue = WarmQueue()
    fresh = Freshest()
    observed = ObservedTimes()
    reconciler = ClaimReconciler(
        store=InformerStore(cache),
        api=mgr.client,
        authoritative=mgr.api,
        queue=queue,
        observed=observed,
        fresh=fresh,
        events=NullEventRecorder() if opts.disable_claim_events else mgr.event_recorder(REPORTER),
        metrics=ClaimMetrics(),
        config=ClaimConfig(
            allowed_label_domains=ctx.allowed_label_domains,
            persist_observability=not opts.disable_claim_observability_annotations,
        ),
        tracing=ctx.tracing,
        pressure=ctx.claim_pressure,
    )
    ctrl: Controller = (
        Builder(mgr)
        .for_(SANDBOX_CLAIM, timing_predicate(observed, lambda: datetime.now(UTC)))
        .owns(SANDBOX, SANDBOX_STATUS_CHANGED)
        .watches(SANDBOX_WARM_POOL, map_pool_to_claims(cache), POOL_EVENTS)
        .watches(SANDBOX_TEMPLATE, map_template_to_claims(cache), TEMPLATE_CREATED)
        .named(CONTROLLER_NAME)
        .with_options(workers=opts.sandbox_claim_concurrent_workers)
        .complete(reconciler)
    )

    reconciler.detach_metadata_writes(ctrl.queue.add_rate_limited)
    ctx.claim_pressure.report_held(reconciler)

    def wake(waiter: Hashable) -> None:
        if isinstance(waiter, Request):
            ctrl.queue.add(waiter)

    cache.informer(SANDBOX).add_handler(WarmQueueFeeder(queue, fresh, wake))
    cache.informer(SANDBOX_WARM_POOL).add_handler(PoolDeletionHandler(queue))
    cache.informer(SANDBOX_CLAIM).add_handler(ClaimLifecycleHandler(fresh, ctx.claim_pressure))
