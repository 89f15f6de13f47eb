"""The SandboxWarmPool controller (controllers spec §3): N pre-provisioned Sandboxes per pool."""

from __future__ import annotations

from .batch import slow_start_batch
from .config import WarmPoolConfig
from .decide import CreateMembers, DeleteMember, PatchMember, PoolPlan, PoolSnapshot, decide
from .members import StalenessChecker, build_member, go_duration
from .reconciler import TemplateLookupError, WarmPoolReconciler
from .shaping import ProgressTracker, RefillBuckets, ReplenishHold
from .watches import CONTROLLER_NAME, EVENT_REPORTER, ExpectationsObserver, pools_for_template, setup

__all__ = [
    "CONTROLLER_NAME",
    "EVENT_REPORTER",
    "CreateMembers",
    "DeleteMember",
    "ExpectationsObserver",
    "PatchMember",
    "PoolPlan",
    "PoolSnapshot",
    "ProgressTracker",
    "RefillBuckets",
    "ReplenishHold",
    "StalenessChecker",
    "TemplateLookupError",
    "WarmPoolConfig",
    "WarmPoolReconciler",
    "build_member",
    "decide",
    "go_duration",
    "pools_for_template",
    "setup",
    "slow_start_batch",
]
