"""Fault injection on a running dev cluster: restart one control-plane component in place.

Owns: `restart_component` (stop etcd or kube-apiserver, optionally stay down a while, start it again with
the recorded argv: same ports, same data directory, same certificates) and the readiness probe of each
restartable component. Clients keep their kubeconfigs: the API server comes back at the same URL with
the same serving certificate, and ServiceAccount tokens stay valid (same signing key).

What a restart does to clients is the point of the exercise: watches break, requests fail with
connection errors or 5xx while the component is down, and (API server restart) the new watch cache
starts at the current resourceVersion, so a client resuming an older one gets 410 Gone and relists.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.processes import Started, component_error, is_ours, log_tail, stop
from agent_sandbox.devcluster.rest import probe_http
from agent_sandbox.devcluster.state import ClusterError

__all__ = ["RESTARTABLE", "Restart", "restart_component"]


def _etcd_ready(cluster: DevCluster) -> bool:
    return probe_http(f"http://127.0.0.1:{cluster.state.ports['etcd_client']}/health")


def _apiserver_ready(cluster: DevCluster) -> bool:
    try:
        return cluster.admin().request("GET", "/readyz", timeout=3)[0] == 200
    except OSError:
        return False


RESTARTABLE: dict[str, Callable[[DevCluster], bool]] = {
    "etcd": _etcd_ready,
    "kube-apiserver": _apiserver_ready,
}


@dataclass(frozen=True, slots=True)
class Restart:
    """What one restart did: when the old process stopped, when the new one was ready (monotonic)."""

    component: str
    old_pid: int
    new: Started
    stopped_at: float
    ready_at: float

    @property
    def outage_s(self) -> float:
        return self.ready_at - self.stopped_at


def restart_component(
    cluster: DevCluster,
    component: str,
    *,
    kill: bool = False,
    down_for: float = 0.0,
    timeout: float = 90.0,
) -> Restart:
    """Stop `component` (SIGTERM, or SIGKILL with `kill`), wait `down_for` s, start it again, wait until ready.

    Raises:
        ClusterError: unknown component, not running, or not ready again within `timeout`.
    """
    ready = RESTARTABLE.get(component)
    if ready is None:
        raise ClusterError(f"cannot restart {component!r}; restartable: {', '.join(RESTARTABLE)}")
    old = next((s for s in reversed(cluster.state.started) if s.name == component), None)
    if old is None or not is_ours(old.pid, old.exe):
        raise ClusterError(f"{component} is not running in cluster {cluster.name!r}")
    if kill:
        os.kill(old.pid, signal.SIGKILL)
    stop(old)  # SIGTERM and wait (after a SIGKILL: just reaps)
    stopped_at = time.monotonic()
    if down_for > 0:
        time.sleep(down_for)
    new = cluster.respawn(component)
    deadline = time.monotonic() + timeout
    while not ready(cluster):
        if not is_ours(new.pid, new.exe):
            if "address already in use" in log_tail(new.log, 3) and time.monotonic() < deadline:
                # A client took the port while the listener was down (clusters listen below the
                # ephemeral range to avoid this, allocation._listen_ports); such sockets are short-lived.
                time.sleep(0.5)
                new = cluster.respawn(component)
                continue
            raise ClusterError(str(component_error(component, new.log, "exited after the restart")))
        if time.monotonic() > deadline:
            raise ClusterError(
                str(component_error(component, new.log, f"not ready {timeout:.0f}s after the restart"))
            )
        time.sleep(0.05)
    return Restart(component, old.pid, new, stopped_at, time.monotonic())
