"""Kubeconfigs that reach the API server through something: an SSH tunnel whose certificate is named by
`tls-server-name`, an HTTP proxy or a SOCKS5 proxy (`ssh -D`) named by `proxy-url`. kubectl works with
each; until December 6 the SDK and the CLI failed the tunnel's certificate check and went around the
proxies (lightkube's kubeconfig model drops both fields), which on a network that only the proxy can
leave means no answer at all."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from agent_sandbox.cli.main import main
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxError,
)
from tests.loopback_relays import Relays, loopback_relays

pytestmark = pytest.mark.integration

#: Listing needs no router; the clients want a connection config all the same.
ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")


@pytest.fixture(scope="module")
def relays(controller: Started) -> Iterator[Relays]:
    """The relays, on a cluster whose CRDs the controller has installed."""
    with loopback_relays() as running:
        yield running


def _kubeconfig(cluster: DevCluster, directory: Path, **fields: str) -> Path:
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["clusters"][0]["cluster"].update(fields)
    path = directory / "reach.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _lists_through_every_client(kubeconfig: Path, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    with SandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
        assert client.list_sandboxes(namespace) == []

    async def async_list() -> list[object]:
        async with AsyncSandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
            return list(await client.list_warm_pools(namespace))

    assert asyncio.run(async_list()) == []
    code = main(["list", "-n", namespace, "--kubeconfig", str(kubeconfig), "--router-url", ROUTER.api_url])
    out = capsys.readouterr()
    assert code == 0, out
    assert (out.out, out.err) == ("", f"No resources found in {namespace} namespace.\n")


def test_an_ssh_tunnel_with_tls_server_name_is_trusted_as_kubectl_trusts_it(
    cluster: DevCluster, namespace: str, relays: Relays, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """127.0.0.2 is not among the API server certificate's names; `kubernetes` is."""
    api_port = urlsplit(cluster.server).port
    assert api_port is not None
    tunnel = relays.forwarder("127.0.0.2", api_port)
    server = f"https://127.0.0.2:{tunnel}"

    without = _kubeconfig(cluster, tmp_path, server=server)
    with SandboxClient(ROUTER, kubeconfig=str(without)) as client, pytest.raises(SandboxError) as refused:
        client.list_sandboxes(namespace)
    assert "certificate is not valid for '127.0.0.2'" in str(refused.value)

    kubeconfig = _kubeconfig(cluster, tmp_path, server=server, **{"tls-server-name": "kubernetes"})
    assert cluster.kubectl("--kubeconfig", str(kubeconfig), "get", "namespace", namespace).returncode == 0
    _lists_through_every_client(kubeconfig, namespace, capsys)
    assert len(relays.targets[tunnel]) >= 4  # the refused client, kubectl, and the three here


@pytest.mark.parametrize("kind", ["http", "socks5"])
def test_every_api_request_goes_through_the_kubeconfigs_proxy_url(
    cluster: DevCluster,
    namespace: str,
    relays: Relays,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
) -> None:
    """The proxy-url wins over the environment's proxy, as in kubectl: HTTPS_PROXY names a closed port."""
    port = relays.http_proxy() if kind == "http" else relays.socks5_proxy()
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    kubeconfig = _kubeconfig(cluster, tmp_path, **{"proxy-url": f"{kind}://127.0.0.1:{port}"})
    _lists_through_every_client(kubeconfig, namespace, capsys)
    api = urlsplit(cluster.server).netloc
    # one connection per client (the sync client, the async client, the CLI's), each tunnelled to the API server
    assert relays.targets[port] == [api] * 3, relays.targets[port]
