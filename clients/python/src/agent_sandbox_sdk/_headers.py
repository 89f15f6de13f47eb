"""Request headers: case-insensitive layering and the router's routing headers (spec §3.6, §1.2).

Precedence (1.0.8): `extra_headers` < per-call headers < the SDK's routing headers. Names compare
case-insensitively; the spelling of the winning layer is kept.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .constants import (
    HEADER_SANDBOX_ID,
    HEADER_SANDBOX_NAMESPACE,
    HEADER_SANDBOX_POD_IP,
    HEADER_SANDBOX_PORT,
    HEADER_SANDBOX_TIMEOUT,
)

__all__ = ["merge_headers", "routing_headers", "timeout_header"]


def merge_headers(*layers: Mapping[str, str] | None) -> dict[str, str]:
    """Merge header layers, later layers winning, names compared case-insensitively."""
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        for name, value in (layer or {}).items():
            merged[name.lower()] = (name, value)
    return dict(merged.values())


def timeout_header(timeout: float | None) -> str | None:
    """`X-Sandbox-Timeout` text for a read timeout: Python `str()` of the number (`60`, `12.5`), or None.

    Integral floats print without a fraction (`60.0` -> `60`), as upstream sends its int default.
    """
    if timeout is None or isinstance(timeout, bool):
        return None
    if not math.isfinite(timeout) or timeout <= 0:
        return None
    if float(timeout).is_integer():
        return str(int(timeout))
    return str(timeout)


def routing_headers(
    *, sandbox_id: str, namespace: str, port: int, pod_ip: str | None, timeout: float | None
) -> dict[str, str]:
    """The `X-Sandbox-*` headers that tell a router which sandbox and port to reach."""
    headers = {
        HEADER_SANDBOX_ID: sandbox_id,
        HEADER_SANDBOX_NAMESPACE: namespace,
        HEADER_SANDBOX_PORT: str(port),
    }
    if pod_ip:
        headers[HEADER_SANDBOX_POD_IP] = pod_ip
    text = timeout_header(timeout)
    if text is not None:
        headers[HEADER_SANDBOX_TIMEOUT] = text
    return headers
