"""Fixtures for the SDK against the real control plane: the router, a template and warm pool per test
(the controller fixture is tests/integration/conftest.py's)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import stop, wait_ready
from tests.helpers import signals_as_from_a_shell
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE

__all__ = ["EXT", "RUNTIME_IMAGE", "apply_pool", "cli_proxy", "router", "router_process"]

EXT = "extensions.agents.x-k8s.io/v1beta1"


@pytest.fixture(scope="module")
def router(cluster: DevCluster) -> Iterator[str]:
    """The dev cluster's router (h2c on for sandboxd's gRPC), its URL; stopped by PID afterwards."""
    from agent_sandbox.devcluster.router import router_url, start_router

    started = start_router(cluster, extra=("--enable-h2c",))
    try:
        url = router_url(cluster)
        assert url is not None
        yield url
    finally:
        stop(started)


@contextmanager
def router_process(cluster: DevCluster, name: str, http_bind: str, *flags: str) -> Iterator[int]:
    """A router of its own (Pod cache on, loopback pod IPs as a sandbox's) listening on `http_bind`, owned by
    the cluster, Ready; yields its metrics port. Stopped by PID afterwards. It runs as the dev routers do: the
    install's `sandbox-router` ServiceAccount, with the grants its flags need, under
    `AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount` (CI), so the shipped RBAC is what these tests exercise."""
    from agent_sandbox.devcluster.router import router_kubeconfig

    health = cluster.reserve_port(f"{name}_health")
    metrics = cluster.reserve_port(f"{name}_metrics")
    router_flags = ["--cache-enabled", "--allow-loopback-pod-ip", *flags]
    kubeconfig = router_kubeconfig(cluster, router_flags)
    argv = [
        sys.executable, "-m", "agent_sandbox.router", f"--kubeconfig={kubeconfig}", *router_flags,
        f"--http-bind-address={http_bind}",
        f"--metrics-bind-address=127.0.0.1:{metrics}", f"--health-probe-bind-address=127.0.0.1:{health}",
    ]  # fmt: skip
    started = cluster.add_process(name.replace("_", "-"), argv)
    try:
        wait_ready(started, f"http://127.0.0.1:{health}/readyz", deadline=time.monotonic() + 90)
        yield metrics
    finally:
        stop(started)


def apply_pool(
    cluster: DevCluster, namespace: str, *, pool: str = "pool", replicas: int = 2, **pod: object
) -> None:
    """A SandboxTemplate `tmpl` and a warm pool `pool` on it, created through the admin REST client."""
    spec = {"containers": [{"name": "main", "image": "busybox"}], **pod}  # `containers=` overrides
    admin = cluster.admin()
    for plural, body in (
        ("sandboxtemplates", {"apiVersion": EXT, "kind": "SandboxTemplate", "metadata": {"name": "tmpl"},
                              "spec": {"podTemplate": {"spec": spec}}}),
        ("sandboxwarmpools", {"apiVersion": EXT, "kind": "SandboxWarmPool", "metadata": {"name": pool},
                              "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "tmpl"}}}),
    ):  # fmt: skip
        status, out = admin.request("POST", f"/apis/{EXT}/namespaces/{namespace}/{plural}", body)
        assert status in (201, 409), out


@contextmanager
def cli_proxy(cluster: DevCluster, router: str, namespace: str, claim: str, port: int) -> Iterator[str]:
    """`agent-sandbox proxy` running; its printed local URL."""
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("agent-sandbox")),
            "proxy",
            claim,
            str(port),
            "-n",
            namespace,
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--router-url",
            router,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=signals_as_from_a_shell,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (
            url,
            proc.stderr.read() if proc.poll() is not None else "",
        )
        yield url
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
