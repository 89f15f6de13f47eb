"""A dev cluster for the Go SDK's end-to-end tests (clients/go/e2e): control plane + local runner +
controller + router, as the Python suite's fixtures start them, plus a namespace with warm pools.

Run from the repository root: `.venv/bin/python -m tests.go_sdk_cluster`. It prints one JSON line once
everything is ready, then keeps the cluster up until its standard input closes (the Go TestMain holds the
pipe, so a crashed test binary still tears the cluster down) or it gets SIGTERM/SIGINT. Any failure to start
exits non-zero with the error on stderr, and the Go suite fails.

JSON: {"name", "kubeconfig", "router_url", "namespace", "warm_pool", "cold_pool", "image"}
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from types import FrameType

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import is_ours
from agent_sandbox.devcluster.rest import AdminRest, probe_http
from tests.helpers import wait_for

EXT = "extensions.agents.x-k8s.io/v1beta1"
#: An image the local runner serves with `agent-sandbox-runtime` (legacy :8888, sandboxd :8080/:9090).
RUNTIME_IMAGE = "ghcr.io/agent-sandbox/agent-sandbox-runtime:dev"
NAMESPACE = "go-e2e"
WARM_POOL = "warm"  # replicas 2: claims adopt a ready member
COLD_POOL = "cold"  # replicas 0: every claim cold-starts a sandbox


def _router(cluster: DevCluster) -> str:
    """Start `agent-sandbox-router` on loopback (pod IPs are 127.x, so loopback targets are allowed), with the
    Pod cache as the installed router runs (k8s/router): an `X-Sandbox-Pod-IP` that is not the Sandbox's pod
    is refused, not dialled (the address of a suspended sandbox's pod may belong to another one by then)."""
    script = os.path.join(os.path.dirname(sys.executable), "agent-sandbox-router")
    port, probe, metrics = (cluster.reserve_port(f"router_{n}") for n in ("http", "probe", "metrics"))
    started = cluster.add_process(
        "agent-sandbox-router",
        [
            script,
            f"--http-bind-address=127.0.0.1:{port}",
            f"--health-probe-bind-address=127.0.0.1:{probe}",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            "--allow-loopback-pod-ip",
            "--cache-enabled",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
    )
    deadline = time.monotonic() + 60
    while not probe_http(f"http://127.0.0.1:{probe}/readyz"):
        if not is_ours(started.pid, started.exe) or time.monotonic() > deadline:
            raise RuntimeError(f"router did not become ready; log: {started.log}")
        time.sleep(0.1)
    return f"http://127.0.0.1:{port}"


def _apply(cluster: DevCluster) -> None:
    admin = cluster.admin()
    status, body = admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    if status not in (201, 409):
        raise RuntimeError(f"namespace: {status} {body}")
    pod_spec = {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}
    objects = [
        ("sandboxtemplates", {"kind": "SandboxTemplate", "metadata": {"name": "runtime"},
                              "spec": {"podTemplate": {"spec": pod_spec}, "envVarsInjectionPolicy": "Allowed"}}),
        ("sandboxwarmpools", {"kind": "SandboxWarmPool", "metadata": {"name": WARM_POOL},
                              "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "runtime"}}}),
        ("sandboxwarmpools", {"kind": "SandboxWarmPool", "metadata": {"name": COLD_POOL},
                              "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "runtime"}}}),
    ]  # fmt: skip
    for plural, obj in objects:
        status, body = admin.request(
            "POST", f"/apis/{EXT}/namespaces/{NAMESPACE}/{plural}", {"apiVersion": EXT, **obj}
        )
        if status not in (201, 409):
            raise RuntimeError(f"{plural}: {status} {body}")
    # The SDK gives up on WarmPoolNotFound at once (upstream's rule), so the controller must have seen the
    # pools before any test claims from them: wait until each is processed and the warm one is full.
    for pool, ready in ((WARM_POOL, 2), (COLD_POOL, 0)):
        wait_for(lambda p=pool, r=ready: _pool_settled(admin, p, r), what=f"warm pool {pool}", timeout=120)


def _pool_settled(admin: AdminRest, pool: str, ready: int) -> bool:
    status, body = admin.request("GET", f"/apis/{EXT}/namespaces/{NAMESPACE}/sandboxwarmpools/{pool}")
    if status != 200:
        return False
    st = body.get("status") or {}
    return bool(
        st.get("observedGeneration", 0) >= body["metadata"].get("generation", 1)
        and st.get("readyReplicas", 0) >= ready
    )


def main() -> int:
    name = f"go-e2e-{os.getpid()}"
    cluster = DevCluster.up(ClusterConfig(name=name, nodes=1))
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        start_controller(cluster)
        router_url = _router(cluster)
        _apply(cluster)
        info = {
            "name": name,
            "kubeconfig": str(cluster.kubeconfig),
            "router_url": router_url,
            "namespace": NAMESPACE,
            "warm_pool": WARM_POOL,
            "cold_pool": COLD_POOL,
            "image": RUNTIME_IMAGE,
        }
        print(json.dumps(info), flush=True)
        # until the Go side closes our stdin (or dies), or a signal
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        stop.wait()
        return 0
    finally:
        cluster.down(quiet=True)


if __name__ == "__main__":
    sys.exit(main())
