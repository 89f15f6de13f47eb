"""Claim status and lifecycle arithmetic: the Ready table, expiry, the status write rule (spec §4.9, §4.10).

Pure functions over wire dicts. Times are timezone-aware UTC datetimes; conditions are set with
`api.meta.upsert_condition` (metav1.Time, second precision).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.lifecycle import claim_expired
from agent_sandbox.api.meta import (
    ReadOnlyObject,
    new_condition,
    status_condition,
    upsert_condition,
)

from ..blueprint import semantic_equal
from .errors import ClaimError, SandboxCreatePending, SandboxNotOwned, TemplateNotFound, WarmPoolNotFound

__all__ = [
    "CLAIM_EXPIRED_MESSAGE",
    "Expiry",
    "compute_status",
    "expiry",
    "invalid_reference_event",
    "ready_condition",
    "status_equal",
]

CLAIM_EXPIRED_MESSAGE = "Claim expired. Sandbox cleanup initiated."
SANDBOX_EXPIRED_MESSAGE = "Underlying Sandbox resource has expired independently of the Claim."


# --------------------------------------------------------------------------- expiry (§4.9)


@dataclass(frozen=True, slots=True)
class Expiry:
    """`expired`: now >= expire-at; `time_left`: seconds until then (None when the claim never expires)."""

    expired: bool
    time_left: float | None


def expiry(claim: ReadOnlyObject, now: datetime) -> Expiry:
    """Earliest of `lifecycle.shutdownTime` and (claim's own Finished=True time + ttlSecondsAfterFinished)."""
    return Expiry(*claim_expired(claim, now))


# --------------------------------------------------------------------------- Ready table (§4.10)


def ready_condition(
    claim: ReadOnlyObject, sandbox: ReadOnlyObject | None, error: ClaimError | None, *, expired: bool
) -> dict[str, Any]:
    """The claim's Ready condition, first matching row of the §4.10 table wins."""
    gen = (claim.get("metadata") or {}).get("generation")
    false = c.ConditionStatus.FALSE.value
    if error is not None:
        return new_condition(c.CONDITION_READY, false, error.reason, error.message, gen)
    if expired:
        return new_condition(c.CONDITION_READY, false, c.REASON_CLAIM_EXPIRED, CLAIM_EXPIRED_MESSAGE, gen)
    if sandbox is None:
        return new_condition(
            c.CONDITION_READY, false, c.REASON_SANDBOX_MISSING, "Sandbox does not exist", gen
        )
    ready = status_condition(sandbox, c.CONDITION_READY)
    if ready is not None and ready.get("reason") == c.REASON_SANDBOX_EXPIRED:
        return new_condition(c.CONDITION_READY, false, c.REASON_SANDBOX_EXPIRED, SANDBOX_EXPIRED_MESSAGE, gen)
    if ready is not None:
        out = new_condition(
            c.CONDITION_READY,
            str(ready.get("status", c.ConditionStatus.UNKNOWN.value)),
            str(ready.get("reason") or c.REASON_SANDBOX_NOT_READY),
            str(ready.get("message", "")),
            gen,
        )
        if ready.get("lastTransitionTime"):
            out["lastTransitionTime"] = ready["lastTransitionTime"]
        return out
    return new_condition(c.CONDITION_READY, false, c.REASON_SANDBOX_NOT_READY, "Sandbox is not ready", gen)


def invalid_reference_event(claim: ReadOnlyObject, error: ClaimError | None) -> tuple[str, str] | None:
    """(reason, note) of the Warning Event due when this pass's `error` is an invalid reference (a pool or
    template that does not exist) the claim's stored Ready does not show yet, else None.

    Ours (claim-quirks.md): upstream reports these in `Ready` only. Keyed on the persisted condition, so
    the retry passes of one episode (every minute) emit nothing, nor does a restart; a new reference that
    is missing (a different message) or a return after the reference appeared is a new episode.
    """
    if not isinstance(error, WarmPoolNotFound | TemplateNotFound):
        return None
    ready = status_condition(claim, c.CONDITION_READY)
    if ready is not None and (ready.get("reason"), ready.get("message")) == (error.reason, error.message):
        return None
    return error.reason, error.message


def _marked_expired(claim: ReadOnlyObject) -> bool:
    """The claim's persisted Ready says `ClaimExpired` (§4.3 step 7 marked it; the teardown may follow)."""
    ready = status_condition(claim, c.CONDITION_READY)
    return ready is not None and ready.get("reason") == c.REASON_CLAIM_EXPIRED


def compute_status(
    claim: ReadOnlyObject,
    sandbox: ReadOnlyObject | None,
    error: ClaimError | None,
    *,
    expired: bool,
    now: datetime,
) -> dict[str, Any] | None:
    """The claim status after this pass (§4.10), or None when the computation is skipped.

    Skipped when the cold create met AlreadyExists, no Sandbox is known and a binding is already
    recorded: the recorded binding must not be overwritten from a lagging cache.
    """
    old: Mapping[str, Any] = claim.get("status") or {}
    bound_name = (old.get("sandbox") or {}).get("name")
    if isinstance(error, SandboxCreatePending) and sandbox is None and bound_name:
        return None
    new: dict[str, Any] = copy.deepcopy(dict(old))
    conditions: list[dict[str, Any]] = list(new.get("conditions") or [])
    upsert_condition(conditions, ready_condition(claim, sandbox, error, expired=expired), now)
    finished = status_condition(sandbox, c.CONDITION_FINISHED) if sandbox else None
    at = next((i for i, cd in enumerate(conditions) if cd.get("type") == c.CONDITION_FINISHED), None)
    # §4.9 step 5 over §4.10 step 2 read literally (docs/lifecycle.md): while the claim is marked expired and
    # still expired, its Finished - the TTL's start - stays as it is, whatever the Sandbox being torn down
    # shows. A Sandbox that lost its Finished while terminating (its Pod gone) used to drop it here, which
    # un-expired the claim and let the next pass bind a fresh Sandbox. A claim no longer expired (its
    # shutdownTime moved later) follows its new Sandbox in this very pass: an old Finished kept one pass
    # longer could expire it again, with its new Sandbox.
    keep_finished = expired and at is not None and _marked_expired(claim)
    if finished is not None and not keep_finished:
        if at is None:
            conditions.append(copy.deepcopy(dict(finished)))
        else:
            conditions[at] = copy.deepcopy(dict(finished))
    elif finished is None and not keep_finished and (sandbox is not None or not expired):
        conditions = [cd for cd in conditions if cd.get("type") != c.CONDITION_FINISHED]
    new["conditions"] = conditions
    if sandbox is not None:
        ref: dict[str, Any] = {"name": sandbox["metadata"]["name"]}
        ips = (sandbox.get("status") or {}).get("podIPs")
        if ips:
            ref["podIPs"] = list(ips)
        new["sandbox"] = ref
    elif error is None or isinstance(error, SandboxNotOwned):
        new.pop("sandbox", None)
    # Any other error keeps the previous binding: a transient failure must not turn into a cold start.
    return new


def _normalized(status: ReadOnlyObject) -> dict[str, Any]:
    conds = sorted(status.get("conditions") or [], key=lambda cd: str(cd.get("type", "")))
    return {"conditions": conds, "sandbox": status.get("sandbox")}


def status_equal(old: ReadOnlyObject, new: ReadOnlyObject) -> bool:
    """Semantic equality with conditions compared as a set ordered by type (§4.10 write rule)."""
    return semantic_equal(_normalized(old), _normalized(new))
