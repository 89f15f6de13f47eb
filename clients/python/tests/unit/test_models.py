"""Connection configs and result models validate like upstream's (spec §3.5, §3.6)."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_sandbox_sdk import (
    CommandEvent,
    FileEntry,
    SandboxdDirectConnectionConfig,
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
)
from agent_sandbox_sdk._connection import grpc_target, runtime_of
from agent_sandbox_sdk.models import SandboxInClusterConnectionConfig

pytestmark = pytest.mark.unit


def test_direct_config_rejects_reserved_headers_and_tls_without_https() -> None:
    with pytest.raises(ValidationError, match="reserved"):
        SandboxDirectConnectionConfig(api_url="http://r", extra_headers={"X-Sandbox-ID": "x"})
    with pytest.raises(ValidationError, match="https"):
        SandboxDirectConnectionConfig(api_url="http://r", ca_cert="/ca.pem")
    with pytest.raises(ValidationError, match="api_url"):
        SandboxDirectConnectionConfig(api_url="r:8080")
    cfg = SandboxDirectConnectionConfig(api_url="https://r", extra_headers={"Authorization": "Bearer s"})
    assert "Bearer" not in repr(cfg)
    assert cfg.server_port == 8888


@pytest.mark.parametrize(
    ("headers", "option", "sends"),
    [
        ({}, None, True),
        ({"Authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"}, None, True),  # a JWT
        ({"authorization": "bearer v1.eyJucyI6ImEifQ.c2ln"}, None, False),  # a scoped token
        ({"Authorization": "Bearer v1.eyJucyI6ImEifQ.c2ln"}, True, True),
        ({}, False, False),
    ],
)
def test_pod_ip_routing_stays_off_for_scoped_tokens(
    headers: dict[str, str], option: bool | None, sends: bool
) -> None:
    """Routers in scoped-token mode refuse `X-Sandbox-Pod-IP` (spec §1.10)."""
    for kind in (SandboxDirectConnectionConfig, SandboxdDirectConnectionConfig):
        assert (
            kind(api_url="http://r", extra_headers=headers, pod_ip_routing=option).routes_by_pod_ip is sends
        )


def test_ports_are_validated() -> None:
    with pytest.raises(ValidationError, match="65535"):
        SandboxDirectConnectionConfig(api_url="http://r", server_port=70000)
    with pytest.raises(ValidationError, match="different"):
        SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip", rest_port=9090, grpc_port=9090)
    with pytest.raises(ValidationError, match="different"):
        SandboxdDirectConnectionConfig(api_url="http://r", rest_port=1, grpc_port=1)


def test_old_in_cluster_mode_names_are_accepted_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="in-cluster-pod-ip"):
        cfg = SandboxdInClusterConnectionConfig(mode="pod-ip")  # type: ignore[arg-type]
    assert cfg.mode == "in-cluster-pod-ip"


def test_tunnel_namespace_is_a_dns_label() -> None:
    with pytest.raises(ValidationError, match="namespace"):
        SandboxLocalTunnelConnectionConfig(router_namespace="Bad_NS")


def test_runtime_follows_the_config_class() -> None:
    assert runtime_of(SandboxDirectConnectionConfig(api_url="http://r")) == "legacy"
    assert runtime_of(SandboxInClusterConnectionConfig()) == "legacy"
    assert runtime_of(SandboxdDirectConnectionConfig(api_url="http://r")) == "sandboxd"
    assert runtime_of(SandboxdInClusterConnectionConfig(mode="in-cluster-service")) == "sandboxd"


def test_file_entries_from_both_runtimes() -> None:
    legacy = FileEntry.from_legacy({"name": "a", "size": 3, "type": "file", "mod_time": 1700000000.5})
    assert legacy.modified == datetime.fromtimestamp(1700000000.5, tz=UTC)
    assert legacy.mode is None
    no_time = FileEntry.from_legacy({"name": "d", "size": 0, "type": "directory"})
    assert no_time.modified == datetime.fromtimestamp(0, tz=UTC)
    sandboxd = FileEntry.from_sandboxd(
        {"name": "b", "size": 4, "type": "file", "modified_at": "2026-01-02T03:04:05Z", "mode": "0644"}
    )
    assert sandboxd.modified == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert sandboxd.mode == "0644"


def test_command_event_text() -> None:
    assert CommandEvent(type="stdout", data="é\n".encode()).text == "é\n"
    assert CommandEvent(type="stderr", data=b"\xff").text == "\ufffd"


@pytest.mark.parametrize(
    "url", ["http://[::1", "http://r:99999", "http://", "https://:8080", "http://r:port"]
)
def test_an_api_url_that_cannot_be_requested_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="api_url"):
        SandboxDirectConnectionConfig(api_url=url)


@settings(max_examples=300, deadline=None)
@given(rest=st.text(max_size=40))
def test_an_accepted_api_url_can_be_requested(rest: str) -> None:
    """Whatever the config accepts, the SDK can build its requests to (no `InvalidURL` at the first call)."""
    url = "http://" + rest
    try:
        cfg = SandboxdDirectConnectionConfig(api_url=url)
    except ValidationError:
        return
    httpx2.Request("POST", cfg.api_url.rstrip("/") + "/execute")
    assert urlsplit(cfg.api_url).hostname


@pytest.mark.parametrize(
    ("url", "target"),
    [("http://r", "r:80"), ("https://r/", "r:443"), ("http://10.0.0.1:8080", "10.0.0.1:8080"),
     ("http://[::1]:8080", "[::1]:8080"), ("https://[fd00::1]", "[fd00::1]:443")],
)  # fmt: skip
def test_the_grpc_target_of_a_router_url(url: str, target: str) -> None:
    assert grpc_target(url) == target
