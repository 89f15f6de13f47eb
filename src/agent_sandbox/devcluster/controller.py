"""Run the project's controller from the working tree against a dev cluster (`dev up --controller`).

Owns: installing `k8s/crds/`, choosing loopback ports for the controller's listeners, the controller's argv
in dev mode, and waiting for its `/readyz`. The controller process is recorded in the cluster state, so
`dev down` stops it by PID like every other component.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

from agent_sandbox.api.kinds import ALL_KINDS, ResourceKind
from agent_sandbox.devcluster.cluster import DevCluster
from agent_sandbox.devcluster.identity import controller_kubeconfig, grant_leader_election
from agent_sandbox.devcluster.lifecycle import install_lifecycle, lifecycle_requested
from agent_sandbox.devcluster.processes import Started, component_error, is_ours, wait_ready
from agent_sandbox.devcluster.rest import AdminRest

CONTROLLER = "agent-sandbox-controller"
CONTROLLER_SRC_ENV = "AGENT_SANDBOX_CONTROLLER_SRC"


def repo_root() -> Path:
    """The source checkout this package runs from (src layout: <root>/src/agent_sandbox/...)."""
    return Path(__file__).resolve().parents[3]


def crd_dir() -> Path:
    return repo_root() / "k8s" / "crds"


def install_crds(cluster: DevCluster) -> None:
    """Server-side apply every CRD in k8s/crds/ and wait until they are Established.

    Idempotent on a shared cluster: a CRD whose conversion webhook a running controller (or test) has
    already pointed at a loopback URL keeps that clientConfig, because the checked-in service reference
    cannot be merged with a `url` (the API server rejects a clientConfig holding both).
    """
    paths = sorted(crd_dir().glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no CRDs found in {crd_dir()} (run `agent-sandbox generate`)")
    docs = [yaml.safe_load(p.read_text()) for p in paths]
    for doc in docs:
        status, live = cluster.admin().request(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}"
        )
        live_cfg = (live or {}).get("spec", {}).get("conversion", {}).get("webhook", {}).get("clientConfig")
        if status == 200 and live_cfg and "url" in live_cfg:
            doc["spec"]["conversion"]["webhook"]["clientConfig"] = live_cfg
    bundle = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    out = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=bundle)
    if out.returncode != 0:
        raise RuntimeError(f"installing CRDs failed:\n{out.stderr}")
    cluster.admin().wait_crds_established(doc["metadata"]["name"] for doc in docs)


_PORT_NAMES = ("controller_metrics", "controller_health", "controller_webhook")


def _controller_ports(cluster: DevCluster) -> tuple[int, int, int]:
    """Ports for a controller: the previous ones when no controller of this cluster is running.

    Reusing them on a restart keeps the conversion webhook URL, so the start-up CRD patch is a no-op (as
    after a real crash) instead of making the API server rebuild the CRDs' storage and expire every
    open watch with 410. A second concurrent controller (leader-election tests) gets fresh ports.
    """
    live = any(s.name == CONTROLLER and is_ours(s.pid, s.exe) for s in cluster.state.started)
    ports = cluster.state.extra_ports
    if not live and all(name in ports for name in _PORT_NAMES):
        return ports["controller_metrics"], ports["controller_health"], ports["controller_webhook"]
    return (
        cluster.reserve_port("controller_metrics"),
        cluster.reserve_port("controller_health"),
        cluster.reserve_port("controller_webhook"),
    )


def other_source() -> str | None:
    """`AGENT_SANDBOX_CONTROLLER_SRC`: another checkout's `src` to run the controller from.

    For a same-harness A/B of two versions of the controller (docs/design/claim-cycle-writes.md): the cluster,
    the CRDs and the load generator stay this checkout's, only the controller process imports the other code.
    """
    return os.environ.get(CONTROLLER_SRC_ENV) or None


def controller_argv(
    cluster: DevCluster, *, extensions: bool = True, extra: tuple[str, ...] = ()
) -> list[str]:
    """argv of the controller in dev mode: loopback listeners, conversion webhook by URL."""
    script = Path(sys.executable).with_name(CONTROLLER)
    base = (
        [str(script)]
        if script.exists() and not other_source()
        else [sys.executable, "-m", "agent_sandbox.controllers.main"]
    )
    metrics, health, webhook = _controller_ports(cluster)
    argv = [
        *base,
        # The admin, or (AGENT_SANDBOX_CONTROLLER_IDENTITY=serviceaccount) the install's ServiceAccount.
        f"--kubeconfig={controller_kubeconfig(cluster)}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        f"--health-probe-bind-address=127.0.0.1:{health}",
        f"--webhook-port={webhook}",
        f"--webhook-cert-dir={cluster.directory / 'webhook-certs'}",
        "--leader-elect=false",
    ]
    if extensions:
        argv.append("--extensions")
    grant_lease_namespace(cluster, extra)
    return [*argv, *extra]


def grant_lease_namespace(cluster: DevCluster, args: tuple[str, ...] | list[str]) -> None:
    """The install grants Leases only in its own namespace; a controller electing elsewhere
    (`--leader-election-namespace` in `args`: the tests use their own namespace) gets the same Role there, as
    docs/install.md tells an admin to do."""
    for arg in args:
        if arg.startswith("--leader-election-namespace="):
            namespace = arg.split("=", 1)[1]
            if namespace:
                grant_leader_election(cluster, namespace)


def start_controller(
    cluster: DevCluster, *, extensions: bool = True, extra: tuple[str, ...] = (), timeout: float = 60.0
) -> Started:
    """Install CRDs, start the controller, wait for its /readyz."""
    install_crds(cluster)
    if lifecycle_requested(extra):
        install_lifecycle(cluster)
    argv = controller_argv(cluster, extensions=extensions, extra=extra)
    webhook = cluster.state.extra_ports["controller_webhook"]
    # Endpoints reject loopback IPs, so in the dev cluster the CRDs reach the conversion webhook by URL.
    env = {"AGENT_SANDBOX_WEBHOOK_URL": f"https://127.0.0.1:{webhook}/convert"}
    if src := other_source():
        env["PYTHONPATH"] = src
    started = cluster.add_process(CONTROLLER, argv, env=env)
    health = cluster.state.extra_ports["controller_health"]
    deadline = time.monotonic() + timeout
    wait_ready(started, f"http://127.0.0.1:{health}/readyz", deadline=deadline)
    if "--enable-webhook=false" not in extra:
        wait_crds_serving(cluster, env["AGENT_SANDBOX_WEBHOOK_URL"], deadline=deadline, started=started)
    return started


def start_binary_controller(
    cluster: DevCluster,
    binary: str,
    *,
    extensions: bool = True,
    extra: tuple[str, ...] = (),
    timeout: float = 60.0,
) -> Started:
    """Install CRDs and start another build of the controller (upstream's Go binary) for a same-machine A/B.

    It gets our controller's process name, ports and identity and upstream's flag names (which ours share). It
    serves no conversion webhook: run it with v1alpha1 unserved, so the API server never needs one.
    """
    install_crds(cluster)
    metrics, health, _ = _controller_ports(cluster)
    argv = [
        binary,
        f"--kubeconfig={controller_kubeconfig(cluster)}",
        f"--metrics-bind-address=127.0.0.1:{metrics}",
        f"--health-probe-bind-address=127.0.0.1:{health}",
        "--leader-elect=false",
        *(["--extensions"] if extensions else []),
        *extra,
    ]
    grant_lease_namespace(cluster, extra)
    started = cluster.add_process(CONTROLLER, argv)
    wait_ready(started, f"http://127.0.0.1:{health}/readyz", deadline=time.monotonic() + timeout)
    return started


# A minimal valid v1beta1 spec per kind, for dry-run writes that prove the kind is served.
_PROBE_SPECS: dict[str, dict[str, object]] = {
    "Sandbox": {"podTemplate": {"spec": {"containers": [{"name": "m", "image": "x"}]}}},
    "SandboxTemplate": {"podTemplate": {"spec": {"containers": [{"name": "m", "image": "x"}]}}},
    "SandboxWarmPool": {"sandboxTemplateRef": {"name": "x"}},
    "SandboxClaim": {"warmPoolRef": {"name": "x"}},
}


def _kind_served(admin: AdminRest, kind: ResourceKind, webhook_url: str) -> bool:
    status, body = admin.request(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{kind.crd_name}"
    )
    spec = body.get("spec", {}) if status == 200 and isinstance(body, dict) else {}
    if spec.get("conversion", {}).get("webhook", {}).get("clientConfig", {}).get("url") != webhook_url:
        return False
    probe = {
        "apiVersion": f"{kind.group}/v1beta1",
        "kind": kind.kind,
        "metadata": {"name": "serving-probe"},
        "spec": _PROBE_SPECS[kind.kind],
    }
    path = f"/apis/{kind.group}/v1beta1/namespaces/default/{kind.plural}?dryRun=All"
    return admin.request("POST", path, probe)[0] == 201


def wait_crds_serving(cluster: DevCluster, webhook_url: str, *, deadline: float, started: Started) -> None:
    """Wait until every CRD points at the controller's webhook and accepts writes again.

    At start-up the controller patches the CRDs' conversion settings (caBundle, URL); the API server then
    rebuilds their storage and answers 503/429 for a moment. Callers start work after that window.
    """
    admin = cluster.admin()
    for kind in ALL_KINDS:
        while not _kind_served(admin, kind, webhook_url):
            if time.monotonic() > deadline:
                raise component_error(
                    CONTROLLER, started.log, f"{kind.crd_name} not served via {webhook_url}"
                )
            time.sleep(0.1)
