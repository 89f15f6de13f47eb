"""Claim status and lifecycle arithmetic: conditions, the Ready table, expiry (controllers spec §0.5, §4.9, §4.10).

Pure functions over wire dicts. Times are timezone-aware UTC datetimes; condition times are written with
second precision (metav1.Time).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from agent_sandbox.api import constants as c

from ..blueprint import semantic_equal
from .errors import ClaimError, SandboxCreatePending, SandboxNotOwned

__all__ = [
    "CLAIM_EXPIRED_MESSAGE",
    "Expiry",
    "compute_status",
    "condition",
    "expiry",
    "format_time",
    "parse_time",
    "ready_condition",
    "status_equal",
    "upsert_condition",
]

Obj = Mapping[str, Any]
CLAIM_EXPIRED_MESSAGE = "Claim expired. Sandbox cleanup initiated."
SANDBOX_EXPIRED_MESSAGE = "Underlying Sandbox resource has expired independently of the Claim."


def format_time(t: datetime) -> str:
    """metav1.Time wire form: RFC 3339, seconds, UTC."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> datetime | None:
    """Parse an RFC 3339 / ISO 8601 timestamp (any fraction length, 'Z' or offset); None if unusable."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip().replace("z", "Z")
    if "." in text:  # Python parses at most 6 fractional digits; Go writes up to 9.
        head, _, rest = text.partition(".")
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def condition(conditions: object, type_: str) -> dict[str, Any] | None:
    for cond in conditions if isinstance(conditions, list) else ():
        if cond.get("type") == type_:
            found: dict[str, Any] = cond
            return found
    return None


def upsert_condition(conditions: list[dict[str, Any]], new: Mapping[str, Any], now: datetime) -> None:
    """apimachinery `SetStatusCondition`, in place (§0.5).

    Absent: append (lastTransitionTime = given or now). Present: a status change sets lastTransitionTime
    (given or now); reason, message and observedGeneration are always overwritten; the position is kept.
    """
    ltt = new.get("lastTransitionTime") or format_time(now)
    cur = condition(conditions, new["type"])
    if cur is None:
        conditions.append({**new, "lastTransitionTime": ltt})
        return
    if cur.get("status") != new["status"]:
        cur["status"] = new["status"]
        cur["lastTransitionTime"] = ltt
    cur["reason"] = new["reason"]
    cur["message"] = new["message"]
    if new.get("observedGeneration") is not None:
        cur["observedGeneration"] = new["observedGeneration"]
    else:
        cur.pop("observedGeneration", None)


# --------------------------------------------------------------------------- expiry (§4.9)


@dataclass(frozen=True, slots=True)
class Expiry:
    """`expired`: now >= expire-at; `time_left`: seconds until then (None when the claim never expires)."""

    expired: bool
    time_left: float | None


def expiry(claim: Obj, now: datetime) -> Expiry:
    """Earliest of `lifecycle.shutdownTime` and (claim's own Finished=True time + ttlSecondsAfterFinished)."""
    lifecycle = (claim.get("spec") or {}).get("lifecycle")
    if not lifecycle:
        return Expiry(False, None)
    deadlines: list[datetime] = []
    shutdown = parse_time(lifecycle.get("shutdownTime"))
    if shutdown is not None:
        deadlines.append(shutdown)
    ttl = lifecycle.get("ttlSecondsAfterFinished")
    if ttl is not None:
        finished = condition((claim.get("status") or {}).get("conditions"), c.CONDITION_FINISHED)
        if finished is not None and finished.get("status") == c.ConditionStatus.TRUE:
            at = parse_time(finished.get("lastTransitionTime"))
            if at is not None and at.timestamp() > 0:
                deadlines.append(at + timedelta(seconds=int(ttl)))
    if not deadlines:
        return Expiry(False, None)
    left = (min(deadlines) - now).total_seconds()
    return Expiry(left <= 0, left)


# --------------------------------------------------------------------------- Ready table (§4.10)


def _cond(type_: str, status: str, reason: str, message: str, generation: object) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "status": status, "reason": reason, "message": message}
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def ready_condition(
    claim: Obj, sandbox: Obj | None, error: ClaimError | None, *, expired: bool
) -> dict[str, Any]:
    """The claim's Ready condition, first matching row of the §4.10 table wins."""
    gen = (claim.get("metadata") or {}).get("generation")
    false = c.ConditionStatus.FALSE.value
    if error is not None:
        return _cond(c.CONDITION_READY, false, error.reason, error.message, gen)
    if expired:
        return _cond(c.CONDITION_READY, false, c.REASON_CLAIM_EXPIRED, CLAIM_EXPIRED_MESSAGE, gen)
    if sandbox is None:
        return _cond(c.CONDITION_READY, false, c.REASON_SANDBOX_MISSING, "Sandbox does not exist", gen)
    ready = condition((sandbox.get("status") or {}).get("conditions"), c.CONDITION_READY)
    if ready is not None and ready.get("reason") == c.REASON_SANDBOX_EXPIRED:
        return _cond(c.CONDITION_READY, false, c.REASON_SANDBOX_EXPIRED, SANDBOX_EXPIRED_MESSAGE, gen)
    if ready is not None:
        out = _cond(
            c.CONDITION_READY,
            str(ready.get("status", c.ConditionStatus.UNKNOWN.value)),
            str(ready.get("reason") or c.REASON_SANDBOX_NOT_READY),
            str(ready.get("message", "")),
            gen,
        )
        if ready.get("lastTransitionTime"):
            out["lastTransitionTime"] = ready["lastTransitionTime"]
        return out
    return _cond(c.CONDITION_READY, false, c.REASON_SANDBOX_NOT_READY, "Sandbox is not ready", gen)


def compute_status(
    claim: Obj, sandbox: Obj | None, error: ClaimError | None, *, expired: bool, now: datetime
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
    finished = (
        condition((sandbox.get("status") or {}).get("conditions"), c.CONDITION_FINISHED) if sandbox else None
    )
    if finished is not None:
        at = next((i for i, cd in enumerate(conditions) if cd.get("type") == c.CONDITION_FINISHED), None)
        if at is None:
            conditions.append(copy.deepcopy(finished))
        else:
            conditions[at] = copy.deepcopy(finished)
    elif sandbox is not None or not expired:
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


def _normalized(status: Obj) -> dict[str, Any]:
    conds = sorted(status.get("conditions") or [], key=lambda cd: str(cd.get("type", "")))
    return {"conditions": conds, "sandbox": status.get("sandbox")}


def status_equal(old: Obj, new: Obj) -> bool:
    """Semantic equality with conditions compared as a set ordered by type (§4.10 write rule)."""
    return semantic_equal(_normalized(old), _normalized(new))
