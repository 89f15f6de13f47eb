"""The service proxy's decisions (pure): CONNECT parsing and ClusterIP -> Ready pod resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_sandbox.devcluster import components
from agent_sandbox.devcluster.binaries import Binaries
from agent_sandbox.devcluster.certs import write_cluster_pki
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.serviceproxy import ProxyRefused, is_loopback, parse_connect, resolve_service

pytestmark = pytest.mark.unit

SVC = {
    "metadata": {"name": "wh", "namespace": "ns"},
    "spec": {
        "clusterIP": "10.96.1.2",
        "selector": {"app": "c"},
        "ports": [{"port": 443, "targetPort": "webhook"}],
    },
}


def _pod(
    name: str,
    *,
    ready: bool = True,
    ns: str = "ns",
    labels: dict[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels or {"app": "c"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"ports": [{"name": "webhook", "containerPort": 9443}]}]},
        "status": {"podIP": f"127.10.0.{len(name)}", "conditions": [{"type": "Ready", "status": str(ready)}]},
    }


def test_parse_connect() -> None:
    assert parse_connect(b"CONNECT 10.96.1.2:443 HTTP/1.1\r\nHost: x\r\n\r\n") == ("10.96.1.2", 443)
    assert parse_connect(b"CONNECT [::1]:8080 HTTP/1.1\r\n\r\n") == ("::1", 8080)
    for bad in (b"GET / HTTP/1.1\r\n\r\n", b"CONNECT host HTTP/1.1\r\n\r\n", b"\xff\r\n\r\n"):
        with pytest.raises(ProxyRefused) as err:
            parse_connect(bad)
        assert err.value.status == 400


def test_loopback() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("127.12.3.4")
    assert is_loopback("::1")
    assert not is_loopback("10.96.0.1")
    assert not is_loopback("169.254.169.254")


def test_resolves_a_ready_selected_pod_and_its_named_port() -> None:
    pods = [
        _pod("a", ready=False),
        _pod("bb", deleting=True),
        _pod("ccc", labels={"app": "other"}),
        _pod("dddd", ns="elsewhere"),
        _pod("eeeee"),
    ]
    target = resolve_service([SVC], pods, "10.96.1.2", 443)
    assert (target.host, target.port) == ("127.10.0.5", 9443)
    assert "ns/wh:443 -> pod eeeee" in target.via


@pytest.mark.parametrize(
    ("ip", "port", "pods", "status"),
    [
        ("10.96.9.9", 443, [], 404),  # no such ClusterIP
        ("10.96.1.2", 80, [], 404),  # no such port
        ("10.96.1.2", 443, [], 503),  # no Ready pod
    ],
)
def test_refusals(ip: str, port: int, pods: list[dict[str, Any]], status: int) -> None:
    with pytest.raises(ProxyRefused) as err:
        resolve_service([SVC], pods, ip, port)
    assert err.value.status == status


def test_numeric_target_port() -> None:
    svc = {**SVC, "spec": {**SVC["spec"], "ports": [{"port": 443, "targetPort": 8443}]}}
    assert resolve_service([svc], [_pod("p")], "10.96.1.2", 443).port == 8443


def test_apiserver_routes_the_cluster_network_through_the_proxy_only_when_asked(tmp_path: Path) -> None:
    pki = write_cluster_pki(tmp_path / "pki", service_ip="10.96.0.1")
    ports = dict(etcd_client=1, etcd_peer=2, apiserver=3, controller_manager=4, scheduler=5, kwok=6)
    lay = components.Layout(tmp_path, ports, Binaries(Path("/bin-dir")), pki, "127.42.0.0/16")
    flag = f"--egress-selector-config-file={tmp_path / components.EGRESS_CONFIG}"
    assert flag not in components.apiserver_argv(lay, ClusterConfig())
    assert flag in components.apiserver_argv(lay, ClusterConfig(service_proxy=True))
    doc = yaml.safe_load(components.egress_selector_yaml(tmp_path / "s.sock"))
    assert doc["kind"] == "EgressSelectorConfiguration"
    (selection,) = doc["egressSelections"]
    assert selection["name"] == "cluster"  # only webhooks/aggregated APIs/kubelet; etcd stays direct
    assert selection["connection"] == {
        "proxyProtocol": "HTTPConnect",
        "transport": {"uds": {"udsName": str(tmp_path / "s.sock")}},
    }
