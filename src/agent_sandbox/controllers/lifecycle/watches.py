"""Wiring of the lifecycle controller (ours, docs/lifecycle.md): enabled with `--sandbox-lifecycle`.

Keyed by namespace/name, because a Sandbox and its SandboxArchive share the name: Sandbox events and
SandboxArchive events enqueue their own key; a SandboxTemplate whose lifecycle annotations change enqueues
every Sandbox built from it (index on `agents.x-k8s.io/sandbox-template-ref`, with `--extensions` only:
without it no template or claim is read); a SandboxClaim marked `hibernated-sandbox` enqueues that name, so
its expiry (or a changed `shutdownTime`) reaches the archive when it happens, not at the next requeue. Sandbox events also feed the resume counters and timers, and
the archive informer the hibernated gauge. Workers: `--sandbox-lifecycle-concurrent-workers`.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    Builder,
    HandlerFuncs,
    Manager,
    Object,
    PredicateFuncs,
    Request,
    object_predicate,
    request_for_object,
)

from ..context import ControllerContext
from ..indexes import INDEX_SANDBOX_TEMPLATE_REF, SANDBOX_BY_TEMPLATE, ensure_indexes
from .metrics import HibernatedCollector, LifecycleMetrics
from .probe import ActivityProbe
from .reconciler import LifecycleReconciler

__all__ = ["CONTROLLER_NAME", "EVENT_REPORTER", "setup"]

CONTROLLER_NAME = "sandboxlifecycle"
EVENT_REPORTER = "sandboxlifecycle-controller"


def _lifecycle_annotations(obj: Object) -> dict[str, str]:
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    return {k: v for k, v in ann.items() if k.startswith(f"{lc.LIFECYCLE_GROUP}/")}


TEMPLATE_SETTINGS_CHANGED = PredicateFuncs(
    on_update=lambda old, new: _lifecycle_annotations(old) != _lifecycle_annotations(new),
    on_delete=lambda _obj: False,
    on_generic=lambda _obj: False,
)


def _hibernated_name(claim: Object) -> str:
    return str(
        ((claim.get("metadata") or {}).get("annotations") or {}).get(lc.ANNOTATION_HIBERNATED_SANDBOX) or ""
    )


def hibernated_of_claim(claim: Object) -> list[Request]:
    """The archive a marked claim keeps (its expiry deletes it: docs/lifecycle.md "Deep hibernation")."""
    name = _hibernated_name(claim)
    return [Request(claim["metadata"]["namespace"], name)] if name else []


CLAIM_MARKED = object_predicate(lambda claim: bool(_hibernated_name(claim)))


class _CloseProbe:
    """Closes the probe's HTTP session when the manager stops (runs on every replica)."""

    need_leader_election = False

    def __init__(self, probe: ActivityProbe) -> None:
        self._probe = probe

    async def start(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await self._probe.close()


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """Register the lifecycle controller with `mgr` (a `main.SETUPS` entry)."""
    opts = ctx.options
    cache = mgr.cache
    ensure_indexes(cache, SANDBOX_BY_TEMPLATE)
    metrics = LifecycleMetrics(mgr.options.registry)
    probe = (
        ActivityProbe(opts.sandbox_lifecycle_runtime_port) if opts.sandbox_lifecycle_runtime_port else None
    )
    reconciler = LifecycleReconciler(
        mgr.client,
        probe=probe,
        events=mgr.event_recorder(EVENT_REPORTER),
        metrics=metrics,
        extensions=opts.extensions,
        authoritative=mgr.api,
    )
    builder = (
        Builder(mgr)
        .for_(SANDBOX)
        .watches(lc.ARCHIVE, request_for_object)
        .named(CONTROLLER_NAME)
        .with_options(workers=opts.sandbox_lifecycle_concurrent_workers)
    )
    if opts.extensions:
        sandboxes = cache.informer(SANDBOX)

        def built_from(template: Object) -> list[Request]:
            meta = template["metadata"]
            return [
                Request(meta["namespace"], sb["metadata"]["name"])
                for sb in sandboxes.by_index(INDEX_SANDBOX_TEMPLATE_REF, meta["name"], meta["namespace"])
            ]

        builder = builder.watches(SANDBOX_TEMPLATE, built_from, TEMPLATE_SETTINGS_CHANGED).watches(
            SANDBOX_CLAIM, hibernated_of_claim, CLAIM_MARKED
        )
    builder.complete(reconciler)

    def now() -> datetime:
        return datetime.now(UTC)

    cache.informer(SANDBOX).add_handler(
        HandlerFuncs(update=lambda old, new: metrics.on_update(old, new, now()), delete=metrics.on_delete)
    )
    mgr.options.registry.register(HibernatedCollector(cache.informer(lc.ARCHIVE)))
    if probe is not None:
        mgr.add(_CloseProbe(probe))
