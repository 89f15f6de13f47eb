"""SandboxTemplate plan execution (controllers spec §2): one API call per action, in plan order.

Owns the mapping of typed actions to writes: a merge patch for the template label, create / full
update / delete for the NetworkPolicy. The first failure stops the pass and is raised, so the key is
retried with backoff (§2: every error returns). A foreign same-named policy is reported as
`ForeignPolicyError` after the earlier actions ran; it is never modified.

A refused policy create (quota, admission webhook, validation) is also reported through `on_refused_create`
with the note of a `FailedCreate` Warning Event (ours; upstream emits none, §2): without it a template
whose default-deny policy cannot exist is silent while its Sandboxes run unprotected.

Two answers are not failures but cache lag, reported as `Outcome.CACHE_LAG` so the pass ends with a short quiet
requeue instead of an error-level log line and a `controller_runtime_reconcile_errors_total` sample: a
policy create answered `AlreadyExists` (the policy exists, the informer has not delivered it yet) and a
policy update answered `Conflict` (the cached resourceVersion is older than the stored one). The next
pass decides again from a cache that has caught up; a foreign policy is then refused as usual.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable

from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX_TEMPLATE,
    Conflict,
    Forbidden,
    KubeError,
    NotFound,
    OwnWrites,
    RetryLater,
    Writer,
    error_text,
)
from agent_sandbox.kube.errors import is_namespace_terminating

from .decide import (
    CreatePolicy,
    DeletePolicy,
    PatchTemplateLabel,
    RefuseForeignPolicy,
    TemplatePlan,
    UpdatePolicy,
)

__all__ = ["ForeignPolicyError", "Outcome", "execute"]


class Outcome(enum.Enum):
    """How a plan's execution ended (failures are raised)."""

    DONE = "done"
    """Every action ran."""
    CACHE_LAG = "cache-lag"
    """A policy write met a newer stored state than the cache showed (module docstring); the rest skipped."""


class ForeignPolicyError(RetryLater):
    """A NetworkPolicy named like the template's is controlled by something else (backoff, no write)."""


async def execute(
    plan: TemplatePlan,
    writer: Writer,
    *,
    namespace: str,
    template_name: str,
    own_writes: OwnWrites | None = None,
    on_refused_create: Callable[[str], None] | None = None,
) -> Outcome:
    """Run `plan` against the API; `Outcome.CACHE_LAG` when a policy write met a newer stored state.

    Args:
        own_writes: receives the answer of every write (and forgets a deleted policy), so the next
            passes read them instead of an older cached copy.
        on_refused_create: called with `failed to create NetworkPolicy <name>: <API server message>` when
            the policy create fails (not for cache lag or a namespace being deleted), before it is raised.

    Raises:
        KubeError: a write failed (the rest of the plan is skipped).
        ForeignPolicyError: a same-named policy is not controlled by this template.
    """
    for action in plan.actions:
        if isinstance(action, PatchTemplateLabel):
            written = await writer.patch(SANDBOX_TEMPLATE, template_name, action.patch(), namespace=namespace)
            if own_writes is not None:
                own_writes.remember(SANDBOX_TEMPLATE, written)
        elif isinstance(action, (CreatePolicy, UpdatePolicy)):
            try:
                if isinstance(action, CreatePolicy):
                    written = await writer.create(NETWORK_POLICY, action.body, namespace=namespace)
                else:
                    written = await writer.update(NETWORK_POLICY, action.body)
            except Conflict:  # AlreadyExists included: both mean "the cache is behind"
                return Outcome.CACHE_LAG
            except KubeError as exc:
                if isinstance(exc, Forbidden) and is_namespace_terminating(exc):
                    # The namespace is being deleted, and the template and its policy with it: nothing to
                    # do (until December 6 a `reconciler error` with backoff retries until it was gone).
                    return Outcome.DONE
                if isinstance(action, CreatePolicy) and on_refused_create is not None:
                    name = action.body["metadata"]["name"]
                    on_refused_create(f"failed to create NetworkPolicy {name}: {error_text(exc)}")
                raise
            if own_writes is not None:
                own_writes.remember(NETWORK_POLICY, written)
        elif isinstance(action, DeletePolicy):
            if own_writes is not None:
                own_writes.forget(NETWORK_POLICY, namespace, action.name)
            with contextlib.suppress(NotFound):
                await writer.delete(NETWORK_POLICY, action.name, namespace=namespace, uid=action.uid or None)
        elif isinstance(action, RefuseForeignPolicy):
            raise ForeignPolicyError(action.message)
    return Outcome.DONE
