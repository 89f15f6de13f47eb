"""Container logs of runtime pods, kept as a kubelet keeps them and served through the API server by kwok.

A kubelet writes each container's output to `<ns>_<pod>_<uid>/<container>/<restart>.log` in the CRI log
format and serves it on its `/containerLogs` endpoint, which the API server's `pods/log` proxies to. On the
dev cluster a runtime pod's runtime runs inside the local runner, so the runner does the kubelet's part:

* `ContainerLog` is one container's files: one per instance (a simulated crash starts the next), CRI lines
  (`<RFC 3339 nano> stderr F <text>`), the previous instance's file kept for `--previous`.
* `RoutingHandler` writes the records the runtime logs while serving a pod (`agent_sandbox.runtime.*`:
  its start line, errors, draining) to that pod's file. The pod is found by a context variable that
  `ContainerLog.active()` sets around `RuntimeServer.start()` / `stop()`: the listeners and every request
  task they spawn inherit the context they were created in.
* `logs_object` is the kwok `Logs` object (kwok.x-k8s.io/v1alpha1, named like the pod, owned by it so the
  garbage collector removes it with the pod) that points kwok's kubelet endpoint at the files.

So `kubectl logs`, `kubectl logs --previous`, the SDK's `get_logs` and `agent-sandbox logs` read what the
runtime really logged. What a container prints besides its server's log (its commands' output goes to the
command's caller, not to the container log) is not there, as on a real cluster.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shutil
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from agent_sandbox.kube import ResourceKind

__all__ = ["LOGS", "ContainerLog", "RoutingHandler", "cri_line", "logs_object"]

LOGS = ResourceKind("kwok.x-k8s.io", "v1alpha1", "Logs", "logs")

_TARGET: ContextVar[ContainerLog | None] = ContextVar("agent_sandbox_pod_log", default=None)


def cri_line(text: str, *, stream: str = "stderr", now: dt.datetime | None = None) -> str:
    """One CRI log line per line of `text` (a full line each: tag `F`), as a container runtime writes them."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return "".join(f"{stamp} {stream} F {line}\n" for line in text.splitlines() or [""])


class ContainerLog:
    """The log files of one container of one pod instance (UID), under `<root>/<ns>_<pod>_<uid>/<container>`."""

    def __init__(self, root: Path, namespace: str, pod: str, uid: str, container: str) -> None:
        self.pod_dir = root / f"{namespace}_{pod}_{uid}"
        self.directory = self.pod_dir / container
        self.container = container
        self.instance = 0

    @property
    def current(self) -> Path:
        return self.directory / f"{self.instance}.log"

    @property
    def previous(self) -> Path | None:
        return self.directory / f"{self.instance - 1}.log" if self.instance > 0 else None

    def start_instance(self, instance: int) -> None:
        """Write to the file of instance `instance` (the container's restart count) from now on."""
        self.instance = instance
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current.touch()

    def write(self, text: str, *, stream: str = "stderr") -> None:
        with self.current.open("a", encoding="utf-8") as f:
            f.write(cri_line(text, stream=stream))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the runtime's log records of this context (and of tasks created in it) to this container."""
        token = _TARGET.set(self)
        try:
            yield
        finally:
            _TARGET.reset(token)

    def remove(self) -> None:
        shutil.rmtree(self.pod_dir, ignore_errors=True)


class RoutingHandler(logging.Handler):
    """Writes each record to the `ContainerLog` active in the context that logged it (none: dropped)."""

    def emit(self, record: logging.LogRecord) -> None:
        target = _TARGET.get()
        if target is None:
            return
        try:
            target.write(self.format(record))
        except Exception:  # a full disk must not break the runtime that logged
            self.handleError(record)


def logs_object(pod: dict[str, Any], log: ContainerLog) -> dict[str, Any]:
    """kwok's `Logs` object for `pod`: its container's current file, and the previous one once it restarted."""
    meta = pod["metadata"]
    entry: dict[str, Any] = {"containers": [log.container], "logsFile": str(log.current)}
    if log.previous is not None:
        entry["previousLogsFile"] = str(log.previous)
    return {
        "apiVersion": f"{LOGS.group}/{LOGS.version}",
        "kind": LOGS.kind,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "spec": {"logs": [entry]},
    }
