"""The SandboxClaim controller (controllers spec §4): binds each claim to one Sandbox, warm or cold.

Enabled with `--extensions`. A claim adopts a Ready member of its warm pool when one is queued (one
guarded JSON patch re-parents it), else creates a Sandbox from the pool's template; its status mirrors
the Sandbox's Ready. Design and write counts: docs/design/claim-adoption.md; deliberate deviations from
upstream: docs/design/claim-quirks.md.
"""

from __future__ import annotations

from .decide import (
    Snapshot,
    decide_claim_intent,
    decide_expiry,
    decide_first_ready,
    resolve,
    resolve_expired,
)
from .queue import Take, WarmQueue
from .reconciler import ClaimConfig, ClaimReconciler
from .result import ClaimRetry
from .watches import CONTROLLER_NAME, setup

__all__ = [
    "CONTROLLER_NAME",
    "ClaimConfig",
    "ClaimReconciler",
    "ClaimRetry",
    "Snapshot",
    "Take",
    "WarmQueue",
    "decide_claim_intent",
    "decide_expiry",
    "decide_first_ready",
    "resolve",
    "resolve_expired",
    "setup",
]
