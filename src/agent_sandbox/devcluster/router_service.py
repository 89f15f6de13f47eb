"""The dev router behind `sandbox-router-svc`, so upstream's default SDK mode works against `dev up` / `make demo`.

Upstream's SDKs, with no connection config, reach the router by `kubectl port-forward svc/sandbox-router-svc
-n agent-sandbox-system` (Python) or a port-forward to a Pod of that Service (Go). An installed router is such a
Pod; the dev cluster's router is a host process on 127.0.0.1. `expose_router` gives it the same face: a Service
in `agent-sandbox-system` selecting one placeholder Pod (kwok runs it like any Pod: Running and Ready, nothing
inside), and a kwok `PortForward` owned by that Pod that sends its port 8080 to the host router's port. The API
server's `pods/portforward` then reaches kwok, the dev cluster's kubelet, which forwards to the router
(docs/devcluster.md "Kubelet API").

A `sandbox-router-svc` that is not ours (an installed router component) is left alone. Re-exposing after the
router restarted on another port updates the forward.
"""

from __future__ import annotations

import time
from typing import Any

from .cluster import DevCluster
from .install import apply
from .kubelet_api import port_forward_object

__all__ = ["NAMESPACE", "SERVICE", "RouterServiceError", "expose_router", "expose_router_report"]

NAMESPACE = "agent-sandbox-system"
SERVICE = "sandbox-router-svc"
_POD = "sandbox-router-dev"
_PORT = 8080  # the router's Service and container port in upstream's manifests
_MARK = "agent-sandbox.dev/host-router"
_IMAGE = "ghcr.io/agent-sandbox/agent-sandbox-router:dev"  # not a runtime image: the local runner skips it


class RouterServiceError(RuntimeError):
    """The Service could not be put in front of the dev router; the message says why."""


def _documents(selector: dict[str, str]) -> list[dict[str, Any]]:
    labels = {**selector, _MARK: "true"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "selector": selector,
                "ports": [{"name": "http", "port": _PORT, "targetPort": _PORT, "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": _POD, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "automountServiceAccountToken": False,
                "containers": [
                    {"name": "router", "image": _IMAGE, "ports": [{"name": "http", "containerPort": _PORT}]}
                ],
            },
        },
    ]


def expose_router(cluster: DevCluster, *, timeout: float = 30.0) -> None:
    """Point `sandbox-router-svc` at the cluster's running dev router (idempotent).

    Raises:
        RouterServiceError: the Service belongs to something else, the router has no port, or the
            objects could not be written.
    """
    port = cluster.state.extra_ports.get("router_http")
    if not port:
        raise RouterServiceError("the dev router has no port recorded: start it first")
    admin = cluster.admin()
    status, svc = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")
    if status == 200 and (svc["metadata"].get("labels") or {}).get(_MARK) != "true":
        raise RouterServiceError(f"{NAMESPACE}/{SERVICE} exists and is not the dev router's: left alone")
    try:
        apply(cluster, _documents({"app.kubernetes.io/name": _POD}), field_manager="dev-router")
    except RuntimeError as exc:
        raise RouterServiceError(str(exc)) from exc
    deadline = time.monotonic() + timeout
    while True:
        status, pod = admin.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{_POD}")
        if status == 200 and pod["metadata"].get("uid"):
            break
        if time.monotonic() > deadline:
            raise RouterServiceError(f"pod {NAMESPACE}/{_POD} not readable: {status} {pod}")
        time.sleep(0.1)
    forward = port_forward_object(pod, "127.0.0.1", [_PORT], target={_PORT: port})
    try:
        apply(cluster, [forward], field_manager="dev-router")
    except RuntimeError as exc:
        raise RouterServiceError(str(exc)) from exc


def expose_router_report(cluster: DevCluster) -> tuple[bool, str]:
    """`expose_router` for the CLI: (exposed, one line saying so or why not); never raises its error."""
    try:
        expose_router(cluster)
    except RouterServiceError as exc:
        return False, f"router not exposed as svc/{SERVICE} -n {NAMESPACE}: {exc}"
    return True, f"router also behind svc/{SERVICE} -n {NAMESPACE} (kubectl port-forward works)"
