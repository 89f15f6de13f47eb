"""When a claim or a Sandbox has expired, or is being deleted: states no wait or restore will ever leave.

Read as the controllers reckon them (the apiserver's timestamps, `_apitime.py`), so that a flow raises at
once instead of waiting out its timeout for a state that cannot come.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ._apitime import deadline_after, parse_time
from ._lifecycle_names import REASON_SANDBOX_EXPIRED
from .exceptions import SandboxClaimFailedError, SandboxNotFoundError

__all__ = ["claim_is_expired", "condition", "raise_if_final"]


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's status condition of type `kind`, if it has one."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def claim_is_expired(claim: Mapping[str, Any], now: datetime) -> bool:
    """As the claim controller reckons it: the earliest of `spec.lifecycle.shutdownTime` and `Finished` +
    `ttlSecondsAfterFinished` has passed. A `Ready=False/ClaimExpired` condition is not read: it lags
    behind a `shutdownTime` moved later (the lifecycle controller does not read it either)."""
    lifecycle = (claim.get("spec") or {}).get("lifecycle") or {}
    deadlines = [t for t in (parse_time(lifecycle.get("shutdownTime")),) if t is not None]
    ttl = lifecycle.get("ttlSecondsAfterFinished")
    finished = condition(claim, "Finished") or {}
    if isinstance(ttl, int) and finished.get("status") == "True":
        at = parse_time(finished.get("lastTransitionTime"))
        if at is not None and at.timestamp() > 0 and (due := deadline_after(at, ttl)) is not None:
            deadlines.append(due)
    return bool(deadlines) and min(deadlines) <= now


def raise_if_final(namespace: str, sandbox: str, obj: Mapping[str, Any], generation: int, mode: str) -> None:
    """Raise when the Sandbox will never reach `mode`: it is being deleted, or it expired (its controller
    only tears it down). Until December 6 the wait ran out its whole timeout, then named a wrong reason."""
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        raise SandboxNotFoundError(f"Sandbox {namespace}/{sandbox} is being deleted: it will not be {mode}")
    ready = condition(obj, "Ready") or {}
    deadline = (obj.get("spec") or {}).get("shutdownTime")
    at = parse_time(deadline)
    passed = at is not None and at <= datetime.now(UTC)
    marked = (
        ready.get("reason") == REASON_SANDBOX_EXPIRED
        and int(ready.get("observedGeneration") or 0) >= generation
    )
    if passed or marked:
        raise SandboxClaimFailedError(
            f"Sandbox {namespace}/{sandbox} has expired (its shutdownTime {deadline} passed): it will not be {mode}",
            reason=REASON_SANDBOX_EXPIRED,
            condition_message=ready.get("message"),
        )
