"""The runtime of one pod instance in the local runner: what it runs, where, and its state (runner.py).

One `PodRuntime` per pod UID: the container's spec as the runner built it (`runtime_pods.RuntimePod`), its
workspace (the PVC's directory or a per-pod one), the `RuntimeServer` serving it, its health, restarts and the
files a kubelet keeps for it (the downward API projection of the claim env, the container log).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV
from agent_sandbox.devcluster.kubelet_api import ContainerLog
from agent_sandbox.devcluster.runtime_pods import RuntimePod
from agent_sandbox.runtime import RuntimeServer

__all__ = ["PodRuntime", "logging_to", "project_claim_env", "runtime_ports"]


@dataclass
class PodRuntime:
    """The runtime of one pod instance (one UID) in this process."""

    namespace: str
    name: str
    uid: str
    ip: str
    spec: RuntimePod
    workspace: Path
    owned_workspace: bool
    server: RuntimeServer | None = None
    healthy: bool = False
    restarts: int = 0
    state: str = "starting"
    message: str = ""
    not_before: float = 0.0  # monotonic time before which it is not (re)started
    started_at: str = ""
    claim_env_file: Path | None = None  # host file of the downward API projection of the claim env
    # The runtime container's log files (kubelet_api.py), when the runner keeps them.
    log: ContainerLog | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "pod": self.name,
            "uid": self.uid,
            "ip": self.ip,
            "state": self.state,
            "ready": self.healthy,
            "restarts": self.restarts,
            "message": self.message,
            "workspace": str(self.workspace),
            "claim": self.spec.claim,
            "ports": dict(self.server.ports) if self.server else {},
            "processes": self.server.state.supervisor.running if self.server else 0,
        }


def project_claim_env(path: Path, pod: Mapping[str, Any]) -> None:
    """Keep the downward API file of the claim env annotation current, as a kubelet does (atomic swap).

    A missing annotation is an empty file (the kubelet writes "" for an absent key).
    """
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_CLAIM_ENV, "")
    data = str(value).encode()
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def runtime_ports(rt: PodRuntime) -> list[int]:
    config = rt.spec.config
    return [port for port in (config.legacy_port, config.rest_port, config.grpc_port) if port]


def logging_to(rt: PodRuntime) -> contextlib.AbstractContextManager[None]:
    return rt.log.active() if rt.log is not None else contextlib.nullcontext()
