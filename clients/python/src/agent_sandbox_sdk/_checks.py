"""Argument checks shared by the flows (no I/O): what a caller passes is refused here, naming the parameter,
before it can fail deep in the HTTP or gRPC stack."""

from __future__ import annotations

import math

__all__ = ["MAX_TIMEOUT_SECONDS", "check_timeout"]

#: The longest timeout taken (30 days). Larger ones broke below the SDK: `1e10` raised OverflowError from the
#: socket layer, `2**31` timed out at once, and gRPC reported a deadline exceeded before the command ran.
MAX_TIMEOUT_SECONDS = 30 * 86400


def check_timeout(value: float | None, name: str = "timeout") -> None:
    """`ValueError` unless `value` is None or a positive, finite number of seconds up to `MAX_TIMEOUT_SECONDS`
    (as `requests` refuses 0)."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0
        or not math.isfinite(value)
        or value > MAX_TIMEOUT_SECONDS
    ):
        raise ValueError(
            f"{name} must be a positive number of seconds up to {MAX_TIMEOUT_SECONDS} (30 days), got {value!r}"
        )
