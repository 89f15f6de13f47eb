"""Process wiring of the webhook: flags -> options, dev-mode URL from the environment, runnable."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from agent_sandbox.controllers.options import Options
from agent_sandbox.controllers.webhook import ConversionWebhook, WebhookOptions, WebhookRunnable, options_from
from agent_sandbox.kube import NAMESPACE, SECRET, NotFound
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit


def test_options_follow_upstream_flags() -> None:
    got = options_from(Options(), environ={})
    assert got == WebhookOptions(
        host="",
        port=9443,
        namespace="agent-sandbox-system",
        service_name="agent-sandbox-webhook-service",
        cluster_domain="cluster.local",
        cert_dir=Path("/tmp/k8s-webhook-server/serving-certs"),
        manage_certs=True,
        webhook_url=None,
    )


def test_dev_mode_url_from_environment() -> None:
    opts = dataclasses.replace(
        Options(), webhook_port=19443, manage_webhook_certs=True, cluster_domain="dev.local"
    )
    got = options_from(opts, environ={"AGENT_SANDBOX_WEBHOOK_URL": "https://127.0.0.1:{port}/convert"})
    assert got.webhook_url == "https://127.0.0.1:19443/convert"
    assert got.host == "127.0.0.1"
    assert got.port == 19443
    assert got.cluster_domain == "dev.local"


async def test_runnable_serves_until_cancelled_on_every_replica(tmp_path: Path) -> None:
    client = FakeClient()
    # the fake does not model namespaces: make the first Secret create fail like a missing namespace
    client.inject_error("create", NotFound(404, "NotFound", 'namespaces "dev-ns" not found'), kind=SECRET)
    webhook = ConversionWebhook(
        client,
        WebhookOptions(host="127.0.0.1", port=0, namespace="dev-ns", cert_dir=tmp_path,
                       webhook_url="https://127.0.0.1:{port}/convert"),
    )  # fmt: skip
    runnable = WebhookRunnable(webhook)
    assert runnable.need_leader_election is False
    task = asyncio.create_task(runnable.start())
    for _ in range(200):
        if webhook.port:
            break
        await asyncio.sleep(0.01)
    assert webhook.port
    # a missing Secret namespace is created (only happens outside a cluster)
    assert (await client.get(NAMESPACE, "dev-ns"))["metadata"]["name"] == "dev-ns"
    assert (await client.get(SECRET, "agent-sandbox-webhook-certs", namespace="dev-ns"))["type"] == "Opaque"
    _, writer = await asyncio.open_connection("127.0.0.1", webhook.port)
    writer.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", webhook.port)
