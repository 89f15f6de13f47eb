"""Header layering and routing headers (spec §3.6, §1.2)."""

from __future__ import annotations

import math

import pytest

from agent_sandbox_sdk._headers import merge_headers, routing_headers, timeout_header

pytestmark = pytest.mark.unit


def test_later_layers_win_case_insensitively_keeping_the_winner_spelling() -> None:
    merged = merge_headers(
        {"Authorization": "Bearer a", "X-Extra": "1"}, {"authorization": "Bearer b"}, None, {"X-EXTRA": "2"}
    )
    assert merged == {"authorization": "Bearer b", "X-EXTRA": "2"}


def test_routing_headers_override_caller_headers() -> None:
    routing = routing_headers(sandbox_id="sb", namespace="ns", port=8888, pod_ip=None, timeout=60)
    merged = merge_headers({"x-sandbox-id": "evil"}, {"X-Sandbox-Port": "1"}, routing)
    assert merged["X-Sandbox-ID"] == "sb"
    assert merged["X-Sandbox-Port"] == "8888"
    assert "x-sandbox-id" not in merged


@pytest.mark.parametrize(
    ("value", "text"),
    [(60, "60"), (60.0, "60"), (12.5, "12.5"), (0.25, "0.25"), (0, None), (-1, None), (None, None),
     (math.inf, None), (math.nan, None), (True, None)],
)  # fmt: skip
def test_timeout_header_text(value: float | None, text: str | None) -> None:
    assert timeout_header(value) == text


def test_routing_headers_include_pod_ip_and_timeout_only_when_known() -> None:
    full = routing_headers(sandbox_id="sb", namespace="ns", port=8080, pod_ip="127.10.0.5", timeout=30)
    assert full == {
        "X-Sandbox-ID": "sb",
        "X-Sandbox-Namespace": "ns",
        "X-Sandbox-Port": "8080",
        "X-Sandbox-Pod-IP": "127.10.0.5",
        "X-Sandbox-Timeout": "30",
    }
    bare = routing_headers(sandbox_id="sb", namespace="ns", port=8888, pod_ip=None, timeout=None)
    assert set(bare) == {"X-Sandbox-ID", "X-Sandbox-Namespace", "X-Sandbox-Port"}
