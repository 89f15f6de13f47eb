"""A kubeconfig whose user is an exec credential plugin - how EKS, GKE, AKS and OIDC logins authenticate -
works for the SDK (sync and async) and the CLI against a real API server. lightkube, which the SDK reads
kubeconfigs with, refuses `client.authentication.k8s.io/v1`, the GA version current plugins write: until
December 5 every call failed with "auth exec api version ... not implemented"."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
from tests.exec_plugins import admin_certificate, certificate_plugin_kubeconfig
from tests.helpers import wait_for
from tests.integration.cli.conftest import role_kubeconfig

pytestmark = pytest.mark.integration

#: Listing needs no router; the async client wants a connection config all the same.
ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")
CLAIMS_RULE = {
    "apiGroups": ["extensions.agents.x-k8s.io"],
    "resources": ["sandboxclaims"],
    "verbs": ["get", "list", "watch", "create", "delete"],
}


def _exec_kubeconfig(token_config: Path, directory: Path, api_version: str) -> tuple[Path, Path]:
    """The token kubeconfig rewritten to get its token from a plugin script beside it (named relative to the
    kubeconfig, as kubectl resolves it); the plugin appends a line to a log each time it runs."""
    doc = yaml.safe_load(token_config.read_text())
    token = doc["users"][0]["user"].pop("token")
    runs = directory / "plugin-runs.log"
    expires = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    credential = {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "status": {"token": token, "expirationTimestamp": expires},
    }
    plugin = directory / "bin" / "token-plugin"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(
        f"#!/bin/sh\necho \"$KUBERNETES_EXEC_INFO\" >> {runs}\ncat <<'EOF'\n{json.dumps(credential)}\nEOF\n"
    )
    plugin.chmod(0o755)
    doc["users"][0]["user"]["exec"] = {
        "apiVersion": api_version,
        "command": "./bin/token-plugin",
        "interactiveMode": "Never",
        "installHint": "install token-plugin",
    }
    path = directory / "exec.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path, runs


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
def test_an_exec_plugin_kubeconfig_authenticates_the_sdk_and_the_cli(
    cluster: DevCluster,
    namespace: str,
    controller: Started,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    api_version: str,
) -> None:
    account = "exec-" + api_version.rsplit("/", 1)[1]
    token_config = role_kubeconfig(cluster, namespace, account, [CLAIMS_RULE], tmp_path)
    kubeconfig, runs = _exec_kubeconfig(token_config, tmp_path, api_version)

    with SandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
        listed = wait_for(
            lambda: _listed(client, namespace), what="the role to apply (the authorizer's informer)"
        )
        assert listed == ([],)
        assert client.list_sandboxes(namespace) == []

    async def async_list() -> list[object]:
        async with AsyncSandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
            return list(await client.list_sandboxes(namespace))

    assert asyncio.run(async_list()) == []
    code = main(
        ["list", "-n", namespace, "--kubeconfig", str(kubeconfig), "--router-url", "http://127.0.0.1:9"]
    )
    assert code == 0, capsys.readouterr()

    # The plugin was told the protocol version, non-interactively, and its token was reused until expiry: one
    # run per client (the sync client's calls shared one token; the async client and the CLI are new ones).
    info = [json.loads(line) for line in runs.read_text().splitlines()]
    assert info[0] == {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    assert len(info) == 3, info


def _listed(client: SandboxClient, namespace: str) -> tuple[list[object]] | None:
    try:
        return (list(client.list_sandboxes(namespace)),)
    except SandboxError as err:
        if "403" in str(err):  # the binding is not seen yet
            return None
        raise


def test_a_missing_plugin_names_its_install_hint(cluster: DevCluster, tmp_path: Path) -> None:
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    user = doc["users"][0]["user"]
    for key in list(user):
        del user[key]
    user["exec"] = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": "no-such-credential-plugin",
        "interactiveMode": "Never",
        "installHint": "run: install-the-plugin",
    }
    path = tmp_path / "missing.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    with SandboxClient(ROUTER, kubeconfig=str(path)) as client, pytest.raises(SandboxError) as info:
        client.list_sandboxes("default")
    assert (
        str(info.value)
        == "kubeconfig exec plugin 'no-such-credential-plugin' not found: run: install-the-plugin"
    )


def test_an_exec_plugin_that_gives_a_client_certificate_authenticates_the_sdk_and_the_cli(
    cluster: DevCluster, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Until December 6 the SDK refused such a plugin ("returned a client certificate: this SDK takes bearer
    tokens"), so Teleport and Pinniped users could not use the SDK or the CLI where kubectl works."""
    status = admin_certificate(cluster, lifetime=timedelta(hours=1), user="exec-cert-user")
    kubeconfig, runs = certificate_plugin_kubeconfig(cluster, tmp_path, [status])

    with SandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
        assert client.list_sandboxes(namespace) == []
        assert client.list_sandboxes(namespace) == []

    async def async_list() -> list[object]:
        async with AsyncSandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
            return list(await client.list_sandboxes(namespace))

    assert asyncio.run(async_list()) == []
    code = main(["pools", "-n", namespace, "--kubeconfig", str(kubeconfig)])
    assert code == 0, capsys.readouterr()
    assert len(runs.read_text().splitlines()) == 3  # one run per client: the certificate is kept until expiry


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_renewed_client_certificate_is_presented_on_new_connections_before_the_old_one_expires(
    cluster: DevCluster, namespace: str, tmp_path: Path, flavour: str
) -> None:
    """kube-apiserver checks a client certificate's validity at every request, also on a connection opened while
    it was valid. A certificate loaded into the connection pool in use would keep being presented after the
    renewal, and every request past its expiry is refused (401, retried on the same connection: 401 again).
    Each certificate gets its own pool, so requests after a renewal travel on connections with the new one."""
    lifetime = 14.0  # renewed 10 s before expiry: after ~4 s
    short = admin_certificate(cluster, lifetime=timedelta(seconds=lifetime), user="exec-cert-short")
    later = admin_certificate(cluster, lifetime=timedelta(hours=1), user="exec-cert-later")
    kubeconfig, runs = certificate_plugin_kubeconfig(cluster, tmp_path, [short, later])
    deadline = time.monotonic() + lifetime + 4.0

    def sync_calls() -> int:
        calls = 0
        with SandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
            while time.monotonic() < deadline:  # one request a second keeps the pooled connection alive
                assert client.list_sandboxes(namespace) == []
                calls += 1
                time.sleep(1.0)
        return calls

    async def async_calls() -> int:
        calls = 0
        async with AsyncSandboxClient(ROUTER, kubeconfig=str(kubeconfig)) as client:
            while time.monotonic() < deadline:
                assert list(await client.list_sandboxes(namespace)) == []
                calls += 1
                await asyncio.sleep(1.0)
        return calls

    calls = sync_calls() if flavour == "sync" else asyncio.run(async_calls())
    assert calls >= lifetime  # requests went on past the first certificate's expiry
    assert len(runs.read_text().splitlines()) == 2
