"""The routing contract: the `X-Sandbox-*` request headers, their validation, and the address classes.

Owns: turning the routing headers of one request into a validated `Route` or a `RouteError` carrying
upstream's exact status and detail text (router spec §1.2, §1.6), in upstream's check order (ID, namespace,
port, Pod IP; then ours: timeout), and the address-class rules that stop the router from being used as an
SSRF hop (operations spec §11): loopback (unless allowed), link-local (incl. 169.254.169.254 and fe80::/10),
multicast and unspecified addresses are never dialled from a header.

Does not own: whether an address belongs to a sandbox (`_resolve`), authorization (`_authz`).
Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "HEADER_ID",
    "HEADER_NAMESPACE",
    "HEADER_POD_IP",
    "HEADER_PORT",
    "HEADER_TIMEOUT",
    "HEADER_UID",
    "IPAddress",
    "Route",
    "RouteError",
    "always_refused",
    "parse_route",
    "refused_pod_ip",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Lower-case wire names (the server lower-cases header names once, while parsing).
HEADER_ID = b"x-sandbox-id"
HEADER_NAMESPACE = b"x-sandbox-namespace"
HEADER_PORT = b"x-sandbox-port"
HEADER_POD_IP = b"x-sandbox-pod-ip"
HEADER_UID = b"x-sandbox-uid"
HEADER_TIMEOUT = b"x-sandbox-timeout"
ROUTING_HEADERS = (HEADER_ID, HEADER_NAMESPACE, HEADER_PORT, HEADER_POD_IP, HEADER_UID, HEADER_TIMEOUT)
_DISPLAY = {
    HEADER_ID: "X-Sandbox-ID",
    HEADER_NAMESPACE: "X-Sandbox-Namespace",
    HEADER_PORT: "X-Sandbox-Port",
    HEADER_POD_IP: "X-Sandbox-Pod-IP",
    HEADER_UID: "X-Sandbox-UID",
    HEADER_TIMEOUT: "X-Sandbox-Timeout",
}

DEFAULT_NAMESPACE = "default"
DEFAULT_PORT = 8888

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class RouteError(Exception):
    """A request the router refuses before dialling anything: HTTP `status` and the JSON `detail` text."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Route:
    """The validated routing headers of one request."""

    sandbox_id: str
    namespace: str
    port: int
    pod_ip: IPAddress | None = None
    uid: str | None = None
    timeout: float | None = None
    """`X-Sandbox-Timeout` in seconds (not yet capped), None when absent."""


def always_refused(ip: IPAddress) -> bool:
    """Addresses never dialled, whatever the configuration: link-local (unicast and multicast, incl. the
    cloud metadata address 169.254.169.254 and fe80::/10), any multicast, and unspecified (0.0.0.0, ::).

    IPv4-mapped IPv6 addresses (::ffff:169.254.169.254) are judged by the IPv4 address they carry.
    """
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or ip.is_multicast or ip.is_unspecified


def refused_pod_ip(ip: IPAddress, *, allow_loopback: bool) -> bool:
    """True if `ip` may not be named in `X-Sandbox-Pod-IP` (router spec §1.2)."""
    if always_refused(ip):
        return True
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    loopback = (mapped or ip).is_loopback
    return loopback and not allow_loopback


def _is_dns_label(value: str) -> bool:
    return len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def _parse_port(text: str) -> int | None:
    # Go's strconv.Atoi: optional sign, ASCII digits only.
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or not body.isascii() or not body.isdigit():
        return None
    port = int(text)
    return port if 1 <= port <= 65535 else None


def _parse_timeout(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if math.isnan(value) or math.isinf(value) or value <= 0:
        return None
    return value


def _parse_ip(text: str) -> IPAddress | None:
    # Go's net.ParseIP: a bare literal; brackets, zones and ports are not IP literals.
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


_POD_IPS: dict[tuple[bytes, bool], IPAddress | None] = {}
_POD_IPS_MAX = 4096


def _checked_pod_ip(raw: bytes, allow_loopback: bool) -> IPAddress | None:
    """The header's address if it may be dialled, else None; memoized (clients repeat their sandbox's)."""
    key = (raw, allow_loopback)
    try:
        return _POD_IPS[key]
    except KeyError:
        pass
    ip = _parse_ip(raw.decode("latin-1"))
    if ip is not None and refused_pod_ip(ip, allow_loopback=allow_loopback):
        ip = None
    if len(_POD_IPS) >= _POD_IPS_MAX:
        _POD_IPS.clear()
    _POD_IPS[key] = ip
    return ip


def parse_route(
    headers: dict[bytes, bytes],
    duplicates: frozenset[bytes] | set[bytes] = frozenset(),
    *,
    allow_loopback: bool = False,
) -> Route:
    """Validate the routing headers of one request (router spec §1.2, check order of §1.6).

    Args:
        headers: the request's `X-Sandbox-*` headers, lower-case name -> raw value (first occurrence).
        allow_loopback: `--allow-loopback-pod-ip` (other refused classes stay refused).
        duplicates: routing header names that occurred more than once; ambiguous, so refused (ours:
            upstream silently takes the first, while a sandbox behind it might read the last).

    Raises:
        RouteError: 400 with upstream's detail text (ours for the duplicate and timeout checks).
    """
    for name in ROUTING_HEADERS:
        if name in duplicates:
            raise RouteError(400, f"Duplicate {_DISPLAY[name]} header.")
    raw_id = headers.get(HEADER_ID)
    if not raw_id:
        raise RouteError(400, "X-Sandbox-ID header is required.")
    sandbox_id = raw_id.decode("latin-1")
    if not _is_dns_label(sandbox_id):
        raise RouteError(400, "Invalid sandbox ID format.")
    raw_ns = headers.get(HEADER_NAMESPACE)
    namespace = raw_ns.decode("latin-1") if raw_ns else DEFAULT_NAMESPACE
    if not _is_dns_label(namespace):
        raise RouteError(400, "Invalid namespace format.")
    raw_port = headers.get(HEADER_PORT)
    port = DEFAULT_PORT
    if raw_port:
        parsed_port = _parse_port(raw_port.decode("latin-1"))
        if parsed_port is None:
            raise RouteError(400, "Invalid port format.")
        port = parsed_port
    pod_ip: IPAddress | None = None
    raw_ip = headers.get(HEADER_POD_IP)
    if raw_ip:
        pod_ip = _checked_pod_ip(raw_ip, allow_loopback)
        if pod_ip is None:
            raise RouteError(400, "Invalid target IP address.")
    raw_uid = headers.get(HEADER_UID)
    uid = raw_uid.decode("latin-1") if raw_uid else None
    timeout: float | None = None
    raw_timeout = headers.get(HEADER_TIMEOUT)
    if raw_timeout:
        timeout = _parse_timeout(raw_timeout.decode("latin-1"))
        if timeout is None:
            raise RouteError(400, "Invalid timeout format.")
    return Route(sandbox_id, namespace, port, pod_ip, uid, timeout)
