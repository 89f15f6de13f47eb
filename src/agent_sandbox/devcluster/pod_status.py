"""The pod status a kubelet reports for the runtime container, as the local runner writes it (pure).

Two shapes: Ready / not Ready with the container's restart count (and, after a simulated crash, the
terminated `lastState` a kubelet shows with exit code 137), and `CreateContainerConfigError` for a container
whose environment cannot be built (`pod_env.ContainerConfigError`). Both are strategic merge patches of the
status subresource whose `containerStatuses` list is sent whole, as a strategic merge replaces it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

__all__ = ["config_error_patch", "now", "ready_condition", "ready_patch"]


def now() -> str:
    """The time as the API server's timestamps are written (second precision, UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready_condition(pod: Mapping[str, Any]) -> str | None:
    """The pod's Ready condition status ("True" / "False" / "Unknown"), None when it has none."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            value = cond.get("status")
            return str(value) if value is not None else None
    return None


def _conditions(ready: bool, at: str, reason: str | None, message: str | None) -> list[dict[str, Any]]:
    return [
        {
            "type": t,
            "status": "True" if ready else "False",
            "lastTransitionTime": at,
            "reason": reason,
            "message": message,
        }
        for t in ("Ready", "ContainersReady")
    ]


def ready_patch(
    pod: Mapping[str, Any],
    *,
    ready: bool,
    container: str,
    restarts: int,
    started_at: str,
    message: str,
    crashed: bool = False,
) -> dict[str, Any]:
    """Ready (the container running since `started_at`) or not Ready (`message`), every container's restart
    count; `crashed`: `container` also gets the terminated `lastState` of a killed container."""
    at = now()
    reason, text = (None, None) if ready else ("ContainersNotReady", message)
    statuses = []
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        entry: dict[str, Any] = {"name": c["name"], "ready": ready, "restartCount": restarts}
        if crashed and c["name"] == container:
            entry["lastState"] = {
                "terminated": {
                    "exitCode": 137,
                    "reason": "Error",
                    "startedAt": started_at or at,
                    "finishedAt": at,
                }
            }
        if ready:  # (the list is replaced: a CreateContainerConfigError's waiting state goes)
            entry["state"] = {"running": {"startedAt": started_at or at}}
            entry["started"] = True
        statuses.append(entry)
    return {"status": {"conditions": _conditions(ready, at, reason, text), "containerStatuses": statuses}}


def config_error_patch(pod: Mapping[str, Any], *, container: str, message: str) -> dict[str, Any]:
    """`container` cannot start (`CreateContainerConfigError`, `message`): it waits, the pod is not Ready."""
    names = [str(c.get("name", "")) for c in (pod.get("spec") or {}).get("containers") or []]
    unready = f"containers with unready status: [{' '.join(names)}]"
    waiting = {"waiting": {"reason": "CreateContainerConfigError", "message": message}}
    statuses = [  # the whole list (a strategic merge patch replaces it), only this container changed
        {**c, "ready": False, "started": False, "state": waiting} if c.get("name") == container else c
        for c in (pod.get("status") or {}).get("containerStatuses") or []
    ]
    conditions = _conditions(False, now(), "ContainersNotReady", unready)
    return {"status": {"conditions": conditions, "containerStatuses": statuses}}
