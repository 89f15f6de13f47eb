"""Fields of API objects the benchmarks read and write: the Ready condition and RFC 3339 timestamps.

Owns: `is_ready` (a Ready=True condition), `parse_rfc3339` (annotation and Lease times to epoch seconds) and
`rfc3339nano` (the send-time stamp a benchmark claim carries). Epoch seconds are wall-clock (`time.time()`),
the clock the controller stamps its annotations with.
"""

from __future__ import annotations

from datetime import UTC, datetime

from agent_sandbox.kube import Object

__all__ = ["is_ready", "parse_rfc3339", "rfc3339nano"]


def parse_rfc3339(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp with optional fraction ('Z' or offset); None if unusable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339nano(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_ready(obj: Object) -> bool:
    return any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in (obj.get("status") or {}).get("conditions") or ()
    )
