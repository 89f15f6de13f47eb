"""An application that hands the SDK its `kubernetes` / `kubernetes_asyncio` ApiClient (upstream's SDK takes
one as `api_client`) keeps working after the client's token expires. Those clients refresh credentials
inside their Configuration (an exec plugin re-run by `refresh_api_key_hook` once its token expires - EKS
tokens last 15 minutes -, the rotated service-account token re-read in a pod, kubernetes_asyncio's
`refresh_token` task rewriting `api_key`); until December 6 the SDK copied the first token, and every call after its expiry was
a 401. Here the plugin's first token is revoked (its ServiceAccount deleted) once a second one is on offer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import kubernetes
import kubernetes_asyncio
import pytest
import yaml

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxDirectConnectionConfig, SandboxError
from tests.helpers import wait_for
from tests.integration.cli.conftest import role_kubeconfig

pytestmark = pytest.mark.integration

ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")
CLAIMS_RULE = {
    "apiGroups": ["extensions.agents.x-k8s.io"],
    "resources": ["sandboxclaims"],
    "verbs": ["list"],
}
LIFETIME = 2  # seconds a plugin token claims to be valid


def _plugin_kubeconfig(cluster: DevCluster, namespace: str, tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """A kubeconfig whose exec plugin hands out the token in `current` (expiring LIFETIME s after each run),
    and the tokens of two ServiceAccounts allowed to list claims."""
    tokens = []
    for account in ("first", "second"):
        config = role_kubeconfig(cluster, namespace, account, [CLAIMS_RULE], tmp_path)
        tokens.append(yaml.safe_load(config.read_text())["users"][0]["user"]["token"])
    current = tmp_path / "current-token"
    current.write_text(tokens[0])
    plugin = tmp_path / "plugin"
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential"}
    plugin.write_text(
        "#!/usr/bin/env python3\nimport datetime, json\n"
        f"expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds={LIFETIME})\n"
        f"credential = {json.dumps(credential)}\n"
        f"credential['status'] = {{'token': open({str(current)!r}).read(),\n"
        "    'expirationTimestamp': expires.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
        "print(json.dumps(credential))\n"
    )
    plugin.chmod(0o755)
    doc = yaml.safe_load(config.read_text())
    doc["users"][0]["user"] = {
        "exec": {"apiVersion": credential["apiVersion"], "command": str(plugin), "interactiveMode": "Never"}
    }
    kubeconfig = tmp_path / "plugin.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(doc))
    return kubeconfig, current, tokens


def _revoke_first(cluster: DevCluster, namespace: str, current: Path, second: str) -> None:
    current.write_text(second)
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/first"
    assert cluster.admin().request("DELETE", path)[0] == 200
    # kube-apiserver caches a token's successful authentication for 10 s: after that the first token is
    # refused (401), and it has long expired to the plugin's word
    time.sleep(11)


def _listed(call: object) -> bool | None:
    try:
        call()  # type: ignore[operator]
        return True
    except SandboxError as err:
        if "403" in str(err):  # the RoleBinding is not seen yet
            return None
        raise


async def _list_once_allowed(client: AsyncSandboxClient, namespace: str) -> list[object]:
    """List, waiting out the 403s of a RoleBinding the authorizer has not seen yet; any other error raises."""
    for _ in range(100):
        try:
            return list(await client.list_sandboxes(namespace))
        except SandboxError as err:
            if "403" not in str(err):
                raise
        await asyncio.sleep(0.1)
    raise AssertionError("the role never applied")


def test_a_kubernetes_api_clients_refreshed_token_is_used(
    cluster: DevCluster, namespace: str, controller: Started, tmp_path: Path
) -> None:
    kubeconfig, current, tokens = _plugin_kubeconfig(cluster, namespace, tmp_path)
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    with SandboxClient(ROUTER, api_client=kubernetes.client.ApiClient(cfg)) as client:
        wait_for(lambda: _listed(lambda: client.list_sandboxes(namespace)), what="the role to apply")
        _revoke_first(cluster, namespace, current, tokens[1])
        # the hook re-ran the plugin: the second token
        wait_for(lambda: _listed(lambda: client.list_sandboxes(namespace)), what="the second role to apply")
        assert client.list_sandboxes(namespace) == []


def test_a_kubernetes_asyncio_clients_refreshed_token_is_used(
    cluster: DevCluster, namespace: str, controller: Started, tmp_path: Path
) -> None:
    kubeconfig, current, tokens = _plugin_kubeconfig(cluster, namespace, tmp_path)

    async def main() -> None:
        cfg = kubernetes_asyncio.client.Configuration()
        loader = await kubernetes_asyncio.config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=cfg
        )
        api = kubernetes_asyncio.client.ApiClient(cfg)
        try:
            async with AsyncSandboxClient(ROUTER, api_client=api, cleanup=False) as client:
                await _list_once_allowed(client, namespace)
                await asyncio.to_thread(_revoke_first, cluster, namespace, current, tokens[1])
                # what kubernetes_asyncio's `refresh_token` task does every interval, done here at a known time
                # (a cancelled task could leave its plugin subprocess to a closed loop)
                assert await loader.load_from_exec_plugin()
                cfg.api_key["BearerToken"] = loader.token
                assert await _list_once_allowed(client, namespace) == []  # a 401 would raise
        finally:
            await api.close()

    asyncio.run(main())
