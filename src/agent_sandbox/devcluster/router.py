"""The Sandbox Router in a dev cluster (`agent-sandbox dev up --router`, `dev router-url`).

Runs the real `agent-sandbox-router` process against the cluster's loopback API server, owned by the
cluster (`dev down` stops it). Dev settings: the Pod cache on (cluster-wide), `--allow-loopback-pod-ip`
because every pod IP here is in 127.0.0.0/8 — with the cache on, a loopback `X-Sandbox-Pod-IP` is
accepted only when it is a sandbox pod's (docs/router.md), so the router cannot be pointed at the API
server or any other local process. All listeners bind 127.0.0.1 on ports recorded in the cluster state.

The router is started by command name (`agent-sandbox-router` next to the running Python, else
`python -m agent_sandbox.router`), so this package does not import the router (layering).

Identity: the router authenticates as the controller does (`identity`, `AGENT_SANDBOX_CONTROLLER_IDENTITY`):
the cluster admin by default, or with `serviceaccount` (CI) as the install's `agent-sandbox-system/sandbox-router`
with a service-account token, RBAC on, holding exactly the grants the router components render
(`kubectl kustomize` of an overlay with `k8s/router`, plus `k8s/router/lifecycle` for `--sandbox-lifecycle` and
`k8s/router/tokenreview` for `--authz-mode=tokenreview`). So the suite proves the shipped router RBAC enough for
the Pod cache, the claimed-member lookup, resume on request, activity writes and TokenReview. Grants are only
ever added: routers with and without lifecycle share the ServiceAccount on a shared cluster, and a router
started without a component keeps the grants an earlier one applied.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from agent_sandbox.manifests import REPO_ROOT

from .cluster import DevCluster
from .identity import chosen_identity
from .install import apply, kustomize, token_kubeconfig
from .lifecycle import install_lifecycle, lifecycle_requested
from .processes import Started, is_ours, wait_ready

__all__ = [
    "DEV_ROUTER_FLAGS",
    "ROUTER",
    "ROUTER_NAMESPACE",
    "ROUTER_SERVICE_ACCOUNT",
    "install_router_rbac",
    "router_argv",
    "router_components",
    "router_kubeconfig",
    "router_url",
    "start_router",
]

ROUTER = "sandbox-router"
#: What `dev up --router` and `make demo` add to the router's flags: h2c, so that sandboxd's gRPC process API
#: (the SDKs' `Sandboxd*ConnectionConfig`) works through the dev router as well as the legacy runtime.
DEV_ROUTER_FLAGS = ("--enable-h2c",)
_PORTS = ("router_http", "router_metrics", "router_health")


ROUTER_NAMESPACE = "agent-sandbox-system"
ROUTER_SERVICE_ACCOUNT = "sandbox-router"
_RBAC_KINDS = frozenset({"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"})


def router_components(argv: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The `k8s/` components an install of a router with these flags uses (paths relative to `k8s/`)."""
    components = ["router"]
    if lifecycle_requested(argv):
        components.append("router/lifecycle")
    args = list(argv)
    modes = [a.split("=", 1)[1] for a in args if a.startswith("--authz-mode=")]
    modes += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--authz-mode"]
    if "tokenreview" in modes:
        components.append("router/tokenreview")
    return tuple(components)


_rendered: dict[tuple[Path, tuple[str, ...]], list[dict[str, Any]]] = {}


def _router_rbac(cluster: DevCluster, components: tuple[str, ...]) -> list[dict[str, Any]]:
    """The Namespace and the router's identity objects (`sandbox-router*`) of `k8s/` with `components`, as
    `kubectl kustomize` renders them from an overlay (written into the cluster directory). Rendered once per
    process (about a second each: the overlay renders the whole install, CRDs included)."""
    key = (cluster.directory, components)
    if key not in _rendered:
        _rendered[key] = _render_router_rbac(cluster, components)
    return _rendered[key]


def _render_router_rbac(cluster: DevCluster, components: tuple[str, ...]) -> list[dict[str, Any]]:
    overlay = cluster.directory / "router-rbac" / "-".join(c.replace("/", "_") for c in components)
    overlay.mkdir(parents=True, exist_ok=True)
    k8s = REPO_ROOT / "k8s"
    lines = [
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        f"resources: [{os.path.relpath(k8s, overlay)}]",
        f"components: [{', '.join(os.path.relpath(k8s / c, overlay) for c in components)}]",
    ]
    (overlay / "kustomization.yaml").write_text("\n".join(lines) + "\n")
    return [
        d
        for d in kustomize(cluster, overlay)
        if (d["kind"] == "Namespace" and d["metadata"]["name"] == ROUTER_NAMESPACE)
        or (d["kind"] in _RBAC_KINDS and str(d["metadata"]["name"]).startswith(ROUTER_SERVICE_ACCOUNT))
    ]


def install_router_rbac(cluster: DevCluster, components: tuple[str, ...] = ("router",)) -> None:
    """Apply the router's ServiceAccount and RBAC as `kubectl apply -k` of an overlay with `components`."""
    apply(cluster, _router_rbac(cluster, components), field_manager="agent-sandbox-router-identity")


def router_kubeconfig(
    cluster: DevCluster, argv: tuple[str, ...] | list[str] = (), identity: str | None = None
) -> Path:
    """The kubeconfig a dev router with flags `argv` uses (`identity` defaults to `$AGENT_SANDBOX_CONTROLLER_IDENTITY`).

    `admin`: the cluster's admin kubeconfig. `serviceaccount`: `agent-sandbox-system/sandbox-router` with the
    grants of the router components its flags need (module docstring), a fresh token each call.

    Raises:
        ValueError: an unknown identity.
        InstallError: the RBAC or the token could not be installed.
    """
    if chosen_identity(identity) == "admin":
        return cluster.kubeconfig
    install_router_rbac(cluster, router_components(argv))
    # Written aside and renamed, so a router reading the file meanwhile sees the old or the new one whole.
    path = cluster.directory / f"{ROUTER_SERVICE_ACCOUNT}.kubeconfig"
    fresh = token_kubeconfig(
        cluster, ROUTER_NAMESPACE, ROUTER_SERVICE_ACCOUNT, path.with_suffix(f".{os.getpid()}.new")
    )
    fresh.replace(path)
    return path


def router_argv(cluster: DevCluster, *, extra: tuple[str, ...] = ()) -> list[str]:
    """argv of the router in dev mode (reserves its ports in the cluster state)."""
    script = Path(sys.executable).with_name("agent-sandbox-router")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "agent_sandbox.router"]
    http, metrics, health = (cluster.reserve_port(name) for name in _PORTS)
    return [
        *base,
        # The admin, or (AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount) the install's router ServiceAccount.
        f"--kubeconfig={router_kubeconfig(cluster, extra)}",
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
