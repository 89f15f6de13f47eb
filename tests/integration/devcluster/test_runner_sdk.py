"""The published upstream SDK `k8s-agent-sandbox==1.0.8`, unchanged, against the dev cluster with its runner.

The SDK creates a claim from a warm pool (the real controller binds it), reads the Sandbox's pod IP from
the API, and talks straight to the runtime the runner serves there: the legacy protocol through
`SandboxInClusterConnectionConfig`, sandboxd (REST + gRPC) through `SandboxdInClusterConnectionConfig`, and
sandboxd through `SandboxdPodTunnelConnectionConfig` (its own `kubectl port-forward pod/<pod>`, through the API
server to kwok, the dev cluster's kubelet).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import ApiClient
from tests.integration.devcluster.runtime_helpers import create_runtime_pool
from tests.upstream_sdk import ensure_upstream_sdk, run_script

pytestmark = pytest.mark.integration


_SCRIPT = r"""
import json, sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import (
    SandboxInClusterConnectionConfig, SandboxdInClusterConnectionConfig, SandboxdPodTunnelConnectionConfig,
)
ns, mode = sys.argv[1], sys.argv[2]
config = {
    "legacy": SandboxInClusterConnectionConfig(),
    "sandboxd": SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip"),
    "sandboxd-tunnel": SandboxdPodTunnelConnectionConfig(),
}[mode]
client = SandboxClient(connection_config=config)
sb = client.create_sandbox("pool", namespace=ns, sandbox_ready_timeout=90)
out = {}
r = sb.commands.run("echo hello")
out["run"] = [r.stdout, r.exit_code]
sb.files.write("dir/hello.txt", "hi")
out["read"] = sb.files.read("dir/hello.txt").decode()
out["exists"] = sb.files.exists("dir/hello.txt")
out["list"] = [e.name for e in sb.files.list("dir")]
if mode.startswith("sandboxd"):
    r = sb.commands.run("pwd", cwd="dir")
    out["cwd"] = r.stdout.rstrip().endswith("/dir")
sb.terminate()
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["legacy", "sandboxd", "sandboxd-tunnel"])
async def test_upstream_sdk_runs_commands_and_files_through_the_runner(
    kube: ApiClient, namespace: str, controller: Started, cluster: DevCluster, mode: str, tmp_path: Path
) -> None:
    python = ensure_upstream_sdk()
    await create_runtime_pool(kube, namespace, replicas=1)
    # sandboxd-tunnel: the SDK runs `kubectl port-forward pod/<pod>` (kubectl from PATH: the cluster's own),
    # through the API server's pods/portforward to kwok, the dev cluster's kubelet (devcluster/kubelet_api.py).
    path = f"{cluster.binaries.path('kubectl').parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": path}
    out = json.loads(await run_script(python, _SCRIPT, namespace, mode, env=env, timeout=180))
    assert out["run"] == ["hello\n", 0]
    assert out["read"] == "hi"
    assert out["exists"] is True
    assert out["list"] == ["hello.txt"]
    if mode.startswith("sandboxd"):
        assert out["cwd"] is True
