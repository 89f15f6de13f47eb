"""`sandbox_client_discovery_latency_ms{mode,status}` and the histogram buckets (spec §3.12).

Discovery runs as flows on the real drivers (sync and async) against an in-memory API server answering the
Gateway read; the kubectl tunnel is replaced by an in-memory stand-in (its real behaviour is covered by the
integration test tests/integration/sdk/test_sdk_metrics.py). The histograms are process-wide, so each test
compares counts before and after.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import _connection, get_metrics, metrics
from agent_sandbox_sdk._connection import Connection
from agent_sandbox_sdk._driver import AsyncDriver, SyncDriver
from agent_sandbox_sdk.exceptions import SandboxPortForwardError, SandboxTimeoutError
from agent_sandbox_sdk.models import (
    SandboxConnectionConfig,
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
)

from .fakes import endpoint

pytestmark = pytest.mark.unit

NAME = "sandbox_client_discovery_latency_ms"
GATEWAY = "/apis/gateway.networking.k8s.io/v1/namespaces/gw-ns/gateways/gw"
SANDBOX = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes/sb"


def count(mode: str, status: str) -> float:
    """The `_count` sample of one discovery series (0 when it was never observed)."""
    pattern = rf'^{NAME}_count\{{mode="{mode}",status="{status}"\}} (\S+)$'
    found = re.search(pattern, get_metrics(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def total() -> float:
    """Observations of every discovery series."""
    return sum(
        float(v) for v in re.findall(rf"^{NAME}_count\{{[^}}]*\}} (\S+)$", get_metrics(), re.MULTILINE)
    )


def api(address: str | None) -> httpx2.MockTransport:
    """The API server: the Gateway `gw` (with `address` in its status) and the Sandbox `sb`."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == GATEWAY:
            status = {"addresses": [{"type": "IPAddress", "value": address}]} if address else {}
            return httpx2.Response(
                200, json={"kind": "Gateway", "metadata": {"name": "gw"}, "status": status}
            )
        if request.url.path == SANDBOX:
            return httpx2.Response(
                200,
                json={
                    "kind": "Sandbox",
                    "metadata": {"name": "sb"},
                    "status": {"podIPs": [{"ip": "127.10.0.5"}]},
                },
            )
        return httpx2.Response(404, json={"kind": "Status", "code": 404, "reason": "NotFound"})

    return httpx2.MockTransport(handle)


def resolve(
    mode: str, config: SandboxConnectionConfig, transport: httpx2.MockTransport, times: int = 1
) -> Any:
    """`times` resolves of one connection on the sync or the async driver; the last target."""
    conn = Connection(config, sandbox_id="sb", namespace="default")
    if mode == "sync":
        driver = SyncDriver(endpoint(), transport=transport)
        try:
            return [driver.run(conn.resolve()) for _ in range(times)][-1]
        finally:
            conn.close()
            driver.close()

    async def main() -> Any:
        adriver = AsyncDriver(endpoint(), transport=transport)
        try:
            return [await adriver.run(conn.resolve()) for _ in range(times)][-1]
        finally:
            conn.close()
            await adriver.aclose()

    return asyncio.run(main())


class FakeTunnel:
    """Stands in for `PortForward`: ready after a few polls, or dead with kubectl's message."""

    started: list[list[str]] = []
    fail: str | None = None

    def __init__(self, args: list[str], remote_ports: list[int], kubectl_flags: list[str]) -> None:
        FakeTunnel.started.append(args)
        self.local_ports = [40000 + i for i in range(len(remote_ports))]
        self._polls = 0

    def ready(self) -> bool:
        self._polls += 1
        return FakeTunnel.fail is None and self._polls > 2

    def died(self) -> str | None:
        return FakeTunnel.fail if self._polls else None

    def close(self) -> None:
        pass


