"""The webhook's log lines keep one logger name across its modules.

The logger field is what operators filter and alert on; the webhook's modules (app, certificate watch,
listener) were one module once, and their records still carry that module's name.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent_sandbox.controllers.webhook import CertWatcher, build_app, generate_bundle
from agent_sandbox.controllers.webhook.certs import CertBundle

pytestmark = pytest.mark.unit

WEBHOOK_LOGGER = "agent_sandbox.controllers.webhook.server"


def _bundle() -> CertBundle:
    return generate_bundle(
        service="s", namespace="n", cluster_domain="cluster.local", now=dt.datetime.now(dt.UTC)
    )


def test_a_certificate_reload_logs_under_the_webhook_logger(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = _bundle(), _bundle()
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(first.cert_pem)
    key.write_bytes(first.key_pem)
    watcher = CertWatcher(cert, key)
    cert.write_bytes(second.cert_pem)
    key.write_bytes(second.key_pem)
    with caplog.at_level(logging.INFO):
        assert watcher.check()
    assert [r.name for r in caplog.records if "reloaded" in r.getMessage()] == [WEBHOOK_LOGGER]


def test_a_failed_conversion_logs_under_the_webhook_logger(caplog: pytest.LogCaptureFixture) -> None:
    review = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {
            "uid": "u",
            "desiredAPIVersion": "nope/v9",
            "objects": [{"apiVersion": "x/v1", "kind": "Foo", "metadata": {"name": "a"}}],
        },
    }

    async def convert() -> None:
        async with TestClient(TestServer(build_app())) as client:
            await client.post("/convert", json=review)

    with caplog.at_level(logging.INFO):
        asyncio.run(convert())
    assert [r.name for r in caplog.records if "conversion to" in r.getMessage()] == [WEBHOOK_LOGGER]
