"""Gateway mode, end to end: an SDK finds the router through a Gateway API `Gateway`'s `status.addresses`, then
sends every runtime request to `http://<address>` (port 80) with the router headers (sdk-router-runtime §3:
`SandboxGatewayConnectionConfig`; the Go SDK's `GatewayName`).

No Gateway implementation runs here, so the test plays its controller: it installs the real Gateway CRD
(gateway-api v1.6.3, standard channel, tests/gateway_api.py), creates a Gateway, and publishes as its address
one where a router listens on port 80 - an address in this cluster's own 127.x /16 that kwok never gives a Pod,
so parallel clusters never collide. Exercised for real: the discovery through the API server (the Gateway read
or watched until it has a usable address), the URL each SDK builds from it, and the routed requests. Clients:
ours (sync and async), upstream's published 1.0.8 unchanged, and the Go SDK's `examples/basic`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxGatewayConnectionConfig
from tests.gateway_api import install_gateway_crd
from tests.go_examples import run_go_basic
from tests.upstream_sdk import ensure_upstream_sdk, run_script

from .conftest import RUNTIME_IMAGE, apply_pool, router_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

GATEWAYS = "/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/gateways"


@dataclass(frozen=True)
class GatewayRouter:
    address: str
    metrics_port: int

    def answered(self, namespace: str) -> int:
        """Requests for sandboxes of `namespace` this router answered with 2xx (its own metrics)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        prefix, ours = "sandbox_router_requests_total{", f'sandbox_namespace="{namespace}"'
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(prefix) and ours in line and 'code="2' in line
        )
        return int(total)


def _gateway_address(cluster: DevCluster) -> str:
    """The top of the cluster's pod /16 (kwok hands out pod IPs from the bottom)."""
    octet = cluster.state.pod_cidr.split(".")[1]
    return f"127.{octet}.255.250"


@pytest.fixture(scope="module")
def gateway_router(cluster: DevCluster) -> Iterator[GatewayRouter]:
    """A router listening on <gateway address>:80, its own process (the dev router keeps its port)."""
    address = _gateway_address(cluster)
    install_gateway_crd(cluster)  # once per module: every test's Gateway needs it
    with router_process(cluster, "gateway_router", f"{address}:80") as metrics:
        yield GatewayRouter(address, metrics)


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def _create_gateway(cluster: DevCluster, namespace: str, address: str | None) -> None:
    """A Gateway `gw`; with `address`, its status says it is programmed there (what a Gateway controller writes)."""
    admin = cluster.admin()
    body = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "gw"},
        "spec": {
            "gatewayClassName": "agent-sandbox-test",
            "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}],
        },
    }
    status, out = admin.request("POST", GATEWAYS.format(ns=namespace), body)
    assert status == 201, out
    if address is not None:
        patch = {"status": {"addresses": [{"type": "IPAddress", "value": address}]}}
        status, out = admin.request("PATCH", GATEWAYS.format(ns=namespace) + "/gw/status", patch)
        assert status == 200, out
        assert out["status"]["addresses"] == [{"type": "IPAddress", "value": address}]


def test_ours_sync_and_async_reach_the_runtime_through_the_gateway_address(
    cluster: DevCluster, pool: str, gateway_router: GatewayRouter
) -> None:
    _create_gateway(cluster, pool, gateway_router.address)
    config = SandboxGatewayConnectionConfig(
        gateway_name="gw", gateway_namespace=pool, gateway_ready_timeout=30
    )
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        assert sandbox.files is not None
        result = sandbox.commands.run("echo via the gateway")
        assert (result.stdout, result.exit_code) == ("via the gateway\n", 0)
        sandbox.files.write("g.txt", b"gw")
        assert sandbox.files.read("g.txt") == b"gw"
        sandbox.terminate()

    async def run_async() -> str:
        async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as aclient:
            sb = await aclient.create_sandbox("pool", pool, sandbox_ready_timeout=90)
            assert sb.commands is not None
            out = await sb.commands.run("echo async via the gateway")
            await sb.terminate()
            return out.stdout

    assert asyncio.run(run_async()) == "async via the gateway\n"
    assert gateway_router.answered(pool) >= 4  # run, write, read; run


def test_a_gateway_without_an_address_times_out_naming_it(
    cluster: DevCluster, pool: str, gateway_router: GatewayRouter
) -> None:
    _create_gateway(cluster, pool, None)
    config = SandboxGatewayConnectionConfig(
        gateway_name="gw", gateway_namespace=pool, gateway_ready_timeout=2
    )
    with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=f"Gateway {pool}/gw has no address"):
            sandbox.commands.run("true")
        assert time.monotonic() - started < 15
        sandbox.terminate()


_UPSTREAM = r"""
import json, sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxGatewayConnectionConfig
ns = sys.argv[1]
client = SandboxClient(connection_config=SandboxGatewayConnectionConfig(
    gateway_name="gw", gateway_namespace=ns, gateway_ready_timeout=30))
sb = client.create_sandbox("pool", namespace=ns, sandbox_ready_timeout=90)
r = sb.commands.run("echo upstream via the gateway")
sb.files.write("u.txt", "up")
out = {"run": [r.stdout, r.exit_code], "read": sb.files.read("u.txt").decode()}
sb.terminate()
print(json.dumps(out))
"""


def test_upstream_sdk_in_gateway_mode(cluster: DevCluster, pool: str, gateway_router: GatewayRouter) -> None:
    _create_gateway(cluster, pool, gateway_router.address)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    out = json.loads(asyncio.run(run_script(ensure_upstream_sdk(), _UPSTREAM, pool, env=env, timeout=180)))
    assert out == {"run": ["upstream via the gateway\n", 0], "read": "up"}
    assert gateway_router.answered(pool) >= 3


def test_go_sdk_in_gateway_mode(
    cluster: DevCluster, pool: str, gateway_router: GatewayRouter, tmp_path: Path
) -> None:
    _create_gateway(cluster, pool, gateway_router.address)
    run_go_basic(tmp_path, cluster.kubeconfig, "-pool", "pool", "-namespace", pool, "-gateway", "gw",
                 "-gateway-namespace", pool, timeout=240)  # fmt: skip
    assert gateway_router.answered(pool) >= 3
