"""Fixtures for the API integration tests: installed CRDs and a live conversion webhook.

The webhook runs in a background thread with its own event loop and API client, so tests can
drive the API server with plain (blocking) `kubectl` calls while the server calls back into the
webhook. It listens on an ephemeral loopback port; the CRDs reach it through
`clientConfig.url` (dev mode), exactly as `agent-sandbox dev up --controller` wires the
controller's webhook.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import kinds
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import install_crds
from tests.helpers import wait_for

WEBHOOK_NAMESPACE = "agent-sandbox-webhook-tests"


@dataclass
class LiveWebhook:
    """A running ConversionWebhook; `ensure()` re-points the CRDs at it."""

    url: str
    ca_pem: bytes
    cluster: DevCluster

    def ensure(self) -> None:
        """Make every CRD use this webhook (another suite may have re-pointed them)."""
        import base64

        ca = base64.b64encode(self.ca_pem).decode()
        for kind in kinds.ALL_KINDS:
            current = json.loads(
                self.cluster.kubectl("get", "crd", kind.crd_name, "-o", "json", check=True).stdout
            )
            cfg = current["spec"]["conversion"].get("webhook", {}).get("clientConfig", {})
            if current["spec"]["conversion"].get("strategy") == "Webhook" and cfg.get("url") == self.url and \
                    cfg.get("caBundle") == ca:  # fmt: skip
                continue
            patch = {"spec": {"conversion": {"strategy": "Webhook", "webhook": {
                "conversionReviewVersions": ["v1", "v1beta1"],
                "clientConfig": {"url": self.url, "caBundle": ca, "service": None}}}}}  # fmt: skip
            self.cluster.kubectl(
                "patch", "crd", kind.crd_name, "--type=merge", "-p", json.dumps(patch), check=True
            )


@pytest.fixture(scope="session")
def crds(cluster: DevCluster) -> DevCluster:
    """The four CRDs from k8s/crds installed (server-side apply) and Established."""
    install_crds(cluster)
    return cluster


@pytest.fixture(scope="session")
def _webhook_server(crds: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveWebhook]:
    from agent_sandbox.controllers.webhook import ConversionWebhook, WebhookOptions
    from agent_sandbox.kube import ApiClient

    crds.kubectl("create", "namespace", WEBHOOK_NAMESPACE)  # may already exist
    cert_dir: Path = tmp_path_factory.mktemp("webhook-certs")
    started = threading.Event()
    stop: dict[str, Any] = {}
    result: dict[str, Any] = {}

    async def serve() -> None:
        client = await ApiClient.from_kubeconfig(str(crds.kubeconfig))
        webhook = ConversionWebhook(
            client,
            WebhookOptions(
                host="127.0.0.1",
                port=0,
                namespace=WEBHOOK_NAMESPACE,
                cert_dir=cert_dir,
                webhook_url="https://127.0.0.1:{port}/convert",
            ),
        )
        event = asyncio.Event()
        stop["loop"], stop["event"] = asyncio.get_running_loop(), event
        try:
            await webhook.start()
            result["url"], result["ca"] = webhook.url, webhook.ca_pem
        except BaseException as exc:
            result["error"] = exc
            raise
        finally:
            started.set()
        try:
            await event.wait()
        finally:
            await webhook.stop()
            await client.close()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name="conversion-webhook", daemon=True)
    thread.start()
    assert started.wait(60), "webhook did not start within 60 s"
    if "error" in result:
        raise result["error"]
    live = LiveWebhook(url=result["url"], ca_pem=result["ca"], cluster=crds)
    try:
        yield live
    finally:
        stop["loop"].call_soon_threadsafe(stop["event"].set)
        thread.join(30)


@pytest.fixture(scope="session")
def _probe(crds: DevCluster) -> str:
    """A namespace holding one v1beta1 Sandbox: listing it as v1alpha1 needs a working webhook."""
    ns = f"conv-probe-{uuid.uuid4().hex[:6]}"
    crds.kubectl("create", "namespace", ns, check=True)
    probe = {"apiVersion": c.SANDBOX_API_VERSION, "kind": "Sandbox", "metadata": {"name": "probe"},
             "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
    crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(probe), check=True)
    return ns


@pytest.fixture
def webhook(_webhook_server: LiveWebhook, _probe: str) -> LiveWebhook:
    """The live conversion webhook, with the CRDs pointing at it and conversion answering."""
    _webhook_server.ensure()
    cluster = _webhook_server.cluster
    wait_for(
        lambda: (
            cluster.kubectl("get", "sandboxes.v1alpha1.agents.x-k8s.io", "-n", _probe, "probe").returncode
            == 0
        ),
        timeout=60,
        what="v1alpha1 reads through the conversion webhook",
    )
    return _webhook_server
