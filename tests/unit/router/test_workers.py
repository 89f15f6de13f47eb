"""`--workers`: the workers' command line and the supervisor's merged metrics (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent_sandbox.router._config import load_router_config
from agent_sandbox.router._metrics import RouterMetrics
from agent_sandbox.router._workers import MergedMetrics, worker_flags

pytestmark = pytest.mark.unit


def test_worker_flags_override_the_supervisors() -> None:
    argv = ["--workers=3", "--cache-enabled", "--http-bind-address", ":0", "positional", "--ignored"]
    flags = worker_flags(argv, http_address="127.0.0.1:8080", https_address=None)
    assert flags[:4] == ["--workers=3", "--cache-enabled", "--http-bind-address", ":0"]
    config, rest = load_router_config(flags, {})
    # Go flags: the last occurrence wins, so the overrides apply.
    assert (config.workers, config.http_bind_address) == (1, "127.0.0.1:8080")
    assert (config.metrics_bind_address, config.health_probe_bind_address) == ("0", "0")
    assert config.cache_enabled
    assert rest == []


def test_merged_metrics_sum_workers(tmp_path: Path) -> None:
    own, worker = RouterMetrics(), RouterMetrics()
    own.admit_namespace("team")
    worker.admit_namespace("team")
    own.observe_request("GET", 200, "team", 0.01)
    worker.observe_request("GET", 200, "team", 0.02)
    worker.observe_request("GET", 404, "team", 0.02)
    worker.inflight.inc(3)
    (tmp_path / "worker-1.prom").write_bytes(generate_latest(worker.registry))
    merged = CollectorRegistry(auto_describe=False)
    merged.register(MergedMetrics(own.registry, tmp_path))
    labels = {"method": "GET", "sandbox_namespace": "team"}
    assert merged.get_sample_value("sandbox_router_requests_total", {**labels, "code": "200"}) == 2
    assert merged.get_sample_value("sandbox_router_requests_total", {**labels, "code": "404"}) == 1
    assert (
        merged.get_sample_value("sandbox_router_request_duration_seconds_count", {**labels, "code": "200"})
        == 2
    )
    assert merged.get_sample_value("sandbox_router_inflight_requests") == 3
    info = [s for m in merged.collect() if m.name == "sandbox_router_build_info" for s in m.samples]
    assert len(info) == 1
    assert info[0].value == 1  # one copy, not summed
    text = generate_latest(merged).decode()
    assert "# TYPE sandbox_router_requests_total counter" in text
