"""Pure helpers behind the dev cluster's node simulations (taints, readiness); no I/O.

Owns: computing a node's new taint list for `DevCluster.taint_node`/`untaint_node` (one taint per key and
effect, as kubectl keeps them) and reading a node's Ready condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def with_taint(
    taints: Sequence[Mapping[str, Any]], key: str, value: str = "", effect: str = "NoSchedule"
) -> list[dict[str, Any]]:
    """`taints` plus key=value:effect, replacing a taint with the same key and effect.

    Raises:
        ValueError: unknown effect or empty key.
    """
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect must be one of {TAINT_EFFECTS}, not {effect!r}")
    if not key:
        raise ValueError("taint key must not be empty")
    kept = [dict(t) for t in taints if not (t.get("key") == key and t.get("effect") == effect)]
    taint: dict[str, Any] = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return [*kept, taint]


def without_taint(
    taints: Sequence[Mapping[str, Any]], key: str, effect: str | None = None
) -> list[dict[str, Any]]:
    """`taints` minus those with `key` (and `effect`, when given)."""
    return [
        dict(t) for t in taints if not (t.get("key") == key and (effect is None or t.get("effect") == effect))
    ]


def ready_status(node: Mapping[str, Any]) -> str | None:
    """The status ("True", "False", "Unknown") of the node's Ready condition, None when it has none."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            status: str | None = cond.get("status")
            return status
    return None
