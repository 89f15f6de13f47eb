"""The Python SDK resumes a hibernated claim's Sandbox by name (ours, docs/lifecycle.md), and the CLI by
Sandbox name; on the real control plane with the real controller (`--sandbox-lifecycle`).

The restored Sandbox is the same one as far as its user can tell: the same name, hostname and PVC (the same
object, not a new volume), and the file written before hibernation is still there.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.main import main as cli
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import PVC, SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig, SandboxNotFoundError
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import execute, get_or_none, pool_body, ready_ip, runtime_template

pytestmark = pytest.mark.integration

UNUSED_ROUTER = SandboxDirectConnectionConfig(api_url="http://127.0.0.1:9")
VCT = [
    {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
]


async def test_sdk_resume_restores_a_hibernated_claim(
    kube: ApiClient,
    namespace: str,
    controller: Started,
    cluster: DevCluster,
    http: aiohttp.ClientSession,
) -> None:
    template = runtime_template("sdk-tmpl", volumeClaimTemplates=VCT)
    template["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/workspace"}
    ]
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body("sdk-pool", "sdk-tmpl", 1), namespace=namespace)

    def create() -> str:
        with SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c:
            # An explicit claim name: the client's exit only disconnects (an auto-named claim is deleted).
            sandbox = c.create_sandbox("sdk-pool", namespace, sandbox_ready_timeout=90, claim_name="kept")
            return sandbox.sandbox_id

    name = await asyncio.to_thread(create)
    ip = await ready_ip(kube, namespace, name)
    async with http.put(f"http://{ip}:8080/v1/files/notes.txt", data=b"kept while hibernated") as resp:
        assert resp.status == 204
    pvc_before = await kube.get(PVC, f"data-{name}", namespace=namespace)
    argv = ["lifecycle", "hibernate", name, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)]
    assert await asyncio.to_thread(cli, argv) == 0

    async def archived() -> bool:
        gone = await get_or_none(kube, SANDBOX, name, namespace) is None
        return gone and await get_or_none(kube, lc.ARCHIVE, name, namespace) is not None

    await eventually(archived, f"{name} hibernated")

    def resume() -> str:
        with SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c:
            sandbox = c.get_sandbox("kept", namespace)
            sandbox.resume(timeout=90)
            return sandbox.status()[0]

    assert await asyncio.to_thread(resume) == "SandboxReady"
    restored = await kube.get(SANDBOX, name, namespace=namespace)
    assert restored["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Manual"
    assert restored["spec"]["operatingMode"] == "Running"
    pvc_after = await kube.get(PVC, f"data-{name}", namespace=namespace)
    assert pvc_after["metadata"]["uid"] == pvc_before["metadata"]["uid"]  # the same volume, not a new one
    ip = await ready_ip(kube, namespace, name)
    assert (await execute(http, ip, "cat notes.txt"))["stdout"] == "kept while hibernated"
    assert (await execute(http, ip, "sh -c 'echo $HOSTNAME'"))["stdout"] == f"{name}\n"


def test_cli_by_sandbox_name_and_unknown_names(
    namespace: str, controller: Started, cluster: DevCluster
) -> None:
    kubeconfig = str(cluster.kubeconfig)
    assert cli(["lifecycle", "resume", "nothing-here", "-n", namespace, "--kubeconfig", kubeconfig]) == 3
    with (
        pytest.raises(SandboxNotFoundError),
        SandboxClient(UNUSED_ROUTER, kubeconfig=cluster.kubeconfig) as c,
    ):
        c.get_sandbox("no-such-claim", namespace)
