"""SandboxTemplate plan execution (controllers spec §2): one API call per action, in plan order.

Owns the mapping of typed actions to writes: a merge patch for the template label, create / full
update / delete for the NetworkPolicy. The first failure stops the pass and is raised, so the key is
retried with backoff (§2: every error returns). A foreign same-named policy is reported as
`ForeignPolicyError` after the earlier actions ran; it is never modified.
"""

from __future__ import annotations

import contextlib

from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, NotFound, RetryLater, Writer

from .decide import (
    CreatePolicy,
    DeletePolicy,
    PatchTemplateLabel,
    RefuseForeignPolicy,
    TemplatePlan,
    UpdatePolicy,
)

__all__ = ["ForeignPolicyError", "execute"]


class ForeignPolicyError(RetryLater):
    """A NetworkPolicy named like the template's is controlled by something else (backoff, no write)."""


async def execute(plan: TemplatePlan, writer: Writer, *, namespace: str, template_name: str) -> None:
    """Run `plan` against the API.

    Raises:
        KubeError: a write failed (the rest of the plan is skipped).
        ForeignPolicyError: a same-named policy is not controlled by this template.
    """
    for action in plan.actions:
        if isinstance(action, PatchTemplateLabel):
            await writer.patch(SANDBOX_TEMPLATE, template_name, action.patch(), namespace=namespace)
        elif isinstance(action, CreatePolicy):
            await writer.create(NETWORK_POLICY, action.body, namespace=namespace)
        elif isinstance(action, UpdatePolicy):
            await writer.update(NETWORK_POLICY, action.body)
        elif isinstance(action, DeletePolicy):
            with contextlib.suppress(NotFound):
                await writer.delete(NETWORK_POLICY, action.name, namespace=namespace, uid=action.uid or None)
        elif isinstance(action, RefuseForeignPolicy):
            raise ForeignPolicyError(action.message)
