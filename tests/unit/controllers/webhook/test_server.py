"""The /convert TLS server and CRD patching, against an in-memory client (no cluster)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ssl
import threading
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from agent_sandbox.controllers.webhook import (
    ConversionWebhook,
    WebhookError,
    WebhookOptions,
    client_config,
    conversion_patch,
    generate_bundle,
    patch_crds,
)
from agent_sandbox.kube import CRD, SECRET
from agent_sandbox.kube.metrics import REGISTRY
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit


def crd(name: str, strategy: str = "Webhook", review_versions: list[str] | None = None) -> dict[str, Any]:
    webhook: dict[str, Any] = {
        "clientConfig": {"service": {"name": "agent-sandbox-webhook-service", "namespace": "agent-sandbox-system",
                                     "path": "/convert"}},
    }  # fmt: skip
    if review_versions is not None:
        webhook["conversionReviewVersions"] = review_versions
    conversion: dict[str, Any] = {"strategy": strategy}
    if strategy == "Webhook":
        conversion["webhook"] = webhook
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {"conversion": conversion},
    }


def test_client_config_service_and_url_are_exclusive() -> None:
    svc = client_config(ca_pem=b"PEM", url=None, service="s", namespace="n")
    assert svc == {"caBundle": base64.b64encode(b"PEM").decode(), "url": None,
                   "service": {"name": "s", "namespace": "n", "path": "/convert"}}  # fmt: skip
    url = client_config(ca_pem=b"PEM", url="https://127.0.0.1:1/convert", service="s", namespace="n")
    assert url["url"] == "https://127.0.0.1:1/convert"
    assert url["service"] is None


def test_conversion_patch_rules() -> None:
    cfg = {"caBundle": "x"}
    assert conversion_patch(crd("a", strategy="None"), cfg) is None
    filled = conversion_patch(crd("a", review_versions=[]), cfg)
    assert filled == {"spec": {"conversion": {"webhook": {"clientConfig": cfg,
                                                          "conversionReviewVersions": ["v1", "v1beta1"]}}}}  # fmt: skip
    kept = conversion_patch(crd("a", review_versions=["v1"]), cfg)
    assert kept == {"spec": {"conversion": {"webhook": {"clientConfig": cfg}}}}


async def test_patch_crds_skips_missing_and_non_webhook() -> None:
    client = FakeClient(
        (CRD, crd("sandboxes.agents.x-k8s.io")),
        (CRD, crd("sandboxclaims.extensions.agents.x-k8s.io", strategy="None")),
    )
    patched = await patch_crds(client, ca_pem=b"CA", url=None, service="svc", namespace="ns")
    assert patched == ["sandboxes.agents.x-k8s.io"]
    got = await client.get(CRD, "sandboxes.agents.x-k8s.io")
    cfg = got["spec"]["conversion"]["webhook"]["clientConfig"]
    assert cfg == {"caBundle": base64.b64encode(b"CA").decode(),
                   "service": {"name": "svc", "namespace": "ns", "path": "/convert"}}  # fmt: skip
    untouched = await client.get(CRD, "sandboxclaims.extensions.agents.x-k8s.io")
    assert untouched["spec"]["conversion"] == {"strategy": "None"}


async def _post(url: str, body: bytes, ca_pem: bytes) -> tuple[int, Any]:
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    async with aiohttp.ClientSession() as session, session.post(url, data=body, ssl=ctx) as resp:
        text = await resp.text()
        return resp.status, (await resp.json() if resp.content_type == "application/json" else text)


def _webhook_on_own_files(tmp_path: Path) -> tuple[ConversionWebhook, bytes]:
    """A loopback webhook serving a fresh pair from `tmp_path` (unmanaged certificates); returns it and its CA."""
    b = generate_bundle(service="s", namespace="n", cluster_domain="cluster.local", extra_hosts=("127.0.0.1",),
                        now=dt.datetime.now(dt.UTC))  # fmt: skip
    (tmp_path / "tls.crt").write_bytes(b.cert_pem)
    (tmp_path / "tls.key").write_bytes(b.key_pem)
    opts = WebhookOptions(host="127.0.0.1", port=0, manage_certs=False, cert_dir=tmp_path)
    return ConversionWebhook(FakeClient(), opts), b.ca_pem


async def test_webhook_serves_conversion_over_tls_and_patches_crds(tmp_path: Path) -> None:
    client = FakeClient(*((CRD, crd(n)) for n in ("sandboxes.agents.x-k8s.io",
                                                  "sandboxwarmpools.extensions.agents.x-k8s.io")))  # fmt: skip
    opts = WebhookOptions(
        host="127.0.0.1", port=0, namespace="ns", cert_dir=tmp_path / "certs",
        webhook_url="https://127.0.0.1:{port}/convert",
    )  # fmt: skip
    webhook = ConversionWebhook(client, opts)
    await webhook.start()
    try:
        assert webhook.port is not None
        assert webhook.port > 0
        assert webhook.url == f"https://127.0.0.1:{webhook.port}/convert"
        assert (tmp_path / "certs" / "tls.key").stat().st_mode & 0o777 == 0o600
        secret = await client.get(SECRET, "agent-sandbox-webhook-certs", namespace="ns")
        ca_pem = base64.b64decode(secret["data"]["ca.crt"])
        for name in ("sandboxes.agents.x-k8s.io", "sandboxwarmpools.extensions.agents.x-k8s.io"):
            cfg = (await client.get(CRD, name))["spec"]["conversion"]["webhook"]["clientConfig"]
            assert cfg == {"caBundle": base64.b64encode(ca_pem).decode(), "url": webhook.url}

        review = {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {
                "uid": "abc",
                "desiredAPIVersion": "extensions.agents.x-k8s.io/v1alpha1",
                "objects": [{"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
                             "metadata": {"name": f"p{i}"}, "spec": {"sandboxTemplateRef": {"name": "t"}}}
                            for i in range(40)],  # above the thread threshold
            },
        }  # fmt: skip

        def served(code: str) -> float:
            value = REGISTRY.get_sample_value(
                "controller_runtime_webhook_requests_total", {"webhook": "/convert", "code": code}
            )
            return value or 0.0

        ok_before, bad_before = served("200"), served("400")
        status, answer = await _post(webhook.url, orjson.dumps(review), ca_pem)
        assert status == 200
        assert answer["response"]["uid"] == "abc"
        assert answer["response"]["result"] == {"status": "Success"}
        converted = answer["response"]["convertedObjects"]
        assert [o["metadata"]["name"] for o in converted] == [f"p{i}" for i in range(40)]
        assert {o["spec"]["replicas"] for o in converted} == {1}

        status, text = await _post(webhook.url, b"{nope", ca_pem)
        assert status == 400
        assert "invalid JSON" in text
        # controller-runtime's webhook metrics, as upstream's manager serves them (none until December 6)
        assert (served("200") - ok_before, served("400") - bad_before) == (1, 1)
        latency = {"webhook": "/convert"}
        assert (
            REGISTRY.get_sample_value("controller_runtime_webhook_latency_seconds_count", latency) or 0
        ) >= 2
        assert REGISTRY.get_sample_value("controller_runtime_webhook_requests_in_flight", latency) == 0
    finally:
        await webhook.stop()
    await webhook.stop()  # idempotent


async def test_unmanaged_mode_needs_files(tmp_path: Path) -> None:
    opts = WebhookOptions(host="127.0.0.1", port=0, manage_certs=False, cert_dir=tmp_path)
    with pytest.raises(WebhookError, match="missing"):
        await ConversionWebhook(FakeClient(), opts).start()

    b = generate_bundle(service="s", namespace="n", cluster_domain="cluster.local", extra_hosts=("127.0.0.1",),
                        now=dt.datetime.now(dt.UTC))  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(b.cert_pem + b.key_pem)  # combined file, as upstream accepts
    client = FakeClient((CRD, crd("sandboxes.agents.x-k8s.io")))
    webhook = ConversionWebhook(client, opts)
    await webhook.start()
    try:
        status, _ = await _post(f"https://127.0.0.1:{webhook.port}/convert", b"[]", b.ca_pem)
        assert status == 400  # served over TLS with the provided certificate
        crd_after = await client.get(CRD, "sandboxes.agents.x-k8s.io")
        assert "caBundle" not in crd_after["spec"]["conversion"]["webhook"]["clientConfig"]  # not managed
    finally:
        await webhook.stop()


async def test_conversion_is_answered_while_the_controllers_loop_is_blocked(tmp_path: Path) -> None:
    """The listener has its own thread and loop: a busy controller loop does not delay conversions.

    The API server converts watch-cache events one at a time through the webhook, so a conversion waiting
    behind reconcile work delays every watcher. Here the test's (the controllers') loop is blocked outright
    while another thread converts; on the shared loop that request could not be answered until the block ends.
    """
    webhook, ca_pem = _webhook_on_own_files(tmp_path)
    await webhook.start()
    review = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "u", "desiredAPIVersion": "agents.x-k8s.io/v1alpha1", "objects": []},
    }
    answered_during_block = threading.Event()
    outcome: list[object] = []

    def convert_from_another_thread() -> None:
        async def go() -> tuple[int, Any]:
            return await asyncio.wait_for(
                _post(f"https://127.0.0.1:{webhook.port}/convert", orjson.dumps(review), ca_pem), 20
            )

        try:
            outcome.append(asyncio.run(go()))
        except Exception as exc:
            outcome.append(exc)
        answered_during_block.set()

    try:
        caller = threading.Thread(target=convert_from_another_thread)
        caller.start()
        # Block this loop (as a long synchronous stretch of reconcile work would) until answered, at most 20 s.
        answered = answered_during_block.wait(20)
        caller.join()
    finally:
        await webhook.stop()
    assert answered, "no answer while the controllers' loop was blocked"
    assert outcome[0][0] == 200, outcome  # type: ignore[index]


async def test_answers_carry_only_the_metadata_the_api_server_keeps(tmp_path: Path) -> None:
    """Name, namespace and uid (which it checks) plus labels and annotations (which it takes); nothing else.

    kube-apiserver restores every other metadata field from the stored object (`restoreObjectMeta`), so the
    rest would only be bytes it must decode for each of the serial watch-cache conversions.
    """
    webhook, ca_pem = _webhook_on_own_files(tmp_path)
    metadata = {
        "name": "s", "namespace": "ns", "uid": "u-1", "resourceVersion": "42", "generation": 3,
        "creationTimestamp": "2026-12-03T00:00:00Z", "labels": {"a": "b"}, "annotations": {"x": "y"},
        "finalizers": ["f"], "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "o-1"}],
        "managedFields": [{"manager": "m", "operation": "Update", "apiVersion": "agents.x-k8s.io/v1beta1",
                           "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}],
    }  # fmt: skip
    sandbox = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": metadata,
               "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}  # fmt: skip
    review = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
              "request": {"uid": "r", "desiredAPIVersion": "agents.x-k8s.io/v1alpha1", "objects": [sandbox]}}  # fmt: skip
    await webhook.start()
    try:
        assert webhook.port is not None
        status, answer = await _post(
            f"https://127.0.0.1:{webhook.port}/convert", orjson.dumps(review), ca_pem
        )
    finally:
        await webhook.stop()
    assert status == 200
    converted = answer["response"]["convertedObjects"][0]
    assert converted["metadata"] == {"name": "s", "namespace": "ns", "uid": "u-1", "labels": {"a": "b"},
                                     "annotations": {"x": "y"}}  # fmt: skip
    assert converted["spec"]["replicas"] == 1
