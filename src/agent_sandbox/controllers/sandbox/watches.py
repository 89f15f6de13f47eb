"""Wiring of the Sandbox controller into a manager (controllers spec §1.1, §5.3 step 7-8, §5.5).

Owns: the Pod cache transform (the "Pod diet" of §1.1), the Pod/Service cache scoping of
`--cache-label-selectors`, the tracking-label index on Pods, the expectation handlers on the child
informers, the watches (Sandbox itself; Pods and Services with the tracking label, mapped to their
controlling Sandbox; PVCs are cached but not watched), the `agent_sandboxes` collector, and
`setup_sandbox_controller`, the one call the controller process makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_sandbox.api.constants import LABEL_SANDBOX_NAME_HASH
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SERVICE,
    Builder,
    Controller,
    KindOptions,
    Manager,
    Object,
    Tracing,
    has_label,
)

from ..claim_pressure import ClaimPressure
from ..indexes import POD_BY_SANDBOX_HASH, ensure_indexes
from .expectations import ChildExpectations
from .metrics import register_collector
from .reconciler import SandboxReconciler

if TYPE_CHECKING:
    from ..main import ControllerContext

__all__ = [
    "CONTROLLER_NAME",
    "EVENT_REPORTER",
    "pod_cache_transform",
    "setup_sandbox_controller",
]

CONTROLLER_NAME = "sandbox"
"""Controller name: metrics label, queue name (§0.5)."""
EVENT_REPORTER = "sandbox-controller"
"""`reportingController` of the Sandbox controller's Events (§5.10)."""


def pod_cache_transform(obj: Object) -> Object:
    """§1.1 Pod diet: drop managedFields and finalizers, keep only `spec.nodeName`; other inputs pass through.

    Metadata (labels, annotations, owner references) and the full status stay. Every Pod write of this
    controller is a metadata merge patch computed against this same stripped object, so the stripped
    fields can neither leak into nor be erased by a patch.
    """
    if not isinstance(obj, dict) or obj.get("kind", "Pod") != "Pod":
        return obj
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        meta.pop("finalizers", None)
    spec = obj.get("spec")
    if isinstance(spec, dict):
        obj["spec"] = {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {}
    return obj


def setup_sandbox_controller(
    mgr: Manager,
    *,
    workers: int = 100,
    cluster_domain: str = "cluster.local",
    write_behind_window: float = 0.0,
    cache_label_selectors: bool = False,
    tracing: Tracing | None = None,
    pressure: ClaimPressure | None = None,
) -> Controller:
    """Register the Sandbox controller (and the `agent_sandboxes` collector) with `mgr`.

    Must run before anything else creates the Pod or Service informer (the cache options are per kind).

    Args:
        mgr: the manager (not started).
        workers: `--sandbox-concurrent-workers`.
        cluster_domain: `--cluster-domain`.
        write_behind_window: `--sandbox-write-behind-window` in seconds.
        cache_label_selectors: `--cache-label-selectors` (cache only Pods/Services with the tracking label).
        tracing: span factory (`--enable-tracing`).
        pressure: claim arrivals (`--sandbox-claim-priority-hold`); deferred writes are re-enqueued when
            it calms down. None: nothing is ever deferred for claims.

    Returns:
        The controller (already added to the manager).

    Raises:
        RuntimeError: the Pod or Service informer already exists.
    """
    cache = mgr.cache
    scope = LABEL_SANDBOX_NAME_HASH if cache_label_selectors else None
    cache.set_kind_options(POD, KindOptions(label_selector=scope, transform=pod_cache_transform))
    if scope is not None:
        cache.set_kind_options(SERVICE, KindOptions(label_selector=scope))
    ensure_indexes(cache, POD_BY_SANDBOX_HASH)
    expectations = ChildExpectations()
    # Registered before the controller's own enqueue handlers, so a record is lowered before the
    # reconcile its event triggers runs (see `expectations`).
    for kind in (POD, PVC, SERVICE):
        cache.informer(kind).add_handler(expectations.handler(kind))
    reconciler = SandboxReconciler(
        mgr.client,
        mgr.api,
        cluster_domain=cluster_domain,
        write_behind_window=write_behind_window,
        expectations=expectations,
        events=mgr.event_recorder(EVENT_REPORTER),
        tracing=tracing,
        pressure=pressure,
    )
    tracked = has_label(LABEL_SANDBOX_NAME_HASH)
    controller = (
        Builder(mgr)
        .for_(SANDBOX)
        .owns(POD, tracked)
        .owns(SERVICE, tracked)
        .named(CONTROLLER_NAME)
        .with_options(workers=workers)
        .complete(reconciler)
    )
    register_collector(mgr.options.registry, cache.informer(SANDBOX))
    if pressure is not None:

        def requeue_deferred() -> None:
            for request in reconciler.deferred():
                controller.queue.add(request)

        pressure.on_calm(requeue_deferred)
        pressure.held_sources["sandbox"] = lambda: len(reconciler.deferred())
    return controller


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """`main.SETUPS` entry: the Sandbox controller configured from the process flags (§5.1)."""
    opts = ctx.options
    setup_sandbox_controller(
        mgr,
        workers=opts.sandbox_concurrent_workers,
        cluster_domain=opts.cluster_domain,
        write_behind_window=opts.sandbox_write_behind_window,
        cache_label_selectors=opts.cache_label_selectors,
        tracing=ctx.tracing,
        pressure=ctx.claim_pressure,
    )
