"""How one sandbox handle reaches its sandbox: base URL, routing headers, gRPC target (spec §3.6).

A `Connection` belongs to one handle. `resolve()` is a flow returning a `Target` for the next call,
doing whatever discovery the connection config needs (pod IP lookup, Gateway address, a kubectl
tunnel). `failed()` forgets what may be stale after a 5xx or a transport failure: the cached pod IP
(re-read on the next call) and the tunnel (re-opened on the next call).

Discovery is timed as upstream 1.0.8's connectors time it (`sandbox_client_discovery_latency_ms{mode,status}`,
spec §3.12): the wait for the Gateway address (`gateway`, once per connection, as upstream caches the URL)
and the start of a kubectl tunnel up to its ports accepting (`port_forward`, `sandboxd_pod_tunnel`), with
`status="failure"` when that raises; one interrupted (task cancelled, Ctrl-C, flow closed) records nothing
(`metrics.timed`). A reused URL or tunnel is not discovery and records nothing; nor do the
direct and in-cluster modes (upstream records nothing for them). Flows run on both drivers, so sync and
async clients record alike.

| config | runtime | base URL | routing headers | gRPC |
|---|---|---|---|---|
| SandboxDirectConnectionConfig | legacy | api_url | yes | - |
| SandboxdDirectConnectionConfig (ours) | sandboxd | api_url | yes (port = rest_port) | router h2c, headers as metadata |
| SandboxGatewayConnectionConfig | legacy | http://<gateway address> | yes | - |
| SandboxLocalTunnelConnectionConfig | legacy | kubectl port-forward to the router Service | yes | - |
| SandboxInClusterConnectionConfig | legacy | pod IP, else the Service DNS name | no | - |
| SandboxdPodTunnelConnectionConfig | sandboxd | kubectl port-forward to the pod | no | the tunnel |
| SandboxdInClusterConnectionConfig | sandboxd | pod IP or serviceFQDN, re-read per call | no | same host |
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from . import _kube, metrics
from ._claims import SandboxView
from ._headers import merge_headers, routing_headers
from ._steps import Flow, Sleep, TlsSettings
from .exceptions import (
    SandboxNoServiceError,
    SandboxNotReadyError,
    SandboxPortForwardError,
    SandboxRequestError,
    SandboxTimeoutError,
)
from .models import (
    SandboxConnectionConfig,
    SandboxdDirectConnectionConfig,
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
)

__all__ = ["DISCOVERY_LATENCY", "Connection", "Runtime", "Target", "runtime_of"]

#: The histogram of endpoint discovery (spec §3.12), upstream's name.
DISCOVERY_LATENCY = "sandbox_client_discovery_latency_ms"

Runtime = Literal["legacy", "sandboxd"]
_SANDBOXD_CONFIGS = (
    SandboxdDirectConnectionConfig,
    SandboxdInClusterConnectionConfig,
    SandboxdPodTunnelConnectionConfig,
)


def runtime_of(config: SandboxConnectionConfig) -> Runtime:
    """Which runtime protocol a connection config speaks (there is no auto-detection, spec §2)."""
    return "sandboxd" if isinstance(config, _SANDBOXD_CONFIGS) else "legacy"


def _host(ip_or_name: str) -> str:
    try:
        return f"[{ip_or_name}]" if ipaddress.ip_address(ip_or_name).version == 6 else ip_or_name
    except ValueError:
        return ip_or_name


@dataclass(frozen=True)
class Target:
    """Where one call goes."""

    base_url: str
    runtime: Runtime
    #: Headers for every HTTP call (extra headers + routing headers without the per-call timeout).
    headers: dict[str, str] = field(default_factory=dict)
    routed: bool = False
    routing: dict[str, Any] = field(default_factory=dict)
    tls: TlsSettings | None = None
    grpc_target: str | None = None
    grpc_metadata: tuple[tuple[str, str], ...] = ()

    def http_headers(self, per_call: dict[str, str] | None, timeout: float | None) -> dict[str, str]:
        """extra_headers < per-call headers < routing headers (with `X-Sandbox-Timeout` for this call)."""
        routing = routing_headers(**self.routing, timeout=timeout) if self.routed else {}
        return merge_headers(self.headers, per_call, routing)


class PortForward:
    """One `kubectl port-forward` process to a free local port (tunnel modes)."""

    def __init__(self, args: list[str], remote_ports: list[int], kubectl_flags: list[str]) -> None:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise SandboxPortForwardError("kubectl is not on PATH; tunnel connection modes need it")
        self.local_ports = [_free_port() for _ in remote_ports]
        mapping = [f"{lp}:{rp}" for lp, rp in zip(self.local_ports, remote_ports, strict=True)]
        cmd = [
            kubectl,
            *kubectl_flags,
            "port-forward",
            *args,
            *mapping,
        ]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._ready = False

    def ready(self) -> bool:
        """Every local port accepts connections (kubectl binds them one after the other); sticky once true."""
        if not self._ready:
            self._ready = all(_accepts(port) for port in self.local_ports)
        return self._ready

    def died(self) -> str | None:
        if self.process.poll() is None:
            return None
        err = (self.process.stderr.read() if self.process.stderr else b"").decode(errors="replace")
        return f"kubectl port-forward exited with {self.process.returncode}: {err.strip()[-500:]}"

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.05)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Connection:
    """The transport state of one sandbox handle."""

    def __init__(
        self,
        config: SandboxConnectionConfig,
        *,
        sandbox_id: str,
        namespace: str,
        pod_ip: str | None = None,
        kubectl_flags: list[str] | None = None,
    ) -> None:
        self.config = config
        self.sandbox_id = sandbox_id
        self.namespace = namespace
        self.runtime: Runtime = runtime_of(config)
        self._pod_ip = pod_ip
        #: `--kubeconfig` / `--context` of the SDK's own configuration, for the kubectl of a tunnel.
        self._kubectl_flags = kubectl_flags or []
        self._gateway_url: str | None = None
        self._tunnel: PortForward | None = None
        self.closed = False

    # ----------------------------------------------------------------------------------------- state

    def failed(self) -> None:
        """After a 5xx or a transport failure: drop the cached pod IP and the tunnel."""
        self._pod_ip = None
        self._close_tunnel()

    def close(self) -> None:
        self.closed = True
        self._close_tunnel()

    def _close_tunnel(self) -> None:
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            tunnel.close()

    def set_pod_ip(self, ip: str | None) -> None:
        self._pod_ip = ip

    # ----------------------------------------------------------------------------------------- flows

    def sandbox(self) -> Flow[SandboxView | None]:
        obj = yield from _kube.get(_kube.SANDBOXES, self.namespace, self.sandbox_id)
        return SandboxView.of(obj) if obj is not None else None

    def _pod_ip_lazily(self) -> Flow[str | None]:
        """The cached pod IP, else one GET of the Sandbox; lookup failures are swallowed (spec §3.6)."""
        if self._pod_ip is None:
            try:
                view = yield from self.sandbox()
            except SandboxRequestError:
                view = None
            self._pod_ip = view.pod_ip if view else None
        return self._pod_ip

    def resolve(self) -> Flow[Target]:
        """The target of the next call (see the module table)."""
        if self.closed:
            raise SandboxNotReadyError(f"the connection to sandbox {self.sandbox_id} was closed")
        cfg = self.config
        routing = {"sandbox_id": self.sandbox_id, "namespace": self.namespace}
        if isinstance(cfg, SandboxDirectConnectionConfig | SandboxdDirectConnectionConfig):
            ip = (yield from self._pod_ip_lazily()) if cfg.routes_by_pod_ip else None
            tls = TlsSettings(cfg.ca_cert, cfg.client_cert) if (cfg.ca_cert or cfg.client_cert) else None
            if isinstance(cfg, SandboxDirectConnectionConfig):
                return Target(
                    cfg.api_url.rstrip("/"),
                    "legacy",
                    dict(cfg.extra_headers),
                    True,
                    {**routing, "port": cfg.server_port, "pod_ip": ip},
                    tls,
                )
            grpc_headers = routing_headers(**routing, port=cfg.grpc_port, pod_ip=ip, timeout=None)
            metadata = tuple(
                (k.lower(), v) for k, v in merge_headers(cfg.extra_headers, grpc_headers).items()
            )
            return Target(
                cfg.api_url.rstrip("/"),
                "sandboxd",
                dict(cfg.extra_headers),
                True,
                {**routing, "port": cfg.rest_port, "pod_ip": ip},
                tls,
                grpc_target(cfg.api_url),
                metadata,
            )
        if isinstance(cfg, SandboxGatewayConnectionConfig):
            if self._gateway_url is None:
                with metrics.timed(DISCOVERY_LATENCY, mode="gateway"):
                    self._gateway_url = yield from _gateway_url(cfg)
            ip = yield from self._pod_ip_lazily()
            return Target(
                self._gateway_url, "legacy", {}, True, {**routing, "port": cfg.server_port, "pod_ip": ip}
            )
        if isinstance(cfg, SandboxLocalTunnelConnectionConfig):
            port = yield from self._tunnel_port(
                "port_forward",
                ["svc/sandbox-router-svc", "-n", cfg.router_namespace],
                [8080],
                cfg.port_forward_ready_timeout,
            )
            ip = yield from self._pod_ip_lazily()
            return Target(
                f"http://127.0.0.1:{port[0]}",
                "legacy",
                {},
                True,
                {**routing, "port": cfg.server_port, "pod_ip": ip},
            )
        if isinstance(cfg, SandboxInClusterConnectionConfig):
            ip = yield from self._pod_ip_lazily()
            host = _host(ip) if ip else f"{self.sandbox_id}.{self.namespace}.svc.cluster.local"
            return Target(f"http://{host}:{cfg.server_port}", "legacy")
        if isinstance(cfg, SandboxdPodTunnelConnectionConfig):
            view = yield from self.sandbox()
            pod = view.pod_name if view else self.sandbox_id
            ports = yield from self._tunnel_port(
                "sandboxd_pod_tunnel",
                [f"pod/{pod}", "-n", self.namespace],
                [cfg.rest_port, cfg.grpc_port],
                cfg.port_forward_ready_timeout,
            )
            return Target(f"http://127.0.0.1:{ports[0]}", "sandboxd", grpc_target=f"127.0.0.1:{ports[1]}")
        if isinstance(cfg, SandboxdInClusterConnectionConfig):
            view = yield from self.sandbox()  # re-read before each operation: pods move
            if cfg.mode == "in-cluster-service":
                if view is None or not view.service_fqdn:
                    raise SandboxNoServiceError(
                        f"Sandbox {self.namespace}/{self.sandbox_id} has no status.serviceFQDN "
                        "(enable spec.service on its template, or use mode='in-cluster-pod-ip')"
                    )
                host = view.service_fqdn
            else:
                if view is None or not view.pod_ip:
                    raise SandboxNotReadyError(
                        f"Sandbox {self.namespace}/{self.sandbox_id} has no pod IP yet"
                    )
                host = _host(view.pod_ip)
            return Target(f"http://{host}:{cfg.rest_port}", "sandboxd", grpc_target=f"{host}:{cfg.grpc_port}")
        raise TypeError(f"unsupported connection config {type(cfg).__name__}")

    def _tunnel_port(
        self, mode: str, args: list[str], remote: list[int], ready_timeout: float
    ) -> Flow[list[int]]:
        """The local ports of a ready tunnel, starting one if there is none (or it died)."""
        tunnel = self._tunnel
        if tunnel is None or tunnel.died() is not None:
            self._close_tunnel()
            # Only the call that starts the tunnel times it (upstream: per tunnel start, not per call).
            with metrics.timed(DISCOVERY_LATENCY, mode=mode):
                tunnel = self._tunnel = PortForward(args, remote, self._kubectl_flags)
                return (yield from self._tunnel_ready(tunnel, args[0], ready_timeout))
        return (yield from self._tunnel_ready(tunnel, args[0], ready_timeout))

    def _tunnel_ready(self, tunnel: PortForward, what: str, ready_timeout: float) -> Flow[list[int]]:
        # Concurrent calls of an async handle share the tunnel: each waits until it is ready, not only the
        # call that started it (others would connect to a port kubectl has not bound yet).
        deadline = time.monotonic() + ready_timeout
        while not tunnel.ready():
            if (why := tunnel.died()) is not None:
                if self._tunnel is tunnel:
                    self._tunnel = None
                raise SandboxPortForwardError(why)
            if time.monotonic() > deadline:
                if self._tunnel is tunnel:
                    self._close_tunnel()
                raise SandboxTimeoutError(f"kubectl port-forward {what} not ready within {ready_timeout:g} s")
            yield Sleep(0.05)
        return tunnel.local_ports


def _gateway_url(cfg: SandboxGatewayConnectionConfig) -> Flow[str]:
    """`http://<first valid status.addresses[].value>` of the Gateway, waiting up to its ready timeout."""
    res = _kube.KubeResource("gateway.networking.k8s.io", "v1", "gateways")
    deadline = time.monotonic() + cfg.gateway_ready_timeout
    while True:
        gw = yield from _kube.get(res, cfg.gateway_namespace, cfg.gateway_name)
        for addr in ((gw or {}).get("status") or {}).get("addresses") or []:
            value = str((addr or {}).get("value") or "")
            if _valid_gateway_address(value):
                return f"http://{_host(value)}"
        if time.monotonic() > deadline:
            raise SandboxTimeoutError(
                f"Gateway {cfg.gateway_namespace}/{cfg.gateway_name} has no address after "
                f"{cfg.gateway_ready_timeout} s"
            )
        yield Sleep(1.0)


def _valid_gateway_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if not value or any(c in value for c in "/?#@ ") or all(label.isdigit() for label in labels):
        return False
    return all(0 < len(label) <= 63 for label in labels)


def grpc_target(api_url: str) -> str:
    """The gRPC `host:port` of a router URL (IPv6 hosts bracketed; default port by scheme)."""
    split = urlsplit(api_url)
    host = split.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{split.port or (443 if split.scheme == 'https' else 80)}"
