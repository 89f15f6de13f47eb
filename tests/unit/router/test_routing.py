"""Routing-header validation (router spec §1.2, §1.6): every header, its default, and upstream's texts."""

from __future__ import annotations

import ipaddress

import pytest

from agent_sandbox.router._routing import Route, RouteError, always_refused, parse_route, refused_pod_ip

pytestmark = pytest.mark.unit


def route(allow_loopback: bool = False, **headers: str) -> Route:
    raw = {f"x-sandbox-{k.replace('_', '-')}".encode(): v.encode() for k, v in headers.items()}
    return parse_route(raw, allow_loopback=allow_loopback)


def test_defaults() -> None:
    assert route(id="sb") == Route("sb", "default", 8888)


def test_every_header() -> None:
    r = route(id="sb-1", namespace="team-a", port="9090", pod_ip="10.1.2.3", uid="u-1", timeout="2.5")
    assert r == Route("sb-1", "team-a", 9090, ipaddress.ip_address("10.1.2.3"), "u-1", 2.5)


def test_ipv6_pod_ip() -> None:
    assert route(id="a", pod_ip="fd00::5").pod_ip == ipaddress.ip_address("fd00::5")


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({}, "X-Sandbox-ID header is required."),
        ({"id": ""}, "X-Sandbox-ID header is required."),
        ({"id": "Upper"}, "Invalid sandbox ID format."),
        ({"id": "-lead"}, "Invalid sandbox ID format."),
        ({"id": "trail-"}, "Invalid sandbox ID format."),
        ({"id": "a" * 64}, "Invalid sandbox ID format."),
        ({"id": "dot.ted"}, "Invalid sandbox ID format."),
        ({"id": "a", "namespace": "Bad_NS"}, "Invalid namespace format."),
        ({"id": "a", "port": "0"}, "Invalid port format."),
        ({"id": "a", "port": "65536"}, "Invalid port format."),
        ({"id": "a", "port": "80x"}, "Invalid port format."),
        ({"id": "a", "port": " 80"}, "Invalid port format."),
        ({"id": "a", "port": "\uff18\uff10"}, "Invalid port format."),  # non-ASCII digits
        ({"id": "a", "pod_ip": "not-an-ip"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "[::1]"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "10.0.0.1:80"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "127.0.0.1"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "::1"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "169.254.169.254"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "::ffff:169.254.169.254"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "fe80::1"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "224.0.0.1"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "0.0.0.0"}, "Invalid target IP address."),
        ({"id": "a", "pod_ip": "::"}, "Invalid target IP address."),
        ({"id": "a", "timeout": "abc"}, "Invalid timeout format."),
        ({"id": "a", "timeout": "0"}, "Invalid timeout format."),
        ({"id": "a", "timeout": "-1"}, "Invalid timeout format."),
        ({"id": "a", "timeout": "nan"}, "Invalid timeout format."),
        ({"id": "a", "timeout": "inf"}, "Invalid timeout format."),
    ],
)
def test_rejections(headers: dict[str, str], detail: str) -> None:
    with pytest.raises(RouteError) as err:
        route(**headers)
    assert (err.value.status, err.value.detail) == (400, detail)


def test_check_order_is_upstreams() -> None:
    # Several bad headers at once: the ID is reported first, then namespace, port, IP (router spec §1.6).
    with pytest.raises(RouteError, match="Invalid namespace format"):
        route(id="a", namespace="B", port="0", pod_ip="x")
    with pytest.raises(RouteError, match="Invalid port format"):
        route(id="a", port="0", pod_ip="x")


def test_loopback_only_when_allowed() -> None:
    assert route(True, id="a", pod_ip="127.10.0.7").pod_ip == ipaddress.ip_address("127.10.0.7")
    assert route(True, id="a", pod_ip="::1").pod_ip == ipaddress.ip_address("::1")
    # Other classes stay refused even with loopback allowed.
    with pytest.raises(RouteError):
        route(True, id="a", pod_ip="169.254.169.254")


def test_duplicate_routing_header_is_refused() -> None:
    with pytest.raises(RouteError) as err:
        parse_route({b"x-sandbox-id": b"a"}, {b"x-sandbox-id"})
    assert err.value.detail == "Duplicate X-Sandbox-ID header."


def test_empty_timeout_means_absent() -> None:
    assert route(id="a", timeout="").timeout is None


@pytest.mark.parametrize(
    ("ip", "refused"),
    [
        ("169.254.169.254", True),
        ("169.254.0.1", True),
        ("fe80::1", True),
        ("ff02::1", True),
        ("239.1.1.1", True),
        ("0.0.0.0", True),
        ("::", True),
        ("::ffff:169.254.169.254", True),
        ("127.0.0.1", False),
        ("10.0.0.1", False),
        ("fd00::1", False),
    ],
)
def test_always_refused(ip: str, refused: bool) -> None:
    assert always_refused(ipaddress.ip_address(ip)) is refused


def test_mapped_loopback_is_loopback() -> None:
    assert refused_pod_ip(ipaddress.ip_address("::ffff:127.0.0.1"), allow_loopback=False)
    assert not refused_pod_ip(ipaddress.ip_address("::ffff:127.0.0.1"), allow_loopback=True)
