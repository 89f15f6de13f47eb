"""The controller's client reaches the real API server through kubeconfigs as kubectl reads them.

A `$KUBECONFIG` list whose first file only picks the context; an SSH-tunnel-like TCP forwarder on
127.0.0.2 (an address the API server's certificate does not name) with `tls-server-name`; an HTTP CONNECT
proxy given as `proxy-url`. Every listener is on loopback and only ever dials 127.0.0.0/8.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import NAMESPACE, ApiClient, TransportError, load_config
from tests.loopback_relays import Relays, loopback_relays

pytestmark = pytest.mark.integration


def _api_address(cluster: DevCluster) -> tuple[str, int]:
    parts = urlsplit(cluster.server)
    assert parts.hostname is not None
    assert parts.port is not None
    return parts.hostname, parts.port


def _kubeconfig_with(cluster: DevCluster, path: Path, **cluster_fields: Any) -> Path:
    """The cluster's admin kubeconfig with fields of its one cluster entry replaced (None: removed)."""
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    body = doc["clusters"][0]["cluster"]
    for key, value in cluster_fields.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def relays() -> Iterator[Relays]:
    with loopback_relays() as running:
        yield running


async def _list_and_watch(api: ApiClient) -> None:
    names = {ns["metadata"]["name"] for ns in await api.list(NAMESPACE)}
    assert {"default", "kube-system"} <= names
    async for event in api.watch(NAMESPACE, timeout_seconds=5):
        assert event.type == "ADDED"  # no resourceVersion: the existing namespaces come first
        break


async def test_kubeconfig_list_first_file_picks_the_context(
    cluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = yaml.safe_load(cluster.kubeconfig.read_text())["current-context"]
    picker = tmp_path / "picker"
    picker.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": context}))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(picker), str(cluster.kubeconfig)]))

    config = load_config()
    assert config.server == cluster.server
    async with ApiClient(config) as api:
        names = {ns["metadata"]["name"] for ns in await api.list(NAMESPACE)}
    assert "kube-system" in names


async def test_tls_server_name_verifies_a_tunnel_against_the_certificate_name(
    cluster: DevCluster, relays: Relays, tmp_path: Path
) -> None:
    tunnel = f"https://127.0.0.2:{relays.forwarder('127.0.0.2', _api_address(cluster)[1])}"
    named = _kubeconfig_with(cluster, tmp_path / "named", server=tunnel, **{"tls-server-name": "kubernetes"})
    async with ApiClient(load_config(named), separate_watch_connection=True) as api:
        await _list_and_watch(api)

    # The same tunnel without the name: 127.0.0.2 is not in the certificate, as kubectl would also say.
    unnamed = _kubeconfig_with(cluster, tmp_path / "unnamed", server=tunnel, **{"tls-server-name": None})
    async with ApiClient(load_config(unnamed)) as api:
        with pytest.raises(TransportError) as err:
            await api.list(NAMESPACE)
    assert isinstance(err.value.__cause__, aiohttp.ClientConnectorCertificateError), err.value


async def test_proxy_url_carries_lists_and_watches_through_http_connect(
    cluster: DevCluster, relays: Relays, tmp_path: Path
) -> None:
    port = relays.http_proxy()
    targets = relays.targets[port]
    proxied = _kubeconfig_with(cluster, tmp_path / "proxied", **{"proxy-url": f"http://127.0.0.1:{port}"})
    async with ApiClient(load_config(proxied), separate_watch_connection=True) as api:
        names = {ns["metadata"]["name"] for ns in await api.list(NAMESPACE)}
        assert "kube-system" in names
        listed = len(targets)
        assert listed >= 1
        async for _ in api.watch(NAMESPACE, timeout_seconds=5):  # its own pool: a fresh tunnel
            break
    api_host, api_port = _api_address(cluster)
    assert len(targets) > listed
    assert set(targets) == {f"{api_host}:{api_port}"}
