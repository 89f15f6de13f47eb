"""The lifecycle feature as an SDK user meets it: a sandbox from a template that asks for an idle timeout and
auto-resume, used through the router (`--sandbox-lifecycle --enable-h2c`) with both runtimes' configs. The
controller suspends it while the program is idle; the program's next call - a command (HTTP on the legacy
runtime, gRPC on sandboxd) or a file read - is served by the resumed pod without the program doing anything.
"""

from __future__ import annotations

import asyncio
import io

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from agent_sandbox_sdk import SandboxClient, SandboxdDirectConnectionConfig, SandboxDirectConnectionConfig
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import pool_body, runtime_template
from tests.integration.lifecycle.test_resume import StartRouter
from tests.integration.lifecycle.test_sdk_restore import VCT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize("runtime", ["legacy", "sandboxd"])
async def test_an_idle_sdk_sandbox_is_suspended_and_the_next_call_resumes_it(
    kube: ApiClient, namespace: str, cluster: DevCluster, start_router: StartRouter, runtime: str
) -> None:
    router = await start_router("--enable-h2c")
    url = f"http://127.0.0.1:{router.http_port}"
    annotations = {lc.ANNOTATION_IDLE_TIMEOUT: "3s", lc.ANNOTATION_AUTO_RESUME: "true"}
    # Its files live on a volume (a volumeClaimTemplate), so they outlast the suspend's pod deletion.
    template = runtime_template("idle", annotations=annotations, volumeClaimTemplates=VCT)
    template["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": "/workspace"}
    ]
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body("idle-pool", "idle", 1), namespace=namespace)
    config = SandboxDirectConnectionConfig(api_url=url) if runtime == "legacy" else None
    config = config or SandboxdDirectConnectionConfig(api_url=url)

    client = SandboxClient(config, kubeconfig=cluster.kubeconfig)
    try:
        sandbox = await asyncio.to_thread(client.create_sandbox, "idle-pool", namespace, 90)
        commands, files = sandbox.commands, sandbox.files
        assert commands is not None
        assert files is not None
        assert (await asyncio.to_thread(commands.run, "echo before")).stdout == "before\n"
        await asyncio.to_thread(files.write, "kept.txt", b"written before the suspend")

        async def suspended() -> bool:
            current = await kube.get(SANDBOX, sandbox.sandbox_id, namespace=namespace)
            return current["spec"].get("operatingMode") == "Suspended"

        await eventually(suspended, "the idle sandbox suspended by the controller", within=60)
        # The same handle, as a program that was busy elsewhere: nothing to do but call. The first call is
        # an upload streamed from a file object (2 MiB in 64 KiB chunks), the hardest to hold and resend.
        upload = io.BytesIO(bytes(range(256)) * 8192)
        await asyncio.to_thread(files.write, "big.bin", upload)
        assert await asyncio.to_thread(files.read, "big.bin") == upload.getvalue()
        assert (await asyncio.to_thread(commands.run, "echo after")).stdout == "after\n"
        assert await asyncio.to_thread(files.read, "kept.txt") == b"written before the suspend"
        current = await kube.get(SANDBOX, sandbox.sandbox_id, namespace=namespace)
        assert current["spec"]["operatingMode"] == "Running"
        assert current["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
    finally:
        await asyncio.to_thread(client.close)