@pytest.fixture
def tunnel(monkeypatch: pytest.MonkeyPatch) -> type[FakeTunnel]:
    monkeypatch.setattr(_connection, "PortForward", FakeTunnel)
    FakeTunnel.started, FakeTunnel.fail = [], None
    return FakeTunnel


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_gateway_discovery_is_recorded_once_per_connection(mode: str) -> None:
    before = count("gateway", "success")
    config = SandboxGatewayConnectionConfig(gateway_name="gw", gateway_namespace="gw-ns")
    target = resolve(mode, config, api("10.0.0.7"), times=3)
    assert target.base_url == "http://10.0.0.7"
    # The URL is cached after the first resolve, as upstream's `base_url`: one discovery, one observation.
    assert count("gateway", "success") == before + 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_gateway_without_an_address_records_a_failure(mode: str) -> None:
    before = count("gateway", "failure")
    config = SandboxGatewayConnectionConfig(
        gateway_name="gw", gateway_namespace="gw-ns", gateway_ready_timeout=0
    )
    with pytest.raises(SandboxTimeoutError):
        resolve(mode, config, api(None))
    assert count("gateway", "failure") == before + 1


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("config", "label"),
    [
        (SandboxLocalTunnelConnectionConfig(), "port_forward"),
        (SandboxdPodTunnelConnectionConfig(), "sandboxd_pod_tunnel"),
    ],
)
def test_a_tunnel_start_is_recorded_once_not_per_call(
    mode: str, config: SandboxConnectionConfig, label: str, tunnel: type[FakeTunnel]
) -> None:
    before = count(label, "success")
    target = resolve(mode, config, api(None), times=3)
    assert target.base_url == "http://127.0.0.1:40000"
    assert len(tunnel.started) == 1
    assert count(label, "success") == before + 1


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    ("config", "label"),
    [
        (SandboxLocalTunnelConnectionConfig(), "port_forward"),
        (SandboxdPodTunnelConnectionConfig(), "sandboxd_pod_tunnel"),
    ],
)
def test_a_tunnel_that_dies_records_a_failure(
    mode: str, config: SandboxConnectionConfig, label: str, tunnel: type[FakeTunnel]
) -> None:
    tunnel.fail = "kubectl port-forward exited with 1: error: pods not found"
    before = count(label, "failure")
    with pytest.raises(SandboxPortForwardError):
        resolve(mode, config, api(None))
    assert count(label, "failure") == before + 1


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "config",
    [
        SandboxDirectConnectionConfig(api_url="http://router.test"),
        SandboxInClusterConnectionConfig(),
        SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip"),
    ],
)
def test_modes_that_discover_nothing_record_nothing(mode: str, config: SandboxConnectionConfig) -> None:
    # Upstream records discovery for the gateway and the two tunnels only.
    before = total()
    resolve(mode, config, api(None))
    assert total() == before


def test_buckets_are_upstreams() -> None:
    assert metrics.BUCKETS_MS == (
        100, 250, 500, 750, 1000, 1250, 1500, 2000, 2500, 5000, 10000, 30000, 60000, 120000, 240000,
    )  # fmt: skip
    metrics.observe("sandbox_client_resume_latency_ms", 700.0, status="bucket-test")
    text = get_metrics()
    series = 'sandbox_client_resume_latency_ms_bucket{status="bucket-test",le="%s"}'
    les = re.findall(r'sandbox_client_resume_latency_ms_bucket\{status="bucket-test",le="([^"]+)"\}', text)
    assert les == [f"{float(b)}" for b in metrics.BUCKETS_MS] + ["+Inf"]
    assert f"{series % '500.0'} 0.0" in text
    assert f"{series % '750.0'} 1.0" in text
    assert f"{series % '1250.0'} 1.0" in text
    assert f"{series % '+Inf'} 1.0" in text
    assert "# HELP sandbox_client_resume_latency_ms Latency of resuming the sandbox in milliseconds" in text


# ------------------------------------------------------------------ interrupted discovery is not a failure


def _waiting_gateway() -> SandboxGatewayConnectionConfig:
    """A Gateway that keeps the discovery polling (no address yet) well past the tests' interruptions."""
    return SandboxGatewayConnectionConfig(
        gateway_name="gw", gateway_namespace="gw-ns", gateway_ready_timeout=30
    )


def test_a_cancelled_gateway_discovery_records_nothing() -> None:
    # `asyncio.timeout`/`wait_for` around a call, or a TaskGroup sibling failing, cancels the task while the
    # Gateway has no address yet: the discovery neither succeeded nor failed, so nothing is observed (a
    # "failure" would count every caller-side timeout as a broken Gateway).
    before = total()
    conn = Connection(_waiting_gateway(), sandbox_id="sb", namespace="default")

    async def main() -> None:
        adriver = AsyncDriver(endpoint(), transport=api(None))
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(adriver.run(conn.resolve()), 0.3)
        finally:
            conn.close()
            await adriver.aclose()

    asyncio.run(main())
    assert total() == before


def test_an_interrupted_sync_gateway_discovery_records_nothing() -> None:
    # Ctrl-C while the sync client waits for the Gateway's address: KeyboardInterrupt reaches the caller
    # unchanged and no "failure" is observed.
    before = total()
    polls = 0

    def handle(request: httpx2.Request) -> httpx2.Response:
        nonlocal polls
        polls += 1
        if polls > 2:
            raise KeyboardInterrupt
        return api(None).handle_request(request)

    conn = Connection(_waiting_gateway(), sandbox_id="sb", namespace="default")
    driver = SyncDriver(endpoint(), transport=httpx2.MockTransport(handle))
    try:
        with pytest.raises(KeyboardInterrupt):
            driver.run(conn.resolve())
    finally:
        conn.close()
        driver.close()
    assert total() == before


def test_a_flow_closed_mid_discovery_records_nothing(tunnel: type[FakeTunnel]) -> None:
    # A flow abandoned at a step (GeneratorExit from `close()`, as the drivers close every flow they stop
    # driving) is not a failed discovery.
    before = total()
    conn = Connection(SandboxLocalTunnelConnectionConfig(), sandbox_id="sb", namespace="default")
    flow = conn.resolve()
    next(flow)  # the first readiness poll's Sleep, inside the timed tunnel start
    flow.close()
    conn.close()
    assert len(tunnel.started) == 1
    assert total() == before
