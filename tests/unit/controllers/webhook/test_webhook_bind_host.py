"""AGENT_SANDBOX_WEBHOOK_HOST picks the bind address only; the Service reference stays (no URL)."""

from __future__ import annotations

import pytest

from agent_sandbox.controllers.options import Options
from agent_sandbox.controllers.webhook import options_from

pytestmark = pytest.mark.unit


def test_bind_host_keeps_the_service_reference() -> None:
    got = options_from(Options(), environ={"AGENT_SANDBOX_WEBHOOK_HOST": "127.10.0.7"})
    assert got.host == "127.10.0.7"
    assert got.webhook_url is None


def test_dev_url_wins_over_bind_host() -> None:
    env = {"AGENT_SANDBOX_WEBHOOK_URL": "https://127.0.0.1:{port}/convert", "AGENT_SANDBOX_WEBHOOK_HOST": "x"}
    got = options_from(Options(), environ=env)
    assert got.host == "127.0.0.1"
    assert got.webhook_url == "https://127.0.0.1:9443/convert"
