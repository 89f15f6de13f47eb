"""Every controller's "retry later" outcome is an expected error: counted as an error, never as a panic."""

from __future__ import annotations

import pytest

from agent_sandbox.controllers.claim import ClaimRetry
from agent_sandbox.controllers.sandbox import SandboxReconcileError
from agent_sandbox.controllers.template import ForeignPolicyError
from agent_sandbox.controllers.warmpool import TemplateLookupError
from agent_sandbox.kube import Controller, ReconcilerFunc, Request, Result
from agent_sandbox.kube.metrics import REGISTRY
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "error",
    [
        ClaimRetry("AdoptionConflict: candidates kept changing hands"),
        TemplateLookupError("failed to get sandbox template 't': boom"),
        ForeignPolicyError("policy t-network-policy is controlled by someone else"),
        SandboxReconcileError("failed to create pod"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_retry_later_outcomes_are_not_panics(error: Exception) -> None:
    async def fail(_: Request) -> Result:
        raise error

    name = f"expected-{type(error).__name__}"
    controller = Controller(name, ReconcilerFunc(fail), clock=FakeClock())
    await controller.process(Request("ns", "x"))
    labels = {"controller": name}
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total", labels) == 1
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_panics_total", labels) == 0
    assert controller.queue.num_requeues(Request("ns", "x")) == 1
