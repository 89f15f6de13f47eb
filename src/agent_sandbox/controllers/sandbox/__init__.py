"""The Sandbox controller (controllers spec §1): one Pod, optional PVCs and headless Service per Sandbox.

Layout (observe -> decide -> execute):

* `decide` - pure decisions, `decide(snapshot, now) -> Plan`;
* `status` - pure conclusion of a pass: status patch, requeue, errors (`conclude`);
* `children` / `conditions` - pure builders of child objects and of the §1.9 conditions;
* `execute` - one API call per planned action;
* `reconciler` - the I/O skeleton of a pass (cache reads, expectations, write-behind clock);
* `watches` - manager wiring (`setup`), Pod cache scoping and transform;
* `metrics` - the `agent_sandboxes` collector.
"""

from __future__ import annotations

from .conditions import ChildOutcome, compute_conditions
from .decide import check_expiry, decide, plan_existing_pod
from .execute import Executor, SandboxWriter
from .expectations import ChildExpectations
from .metrics import SandboxCollector, sandbox_metric_labels
from .plan import Plan, PlanMode, Results, Snapshot, StepResult
from .reconciler import SandboxReconcileError, SandboxReconciler, SandboxWaiting
from .status import Conclusion, conclude, status_patch
from .watches import CONTROLLER_NAME, EVENT_REPORTER, pod_cache_transform, setup

__all__ = [
    "CONTROLLER_NAME",
    "EVENT_REPORTER",
    "ChildExpectations",
    "ChildOutcome",
    "Conclusion",
    "Executor",
    "Plan",
    "PlanMode",
    "Results",
    "SandboxCollector",
    "SandboxReconcileError",
    "SandboxReconciler",
    "SandboxWaiting",
    "SandboxWriter",
    "Snapshot",
    "StepResult",
    "check_expiry",
    "compute_conditions",
    "conclude",
    "decide",
    "plan_existing_pod",
    "pod_cache_transform",
    "sandbox_metric_labels",
    "setup",
    "status_patch",
]
