"""The lifecycle controller (ours, docs/lifecycle.md): idle auto-suspend, hibernation and restore.

Layout (observe -> decide -> execute): `decide` (pure; `owners`: its child owner-reference patches),
`reconciler` (the pass), `observe` and `execute*` (I/O), `probe` (the runtime's `GET /v1/activity`), `metrics`, `watches` (`setup`).
"""

from __future__ import annotations

from .decide import (
    ArchiveSteps,
    Nothing,
    Plan,
    Probe,
    RestoreSteps,
    RuntimeActivity,
    Snapshot,
    Suspend,
    decide,
    idle_since,
)
from .metrics import HibernatedCollector, LifecycleMetrics
from .probe import ActivityProbe
from .reconciler import LifecycleReconciler
from .watches import CONTROLLER_NAME, EVENT_REPORTER, setup

__all__ = [
    "CONTROLLER_NAME",
    "EVENT_REPORTER",
    "ActivityProbe",
    "ArchiveSteps",
    "HibernatedCollector",
    "LifecycleMetrics",
    "LifecycleReconciler",
    "Nothing",
    "Plan",
    "Probe",
    "RestoreSteps",
    "RuntimeActivity",
    "Snapshot",
    "Suspend",
    "decide",
    "idle_since",
    "setup",
]
