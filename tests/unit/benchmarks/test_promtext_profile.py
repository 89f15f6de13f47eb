"""Prometheus text parsing (the gate's histogram, summed across labels) and py-spy profile summaries."""

from __future__ import annotations

import math

import pytest
from benchmarks import profile, promtext

pytestmark = pytest.mark.unit

EXPOSITION = """\
# HELP agent_sandbox_claim_controller_startup_latency_ms Time from ...
# TYPE agent_sandbox_claim_controller_startup_latency_ms histogram
agent_sandbox_claim_controller_startup_latency_ms_bucket{launch_type="warm",le="100.0",sandbox_template="t"} 3.0
agent_sandbox_claim_controller_startup_latency_ms_bucket{launch_type="warm",le="250.0",sandbox_template="t"} 8.0
agent_sandbox_claim_controller_startup_latency_ms_bucket{launch_type="warm",le="+Inf",sandbox_template="t"} 9.0
agent_sandbox_claim_controller_startup_latency_ms_bucket{launch_type="cold",le="100.0",sandbox_template="t"} 0.0
agent_sandbox_claim_controller_startup_latency_ms_bucket{launch_type="cold",le="250.0",sandbox_template="t"} 0.0
agent_sandbox_claim_controller_startup_latency_ms_bucket{launch_type="cold",le="+Inf",sandbox_template="t"} 1.0
agent_sandbox_claim_controller_startup_latency_ms_count{launch_type="warm",sandbox_template="t"} 9.0
agent_sandbox_claim_controller_startup_latency_ms_sum{launch_type="warm",sandbox_template="t"} 1234.0
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="PATCH"} 10.0
rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"} 4.0
rest_client_requests_total{code="422",host="127.0.0.1:6443",method="PATCH"} 1.0
process_resident_memory_bytes 1.2e+08
weird_label{msg="a \\"quoted\\", value\\nnext"} 1
"""


def test_parse_samples_and_labels() -> None:
    samples = promtext.parse(EXPOSITION)
    assert len(samples) == 13
    weird = next(s for s in samples if s.name == "weird_label")
    assert weird.labels["msg"] == 'a "quoted", value\nnext'
    assert promtext.scalar(samples, "process_resident_memory_bytes") == 1.2e8
    assert promtext.scalar(samples, "missing") is None


def test_histogram_summed_across_label_sets() -> None:
    samples = promtext.parse(EXPOSITION)
    buckets = promtext.histogram(samples, "agent_sandbox_claim_controller_startup_latency_ms")
    assert buckets == [(100.0, 3.0), (250.0, 8.0), (math.inf, 10.0)]
    warm = promtext.histogram(
        samples, "agent_sandbox_claim_controller_startup_latency_ms", launch_type="warm"
    )
    assert warm[-1] == (math.inf, 9.0)
    assert promtext.histogram(samples, "absent") == []


def test_counter_by_label() -> None:
    samples = promtext.parse(EXPOSITION)
    assert promtext.counter_by(samples, "rest_client_requests_total", "method") == {
        "PATCH": 11.0,
        "POST": 4.0,
    }
    assert promtext.counter_by(samples, "rest_client_requests", "code") == {
        "200": 10.0,
        "201": 4.0,
        "422": 1.0,
    }


COLLAPSED = """\
<module> (/v/bin/agent-sandbox-controller:8);main (/r/src/agent_sandbox/controllers/main.py:220);_run_once (/usr/lib/python3.11/asyncio/base_events.py:1922);process (/r/src/agent_sandbox/kube/_controller.py:190);request (/r/src/agent_sandbox/kube/_client.py:240) 6
<module> (/v/bin/agent-sandbox-controller:8);_run_once (/usr/lib/python3.11/asyncio/base_events.py:1922);_request (/v/lib/python3.11/site-packages/aiohttp/client.py:700) 3
<module> (/v/bin/agent-sandbox-controller:8);select (/usr/lib/python3.11/selectors.py:468) 1
garbage line without count
"""


def test_frame_key_shortens_paths() -> None:
    assert (
        profile.frame_key("request (/r/src/agent_sandbox/kube/_client.py:240)")
        == "agent_sandbox/kube/_client.py:request"
    )
    assert profile.frame_key("_request (/v/lib/python3.11/site-packages/aiohttp/client.py:700)") == (
        "aiohttp/client.py:_request"
    )
    assert profile.frame_key("select (/usr/lib/python3.11/selectors.py:468)") == "selectors.py:select"
    assert profile.frame_key("odd") == "odd"


def test_summarize_profile() -> None:
    out = profile.summarize_profile(profile.parse_collapsed(COLLAPSED))
    assert out["samples"] == 10
    assert out["self"][0] == {"name": "agent_sandbox/kube/_client.py:request", "pct": 60.0}
    areas = {a["name"]: a["pct"] for a in out["areas"]}
    assert areas == {"kube client": 60.0, "aiohttp": 30.0, "other": 10.0}
    inclusive = {e["name"]: e["pct"] for e in out["inclusive"]}
    # Entry point and event-loop plumbing are left out of the inclusive ranking.
    assert "agent_sandbox/kube/_controller.py:process" in inclusive
    assert not any("base_events" in k or "<module>" in k for k in inclusive)
    assert profile.summarize_profile([])["samples"] == 0
