"""Wiring of the Sandbox controller into a manager (controllers spec §1.1, §5.3 step 7-8, §5.5).

Owns: the Pod cache transform (the "Pod diet" of §1.1), the Sandbox cache transform (`managedFields` only of
Sandboxes someone server-side applied: what the pod-name patch's reset decision reads), the Pod/Service cache
scoping of `--cache-label-selectors`, the tracking-label index on Pods, the expectation handlers on the child
informers, the watches (Sandbox itself; Pods and Services with the tracking label, mapped to their
controlling Sandbox; PVCs are cached but not watched), the `agent_sandboxes` collector, and
`setup`, the one call the controller process makes.
"""

from __future__ import annotations

from agent_sandbox.api.constants import LABEL_SANDBOX_NAME_HASH
from agent_sandbox.api.meta import drop_unapplied_managed_fields
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SERVICE,
    Builder,
    KindOptions,
    Manager,
    Object,
    has_label,
)

from ..context import ControllerContext
from ..indexes import POD_BY_SANDBOX_HASH, ensure_indexes
from .expectations import ChildExpectations
from .metrics import register_collector
from .reconciler import SandboxReconciler

__all__ = [
    "CONTROLLER_NAME",
    "EVENT_REPORTER",
    "pod_cache_transform",
    "setup",
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


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """Register the Sandbox controller (and the `agent_sandboxes` collector) with `mgr` (a `main.SETUPS` entry).

    Scopes the Pod and Service caches (§1.1 Pod diet; `--cache-label-selectors`: only objects with the
    tracking label), so it must run before anything else creates those informers.

    Raises:
        RuntimeError: the Pod or Service informer already exists.
    """
    opts = ctx.options
    cache = mgr.cache
    scope = LABEL_SANDBOX_NAME_HASH if opts.cache_label_selectors else None
    cache.set_kind_options(POD, KindOptions(label_selector=scope, transform=pod_cache_transform))
    cache.set_kind_options(SANDBOX, KindOptions(transform=drop_unapplied_managed_fields))
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
        cluster_domain=opts.cluster_domain,
        write_behind_window=opts.sandbox_write_behind_window,
        expectations=expectations,
        events=mgr.event_recorder(EVENT_REPORTER),
        tracing=ctx.tracing,
        pressure=ctx.claim_pressure,
    )
    tracked = has_label(LABEL_SANDBOX_NAME_HASH)
    controller = (
        Builder(mgr)
        .for_(SANDBOX)
        .owns(POD, tracked)
        .owns(SERVICE, tracked)
        .named(CONTROLLER_NAME)
        .with_options(workers=opts.sandbox_concurrent_workers)
        .complete(reconciler)
    )
    register_collector(mgr.options.registry, cache.informer(SANDBOX))

    def requeue_deferred() -> None:
        for request in reconciler.deferred():
            controller.queue.add(request)

    ctx.claim_pressure.on_calm(requeue_deferred)
    ctx.claim_pressure.report_held(reconciler)
