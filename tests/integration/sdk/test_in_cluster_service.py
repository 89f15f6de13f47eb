"""In-cluster Service mode, end to end: an SDK reaches sandboxd at the Sandbox's `status.serviceFQDN`
(`SandboxdInClusterConnectionConfig(mode="in-cluster-service")`; the Go SDK's `ConnectivityInClusterService`).

The dev cluster has no cluster DNS, so the test plays it: each client runs in a private mount namespace
(`unshare --mount`, which needs root, as this suite's machines run it) whose `/etc/hosts` maps the FQDN to the
Pod's IP - what a cluster DNS answers for a headless Service - and whose resolv.conf names 127.0.0.1, so no
lookup goes to the machine's own name server. The rest is real: the template's `service: true`,
the controller's headless Service and `status.serviceFQDN`, each SDK reading it, resolving it through the
system resolver and sending REST and gRPC to sandboxd there. The same client without the mapping must fail
to resolve the name, so a pass cannot come from the pod IP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import SandboxClient, SandboxdInClusterConnectionConfig
from tests.go_examples import build_go_example
from tests.upstream_sdk import ensure_upstream_sdk

from .conftest import EXT, RUNTIME_IMAGE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_BASE_HOSTS = "127.0.0.1 localhost\n::1 localhost\n"

_OURS = r"""
import json, sys
from agent_sandbox_sdk import SandboxClient, SandboxdInClusterConnectionConfig
ns, claim = sys.argv[1:3]
with SandboxClient(SandboxdInClusterConnectionConfig(mode="in-cluster-service")) as client:
    sb = client.get_sandbox(claim, namespace=ns)
    r = sb.commands.run("echo ours via the service name")
    sb.files.write("svc.txt", b"ours")
    print(json.dumps({"run": [r.stdout, r.exit_code], "read": sb.files.read("svc.txt").decode()}))
"""

_UPSTREAM = r"""
import json, sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig
ns, claim = sys.argv[1:3]
client = SandboxClient(connection_config=SandboxdInClusterConnectionConfig(mode="in-cluster-service"))
sb = client.get_sandbox(claim, namespace=ns)
r = sb.commands.run("echo upstream via the service name")
sb.files.write("svc-up.txt", "up")
print(json.dumps({"run": [r.stdout, r.exit_code], "read": sb.files.read("svc-up.txt").decode()}))
"""


@pytest.fixture
def service_pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    """A warm pool whose template asks for a headless Service per Sandbox."""
    admin = cluster.admin()
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "svc"},
        "spec": {
            "service": True,
            "podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}},
        },
    }
    pool = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "pool"},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "svc"}},
    }
    for plural, body in (("sandboxtemplates", template), ("sandboxwarmpools", pool)):
        status, out = admin.request("POST", f"/apis/{EXT}/namespaces/{namespace}/{plural}", body)
        assert status == 201, out
    return namespace


@pytest.fixture
def claimed(cluster: DevCluster, service_pool: str, tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    """A Ready claim on the pool (made through the pod IP), its FQDN, and a hosts file mapping it to the pod."""
    config = SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", service_pool, sandbox_ready_timeout=90)
        path = f"/apis/agents.x-k8s.io/v1beta1/namespaces/{service_pool}/sandboxes/{sandbox.sandbox_id}"
        status, obj = cluster.admin().request("GET", path)
        assert status == 200, obj
        fqdn = obj["status"]["serviceFQDN"]
        assert fqdn == f"{sandbox.sandbox_id}.{service_pool}.svc.cluster.local"
        pod_ip = obj["status"]["podIPs"][0]
        hosts = tmp_path / "hosts"
        hosts.write_text(_BASE_HOSTS + f"{pod_ip} {fqdn}\n")
        assert sandbox.claim_name is not None
        yield sandbox.claim_name, fqdn, hosts


def _in_namespace(
    hosts: Path | None, argv: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in a private mount namespace whose /etc/hosts is `hosts` (None: only localhost) and whose
    resolver asks 127.0.0.1, where nothing answers DNS: no lookup leaves the loopback network."""
    unshare = shutil.which("unshare")
    assert unshare is not None, "unshare (util-linux) is needed to give the client its own /etc/hosts"
    work = Path(tempfile.mkdtemp(prefix="dns-"))
    resolv = work / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    if hosts is None:
        hosts = work / "hosts"
        hosts.write_text(_BASE_HOSTS)
    script = 'mount --bind "$0" /etc/hosts && mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    wrapped = [
        unshare,
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script,
        str(hosts),
        str(resolv),
    ]
    try:
        return subprocess.run([*wrapped, *argv], env=env, capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _env(cluster: DevCluster) -> dict[str, str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    env.pop("AGENT_SANDBOX_ROUTER_URL", None)
    return env


def test_ours_reaches_sandboxd_at_the_service_fqdn(
    cluster: DevCluster, service_pool: str, claimed: tuple[str, str, Path]
) -> None:
    claim, fqdn, hosts = claimed
    argv = [sys.executable, "-c", _OURS, service_pool, claim]
    without = _in_namespace(None, argv, _env(cluster))
    assert without.returncode != 0
    assert fqdn in without.stderr  # the failure names the host it could not reach
    out = _in_namespace(hosts, argv, _env(cluster))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"run": ["ours via the service name\n", 0], "read": "ours"}


def test_upstream_sdk_reaches_sandboxd_at_the_service_fqdn(
    cluster: DevCluster, service_pool: str, claimed: tuple[str, str, Path]
) -> None:
    claim, _fqdn, hosts = claimed
    out = _in_namespace(
        hosts, [str(ensure_upstream_sdk()), "-c", _UPSTREAM, service_pool, claim], _env(cluster)
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"run": ["upstream via the service name\n", 0], "read": "up"}


def test_go_sdk_reaches_sandboxd_at_the_service_fqdn(
    cluster: DevCluster, service_pool: str, claimed: tuple[str, str, Path], tmp_path: Path
) -> None:
    claim, fqdn, hosts = claimed
    binary = build_go_example("basic", tmp_path)
    argv = [str(binary), "-namespace", service_pool, "-claim", claim, "-runtime", "sandboxd",
            "-connectivity", "in-cluster-service"]  # fmt: skip
    without = _in_namespace(None, argv, _env(cluster))
    assert without.returncode != 0
    assert fqdn in without.stderr
    out = _in_namespace(hosts, argv, _env(cluster))
    assert out.returncode == 0, out.stderr
    assert "Hello from Agent Sandbox!" in out.stdout
    assert "hello.txt: hi" in out.stdout
