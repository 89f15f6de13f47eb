"""The SandboxTemplate controller (controllers spec §2): shared NetworkPolicy and ref-hash label."""

from __future__ import annotations

from .decide import TemplatePlan, TemplateSnapshot, decide, desired_policy_spec, policy_name
from .execute import ForeignPolicyError, Outcome, execute
from .reconciler import TemplateReconciler
from .watches import CONTROLLER_NAME, setup

__all__ = [
    "CONTROLLER_NAME",
    "ForeignPolicyError",
    "Outcome",
    "TemplatePlan",
    "TemplateReconciler",
    "TemplateSnapshot",
    "decide",
    "desired_policy_spec",
    "execute",
    "policy_name",
    "setup",
]
