"""The controller under fault: start it, SIGKILL it, start it again, or run replicas with leader election.

Owns: starting the dev-mode controller with the rendered RBAC only (ServiceAccount identity), a crash
(SIGKILL, no drain) and a restart with the exact same argv (same webhook URL, so the start-up CRD patch is
a no-op as after a real crash), and `Replica`s: controllers with leader election on, each with a token of
its own (the audit log's credential ID tells their writes apart) and its own ports.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import CONTROLLER, controller_argv, install_crds, start_controller
from agent_sandbox.devcluster.identity import CONTROLLER_NAMESPACE, IDENTITY_ENV, install_controller_rbac
from agent_sandbox.devcluster.install import token_kubeconfig
from agent_sandbox.devcluster.processes import Started, is_ours, stop, wait_ready
from agent_sandbox.manifests import CONTROLLER_NAME

__all__ = [
    "LEASE_NAME",
    "Replica",
    "as_serviceaccount",
    "health_port",
    "recorded_argv",
    "respawn",
    "sigkill",
    "start",
    "start_replica",
]

LEASE_NAME = "a3317529.agent-sandbox.x-k8s.io"


@contextlib.contextmanager
def as_serviceaccount() -> Iterator[None]:
    """Controllers started inside run as the install's ServiceAccount (the rendered RBAC, nothing more)."""
    before = os.environ.get(IDENTITY_ENV)
    os.environ[IDENTITY_ENV] = "serviceaccount"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(IDENTITY_ENV, None)
        else:
            os.environ[IDENTITY_ENV] = before


def start(cluster: DevCluster, *, extra: tuple[str, ...] = ()) -> Started:
    """Install the CRDs and start the controller (all controllers, leader election off); waits for /readyz."""
    return start_controller(cluster, extra=extra)


def recorded_argv(cluster: DevCluster, started: Started) -> list[str]:
    """The argv the cluster recorded for a process it started."""
    entry = next(p for p in cluster.state.processes if p["pid"] == started.pid)
    return [str(a) for a in entry["argv"]]


def health_port(argv: list[str]) -> int:
    return int(next(a.rsplit(":", 1)[1] for a in argv if a.startswith("--health-probe-bind-address=")))


def sigkill(started: Started) -> float:
    """Kill the process with SIGKILL (no drain, no lease release) and reap it; returns when (epoch)."""
    assert is_ours(started.pid, started.exe), f"pid {started.pid} is not the controller we started"
    os.kill(started.pid, signal.SIGKILL)
    at = time.time()
    stop(started)
    return at


def respawn(cluster: DevCluster, *, timeout: float = 60.0) -> Started:
    """Start the last controller again with its exact argv and environment; waits for /readyz."""
    new = cluster.respawn(CONTROLLER)
    port = health_port(recorded_argv(cluster, new))
    wait_ready(new, f"http://127.0.0.1:{port}/readyz", deadline=time.monotonic() + timeout)
    return new


def _jti(token: str) -> str:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims.get("jti") or "")


@dataclass
class Replica:
    """One controller replica with leader election on."""

    name: str
    started: Started
    credential: str  # the audit log's credential ID of its token ("JTI=...")
    metrics_port: int
    health_port: int

    def metric(self, prefix: str) -> float | None:
        """The value of the first /metrics sample line starting with `prefix` (None if unreachable)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except (OSError, urllib.error.URLError):
            return None
        for line in text.splitlines():
            if line.startswith(prefix + " "):
                return float(line.split()[-1])
        return None

    @property
    def leading(self) -> bool:
        return self.metric(f'leader_election_master_status{{name="{LEASE_NAME}"}}') == 1.0

    def alive(self) -> bool:
        return is_ours(self.started.pid, self.started.exe)


def start_replica(
    cluster: DevCluster, name: str, *, lease_namespace: str, extra: tuple[str, ...] = ()
) -> Replica:
    """Start a replica with leader election on, a token of its own, and no conversion webhook.

    The webhook is off so replicas do not take turns re-pointing the CRDs at themselves (each change makes
    the API server rebuild the CRDs' storage and expire every watch); the suite writes v1beta1 only, the
    storage version, so nothing needs converting.
    """
    install_crds(cluster)
    install_controller_rbac(cluster)
    kubeconfig = token_kubeconfig(
        cluster, CONTROLLER_NAMESPACE, CONTROLLER_NAME, cluster.directory / f"replica-{name}.kubeconfig"
    )
    token = _kubeconfig_token(kubeconfig)
    argv = controller_argv(
        cluster,
        extra=(
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=true",
            f"--leader-election-namespace={lease_namespace}",
            "--enable-webhook=false",
            *extra,
        ),
    )
    started = cluster.add_process(CONTROLLER, argv)
    health = health_port(argv)
    metrics = int(next(a.rsplit(":", 1)[1] for a in argv if a.startswith("--metrics-bind-address=")))
    wait_ready(started, f"http://127.0.0.1:{health}/healthz", deadline=time.monotonic() + 60)
    return Replica(name, started, f"JTI={_jti(token)}", metrics, health)


def _kubeconfig_token(path: Path) -> str:
    doc = yaml.safe_load(path.read_text())
    return str(doc["users"][0]["user"]["token"])
