"""Wiring of the SandboxTemplate controller (controllers spec §2, §5.3): enabled with `--extensions`.

Watches the templates (every event enqueues the template) and NetworkPolicies (enqueue the controlling
SandboxTemplate, group + kind match). Workers: `--sandbox-template-concurrent-workers`.
"""

from __future__ import annotations

from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, Builder, Manager

from ..context import ControllerContext
from .reconciler import TemplateReconciler

__all__ = ["CONTROLLER_NAME", "EVENT_REPORTER", "setup"]

CONTROLLER_NAME = "sandboxtemplate"
EVENT_REPORTER = "sandboxtemplate-controller"
"""Upstream's recorder name (§2: wired there but unused; ours reports refused NetworkPolicy creates)."""


def setup(mgr: Manager, ctx: ControllerContext) -> None:
    """Build the controller and add it to `mgr` (a `main.SETUPS` entry)."""
    # Upstream hands the unvalidated flag to controller-runtime, which treats <= 0 as 1.
    workers = max(1, ctx.options.sandbox_template_concurrent_workers)
    (
        Builder(mgr)
        .for_(SANDBOX_TEMPLATE)
        .owns(NETWORK_POLICY)
        .named(CONTROLLER_NAME)
        .with_options(workers=workers)
        .complete(
            TemplateReconciler(mgr.client, tracing=ctx.tracing, events=mgr.event_recorder(EVENT_REPORTER))
        )
    )
