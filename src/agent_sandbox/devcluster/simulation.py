"""Pure helpers behind the dev cluster's node and pod simulations (taints, readiness); no I/O.

Owns: computing a node's new taint list for `DevCluster.taint_node`/`untaint_node` (one taint per key and
effect, as kubectl keeps them), reading a node's Ready condition, and the status patch that reports a
Running pod's containers ready or not (`DevCluster.set_pod_ready`, for pods whose readiness is external).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
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


def pod_readiness_status(
    pod: Mapping[str, Any], ready: bool, *, now: datetime | None = None
) -> dict[str, Any]:
    """The pod `status` fields a kubelet writes when every container turns ready (or not): for a merge patch.

    `Ready` and `ContainersReady` are replaced (the other conditions are kept; a condition's
    `lastTransitionTime` only moves when its status changes) and each container status gets `ready`.
    A Not-ready pod shows reason `ContainersNotReady` and the containers' names, as a kubelet does.

    Raises:
        ValueError: the pod is not Running (there are no running containers to report on).
    """
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        meta = pod.get("metadata") or {}
        raise ValueError(
            f"pod {meta.get('namespace')}/{meta.get('name')} is {status.get('phase') or 'not started'}, "
            "not Running: only a running container can be ready"
        )
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = "True" if ready else "False"
    names = " ".join(c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or [])
    old = {c.get("type"): c for c in status.get("conditions") or []}
    conditions = [
        dict(c) for c in status.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady")
    ]
    for kind in ("Ready", "ContainersReady"):
        previous = old.get(kind) or {}
        changed = previous.get("status") != value
        written: dict[str, Any] = {
            "type": kind,
            "status": value,
            "lastTransitionTime": stamp if changed else previous.get("lastTransitionTime", stamp),
        }
        if not ready:
            written["reason"] = "ContainersNotReady"
            written["message"] = f"containers with unready status: [{names}]"
        conditions.append(written)
    containers = [{**c, "ready": ready} for c in status.get("containerStatuses") or []]
    return {"conditions": conditions, "containerStatuses": containers}
