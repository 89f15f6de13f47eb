"""Wiring of the SandboxWarmPool controller (controllers spec §3.1, §5.3): enabled with `--extensions`.

Watches:

* SandboxWarmPool: every event enqueues the pool itself;
* Sandbox: enqueue the controlling SandboxWarmPool (group + kind, any version). Before that, an
  `ExpectationsObserver` registered on the same informer lowers the pool's expectations on add and
  delete events of pool-owned Sandboxes - it is added at setup, so it always runs before the
  controller's enqueue handler (added when the controller starts): a pass triggered by our own write
  already sees the lowered expectation (§3.6 ordering requirement);
* SandboxTemplate: every pool of the template's namespace that references it (index lookup).

Registers the indexes it reads (Sandbox by pool label, pool by template name; see `indexes`).
"""

from __future__ import annotations

from agent_sandbox.api.meta import controller_name, pool_key
from agent_sandbox.kube import (
    SANDBOX,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Builder,
    Expectations,
    Informer,
    Manager,
    MapFunc,
    Object,
    Request,
)

from ..context import ControllerContext
from ..indexes import INDEX_POOL_TEMPLATE_REF, POOL_BY_TEMPLATE, SANDBOX_BY_POOL, ensure_indexes
from .config import WarmPoolConfig
from .reconciler import WarmPoolReconciler

__all__ = ["CONTROLLER_NAME", "EVENT_REPORTER", "ExpectationsObserver", "pools_for_template", "setup"]

CONTROLLER_NAME = "sandboxwarmpool"
EVENT_REPORTER = "sandboxwarmpool-controller"


class ExpectationsObserver:
    """Informer handler: our creates and deletes of pool-owned Sandboxes become observed (§3.6)."""

    __slots__ = ("_exp",)

    def __init__(self, expectations: Expectations) -> None:
        self._exp = expectations

    @staticmethod
    def _key(obj: Object) -> str | None:
        name = controller_name(obj, SANDBOX_WARM_POOL)
        return None if name is None else pool_key((obj.get("metadata") or {}).get("namespace", ""), name)

    def on_add(self, obj: Object) -> None:
        key = self._key(obj)
        if key is not None:
            self._exp.creation_observed(key)

    def on_update(self, old: Object, new: Object) -> None:
        return None  # updates only enqueue (claim re-parenting does not touch expectations, §3.11)

    def on_delete(self, obj: Object) -> None:
        key = self._key(obj)
        if key is not None:
            self._exp.deletion_observed(key, obj["metadata"].get("uid", ""))


def pools_for_template(pools: Informer) -> MapFunc:
    """Map a template to the pools of its namespace that reference it (via the pool index)."""

    def mapper(obj: Object) -> list[Request]:
        meta = obj["metadata"]
        ns = meta.get("namespace") or ""
        return [
            Request(ns, p["metadata"]["name"])
            for p in pools.by_index(INDEX_POOL_TEMPLATE_REF, meta["name"], ns)
        ]

    return mapper


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """Build the controller and add it to `mgr` (a `main.SETUPS` entry)."""
    ensure_indexes(mgr.cache, SANDBOX_BY_POOL, POOL_BY_TEMPLATE)
    expectations = Expectations()
    mgr.cache.informer(SANDBOX).add_handler(ExpectationsObserver(expectations))
    reconciler = WarmPoolReconciler(
        mgr.client,
        config=WarmPoolConfig.from_options(ctx.options),
        expectations=expectations,
        events=mgr.event_recorder(EVENT_REPORTER),
        pressure=ctx.claim_pressure,
    )
    controller = (
        Builder(mgr)
        .for_(SANDBOX_WARM_POOL)
        .owns(SANDBOX)
        .watches(SANDBOX_TEMPLATE, pools_for_template(mgr.cache.informer(SANDBOX_WARM_POOL)))
        .named(CONTROLLER_NAME)
        .with_options(workers=ctx.options.sandbox_warm_pool_concurrent_workers)
        .complete(reconciler)
    )

    def requeue_held() -> None:
        for key in reconciler.claim_yield.held():
            namespace, _, name = key.partition("/")
            controller.queue.add(Request(namespace, name))

    ctx.claim_pressure.on_calm(requeue_held)
    ctx.claim_pressure.report_held(reconciler)
