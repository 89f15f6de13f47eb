"""Resume, suspend and hibernate a Sandbox by name (ours, docs/lifecycle.md): what `agent-sandbox lifecycle`
runs, and what an SDK's `resume(name)` does.

`resume` works whatever state the Sandbox is in: a suspended Sandbox is set Running (recording
`resume-reason: Manual`), a hibernated one (only its SandboxArchive exists) gets a restore request that the
lifecycle controller carries out, a running one is left alone. With `wait`, it returns once the Sandbox is
Ready. Every write is a merge patch of our own keys plus `spec.operatingMode`, exactly what a user could
write with kubectl.
"""

from __future__ import annotations

import asyncio
import enum
import time
from datetime import UTC, datetime

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import OperatingMode
from agent_sandbox.api.meta import is_ready
from agent_sandbox.kube import SANDBOX, ApiClient, NotFound, Object, ResourceKind

__all__ = ["NoSuchSandbox", "ResumeOutcome", "hibernate", "resume", "suspend"]


class NoSuchSandbox(LookupError):
    """Neither a Sandbox nor a hibernated Sandbox has that name."""


class ResumeOutcome(enum.StrEnum):
    RESUMED = "resumed"
    RESTORING = "restoring"
    ALREADY_RUNNING = "already running"


async def _get(api: ApiClient, kind: ResourceKind, name: str, namespace: str) -> Object | None:
    try:
        return await api.get(kind, name, namespace=namespace)
    except NotFound:
        return None


async def resume(
    api: ApiClient, name: str, namespace: str, *, wait: float | None = None, poll: float = 0.25
) -> ResumeOutcome:
    """Resume (or restore) Sandbox `namespace/name`; with `wait` seconds, until it is Ready.

    Raises:
        NoSuchSandbox: no Sandbox and no archive of that name.
        TimeoutError: not Ready within `wait`.
    """
    now = datetime.now(UTC)
    sandbox = await _get(api, SANDBOX, name, namespace)
    if sandbox is not None:
        if (sandbox.get("spec") or {}).get("operatingMode") == OperatingMode.SUSPENDED:
            await api.patch(SANDBOX, name, lc.resume_patch(lc.Cause.MANUAL, now), namespace=namespace)
            outcome = ResumeOutcome.RESUMED
        else:
            outcome = ResumeOutcome.ALREADY_RUNNING
    else:
        try:
            await api.patch(
                lc.ARCHIVE, name, lc.restore_request_patch(lc.Cause.MANUAL, now), namespace=namespace
            )
        except NotFound:
            raise NoSuchSandbox(f"no Sandbox or hibernated Sandbox named {namespace}/{name}") from None
        outcome = ResumeOutcome.RESTORING
    if wait is not None:
        await _wait_ready(api, name, namespace, wait, poll)
    return outcome


async def _wait_ready(api: ApiClient, name: str, namespace: str, within: float, poll: float) -> None:
    deadline = time.monotonic() + within
    while True:
        sandbox = await _get(api, SANDBOX, name, namespace)
        if sandbox is not None and is_ready(sandbox):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"Sandbox {namespace}/{name} not Ready within {within:g}s")
        await asyncio.sleep(poll)


async def suspend(api: ApiClient, name: str, namespace: str) -> None:
    """Suspend Sandbox `namespace/name` (as `kubectl patch ... operatingMode: Suspended` would)."""
    sandbox = await _get(api, SANDBOX, name, namespace)
    if sandbox is None:
        raise NoSuchSandbox(f"no Sandbox named {namespace}/{name}")
    patch = lc.suspend_patch(lc.Cause.MANUAL, datetime.now(UTC), sandbox["metadata"]["resourceVersion"])
    await api.patch(SANDBOX, name, patch, namespace=namespace)


async def hibernate(api: ApiClient, name: str, namespace: str) -> None:
    """Ask the lifecycle controller to hibernate Sandbox `namespace/name` now (suspending it first)."""
    try:
        await api.patch(
            SANDBOX,
            name,
            {"metadata": {"annotations": {lc.ANNOTATION_HIBERNATE: "true"}}},
            namespace=namespace,
        )
    except NotFound:
        raise NoSuchSandbox(f"no Sandbox named {namespace}/{name}") from None
