"""The kubelet API of runtime pods - container logs and port-forward - served through the API server by kwok.

A kubelet keeps each container's output in `<ns>_<pod>_<uid>/<container>/<restart>.log` (CRI log format)
and serves it on `/containerLogs`; it forwards `/portForward` streams into the pod's network namespace. The
API server's `pods/log` and `pods/portforward` proxy to those endpoints. On the dev cluster kwok is the
kubelet (its server on the nodes' kubelet port), and it serves what kwok objects name: `Logs` (files) and
`PortForward` (a target address per port). A runtime pod's runtime runs inside the local runner, so the
runner provides both:

* `ContainerLog` is one container's files: one per instance (a simulated crash starts the next), CRI lines
  (`<RFC 3339 nano> stderr F <text>`), the previous instance's file kept for `--previous`.
* `RoutingHandler` writes the records the runtime logs while serving a pod (`agent_sandbox.runtime.*`:
  its start line, errors, draining) to that pod's file. The pod is found by a context variable that
  `ContainerLog.active()` sets around `RuntimeServer.start()` / `stop()`: the listeners and every request
  task they spawn inherit the context they were created in.
* `logs_object` and `port_forward_object` are the kwok objects (kwok.x-k8s.io/v1alpha1, named like the
  pod, owned by it so the garbage collector removes them with the pod): the log files, and each runtime
  port forwarded to the same port on the pod's IP, where the runtime listens.

So `kubectl logs` (`--previous`), the SDK's `get_logs`, `agent-sandbox logs`, `kubectl port-forward
pod/<pod>` and the SDKs' pod tunnel modes work as on a real cluster. What a container prints besides its
server's log (a command's output goes to the command's caller) is not in the log, as on a real cluster.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from agent_sandbox.kube import ResourceKind

__all__ = [
    "LOGS",
    "PORT_FORWARD",
    "ContainerLog",
    "RoutingHandler",
    "cri_line",
    "logs_object",
    "port_forward_object",
]

LOGS = ResourceKind("kwok.x-k8s.io", "v1alpha1", "Logs", "logs")
PORT_FORWARD = ResourceKind("kwok.x-k8s.io", "v1alpha1", "PortForward", "portforwards")

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


def _owned_by(pod: Mapping[str, Any], kind: ResourceKind, spec: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "spec": spec,
    }


def logs_object(pod: Mapping[str, Any], log: ContainerLog) -> dict[str, Any]:
    """kwok's `Logs` object for `pod`: its container's current file, and the previous one once it restarted."""
    entry: dict[str, Any] = {"containers": [log.container], "logsFile": str(log.current)}
    if log.previous is not None:
        entry["previousLogsFile"] = str(log.previous)
    return _owned_by(pod, LOGS, {"logs": [entry]})


def port_forward_object(
    pod: Mapping[str, Any], ip: str, ports: Iterable[int], *, target: Mapping[int, int] | None = None
) -> dict[str, Any]:
    """kwok's `PortForward` object for `pod`: each port to the same port on `ip`, or to `target[port]` (others:
    refused by kwok)."""
    forwards = [
        {"ports": [port], "target": {"address": ip, "port": (target or {}).get(port, port)}}
        for port in sorted(set(ports))
    ]
    return _owned_by(pod, PORT_FORWARD, {"forwards": forwards})
