"""Service routing for the API server's own outbound calls (what kube-proxy does for it on a real node).

The dev cluster has no kube-proxy and its ClusterIPs (10.96.0.0/16) must never be dialled. With
``ClusterConfig.service_proxy`` on, kube-apiserver gets an EgressSelectorConfiguration whose ``cluster``
network (webhooks, aggregated APIs, kubelet proxying) goes through this process as HTTP CONNECT over a
unix socket. The API server then calls a webhook registered by **Service reference** exactly as in a
real cluster (ClusterIP resolution, TLS to ``<service>.<namespace>.svc`` with the CRD's caBundle); this
process only turns the ``CONNECT <clusterIP>:<port>`` into a connection to a Ready pod behind the Service:

* ClusterIP -> Service (by ``spec.clusterIP``) -> Service port -> ``targetPort`` (a number, or a container
  port name resolved in the chosen pod, as the endpoints controller does) -> a Ready pod matching the
  selector, in its 127.x pod IP (EndpointSlices cannot hold loopback addresses, so pods are read directly).
* A loopback destination (kwok's server, dev-mode ``url:`` webhooks) is passed through unchanged.
* Anything else is refused with 403: nothing here ever connects outside 127.0.0.0/8.

Runs as its own process (``python -m agent_sandbox.devcluster.serviceproxy``), started before the API
server and stopped by ``DevCluster.down`` like every component. Authenticates with the admin kubeconfig.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_sandbox.api.errortext import describe_error
from agent_sandbox.devcluster.processes import run_component
from agent_sandbox.kube import POD, SERVICE, ApiClient

log = logging.getLogger("service-proxy")

_MAX_HEAD = 8192


class ProxyRefused(Exception):
    """The CONNECT target cannot (or must not) be reached; the message goes back to the API server."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True, slots=True)
class Target:
    """Where a CONNECT goes, and why (for the log)."""

    host: str
    port: int
    via: str


# -- pure decisions ---------------------------------------------------------------------------------------
def parse_connect(head: bytes) -> tuple[str, int]:
    """``(host, port)`` of an HTTP CONNECT request head.

    Raises:
        ProxyRefused: not a well-formed CONNECT (400).
    """
    try:
        line = head.split(b"\r\n", 1)[0].decode("ascii")
        method, authority, _version = line.split(" ")
        host, _, port = authority.rpartition(":")
        if method != "CONNECT" or not host or not port.isdigit():
            raise ValueError(line)
        return host.strip("[]"), int(port)
    except ValueError as exc:
        raise ProxyRefused(400, f"expected 'CONNECT host:port HTTP/1.1', got {head[:80]!r}") from exc


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    return (
        bool(status.get("podIP"))
        and conds.get("Ready") == "True"
        and not pod["metadata"].get("deletionTimestamp")
    )


def _matches(selector: Mapping[str, str], pod: Mapping[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _container_port(pod: Mapping[str, Any], name: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


def resolve_service(
    services: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], ip: str, port: int
) -> Target:
    """The Ready pod address behind ``ip:port`` (a ClusterIP and Service port).

    ``pods`` are the candidates of the Service's namespace; the first Ready match is used (the API server
    keeps its webhook connections alive, so spreading load would buy nothing here).

    Raises:
        ProxyRefused: no such Service or port (404), no Ready pod or unresolvable port name (503).
    """
    svc = next((s for s in services if (s.get("spec") or {}).get("clusterIP") == ip), None)
    if svc is None:
        raise ProxyRefused(404, f"no Service has clusterIP {ip}")
    meta, spec = svc["metadata"], svc["spec"]
    name = f"{meta['namespace']}/{meta['name']}"
    svc_port = next((p for p in spec.get("ports") or () if int(p["port"]) == port), None)
    if svc_port is None:
        raise ProxyRefused(404, f"Service {name} has no port {port}")
    selector = spec.get("selector") or {}
    if not selector:
        raise ProxyRefused(503, f"Service {name} has no selector")
    target = svc_port.get("targetPort", port)
    for pod in pods:
        if (
            pod["metadata"].get("namespace") != meta["namespace"]
            or not _matches(selector, pod)
            or not _ready(pod)
        ):
            continue
        number = target if isinstance(target, int) else _container_port(pod, str(target))
        if number is None:
            continue
        return Target(pod["status"]["podIP"], int(number), f"{name}:{port} -> pod {pod['metadata']['name']}")
    raise ProxyRefused(503, f"Service {name} has no Ready pod serving port {target!r}")


# -- I/O ----------------------------------------------------------------------------------------------------
class ServiceProxy:
    """The CONNECT server on a unix socket."""

    def __init__(self, client: ApiClient) -> None:
        self.client = client

    async def target(self, host: str, port: int) -> Target:
        if is_loopback(host):
            return Target(host, port, "loopback")
        try:
            ipaddress.ip_address(host)
        except ValueError as exc:
            raise ProxyRefused(403, f"{host} is not an IP address (only ClusterIPs and loopback)") from exc
        services = await self.client.list(SERVICE)
        svc = next((s for s in services if (s.get("spec") or {}).get("clusterIP") == host), None)
        if svc is None:
            raise ProxyRefused(403, f"{host} is neither loopback nor a ClusterIP: refusing to dial it")
        pods = await self.client.list(POD, namespace=svc["metadata"]["namespace"])
        return resolve_service([svc], pods, host, port)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            host, port = parse_connect(head)
            target = await self.target(host, port)
            up_reader, up_writer = await asyncio.open_connection(target.host, target.port)
        except ProxyRefused as exc:
            log.warning("refused: %s", describe_error(exc))
            writer.write(f"HTTP/1.1 {exc.status} {exc}\r\n\r\n".encode())
            await _close(writer)
            return
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            log.warning("connect failed: %s", describe_error(exc))
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            await _close(writer)
            return
        log.info("CONNECT %s:%s via %s -> %s:%s", host, port, target.via, target.host, target.port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    async def serve(self, socket_path: Path, ready_file: Path | None) -> None:
        await asyncio.to_thread(socket_path.unlink, missing_ok=True)
        server = await asyncio.start_unix_server(self.handle, path=str(socket_path), limit=_MAX_HEAD)
        if ready_file is not None:
            await asyncio.to_thread(ready_file.write_text, "ready\n")
        log.info("ready: CONNECT proxy on %s", socket_path)
        async with server:
            await server.serve_forever()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        await _close(dst)


async def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        writer.close()
        await writer.wait_closed()


async def _main(args: argparse.Namespace) -> None:
    client = await ApiClient.from_kubeconfig(args.kubeconfig, qps=-1.0, burst=100)
    try:
        await ServiceProxy(client).serve(
            Path(args.socket), Path(args.ready_file) if args.ready_file else None
        )
    finally:
        await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="service-proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--socket", required=True, help="unix socket the API server's egress selector dials")
    parser.add_argument("--ready-file", default="", help="written once the socket listens")
    args = parser.parse_args(argv)
    return run_component(_main(args))


if __name__ == "__main__":
    sys.exit(main())
