"""The Sandbox Router in a dev cluster (`agent-sandbox dev up --router`, `dev router-url`).

Runs the real `agent-sandbox-router` process against the cluster's loopback API server, owned by the
cluster (`dev down` stops it). Dev settings: the Pod cache on (cluster-wide), `--allow-loopback-pod-ip`
because every pod IP here is in 127.0.0.0/8 — with the cache on, a loopback `X-Sandbox-Pod-IP` is
accepted only when it is a sandbox pod's (docs/router.md), so the router cannot be pointed at the API
server or any other local process. All listeners bind 127.0.0.1 on ports recorded in the cluster state.

The router is started by command name (`agent-sandbox-router` next to the running Python, else
`python -m agent_sandbox.router`), so this package does not import the router (layering).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .cluster import DevCluster
from .lifecycle import install_lifecycle, lifecycle_requested
from .processes import Started, is_ours, wait_ready

__all__ = ["DEV_ROUTER_FLAGS", "ROUTER", "router_argv", "router_url", "start_router"]

ROUTER = "sandbox-router"
#: What `dev up --router` and `make demo` add to the router's flags: h2c, so that sandboxd's gRPC process API
#: (the SDKs' `Sandboxd*ConnectionConfig`) works through the dev router as well as the legacy runtime.
DEV_ROUTER_FLAGS = ("--enable-h2c",)
_PORTS = ("router_http", "router_metrics", "router_health")


def router_argv(cluster: DevCluster, *, extra: tuple[str, ...] = ()) -> list[str]:
    """argv of the router in dev mode (reserves its ports in the cluster state)."""
    script = Path(sys.executable).with_name("agent-sandbox-router")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "agent_sandbox.router"]
    http, metrics, health = (cluster.reserve_port(name) for name in _PORTS)
    return [
        *base,
        f"--kubeconfig={cluster.kubeconfig}",
        "--cache-enabled",
        "--allow-loopback-pod-ip",
        f"--http-bind-address=127.0.0.1:{http}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        f"--health-probe-bind-address=127.0.0.1:{health}",
        *extra,
    ]


def start_router(cluster: DevCluster, *, extra: tuple[str, ...] = (), timeout: float = 90.0) -> Started:
    """Start the router for `cluster` and wait until its `/readyz` answers (its Pod cache has synced).

    Raises:
        ComponentError: the router exited or did not become ready in time (with its last log lines).
    """
    if lifecycle_requested(extra):
        install_lifecycle(cluster)
    started = cluster.add_process(ROUTER, router_argv(cluster, extra=extra))
    health = cluster.state.extra_ports["router_health"]
    wait_ready(started, f"http://127.0.0.1:{health}/readyz", deadline=time.monotonic() + timeout)
    return started


def router_url(cluster: DevCluster) -> str | None:
    """The base URL of the cluster's running router, or None when it has none."""
    port = cluster.state.extra_ports.get("router_http")
    running = any(s.name == ROUTER and is_ours(s.pid, s.exe) for s in cluster.state.started)
    return f"http://127.0.0.1:{port}" if port and running else None
