"""Report rendering: markdown tables from result dicts, the generated block, latest-result selection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks import report
from benchmarks.scenario_params import ParamError, resolve_params
from benchmarks.scenarios import SCENARIOS

pytestmark = pytest.mark.unit


def _lat(p50: float, p90: float, p99: float, n: int = 750) -> dict[str, Any]:
    return {"count": n, "min": 1.0, "mean": p50, "p50": p50, "p90": p90, "p99": p99, "max": p99}


def _claims(p99: float = 180.0) -> dict[str, Any]:
    return {
        "claims": 750,
        "ready": 750,
        "create_errors": 0,
        "launch_types": {"warm": 750},
        "latency_ms": {
            "controller_histogram": {"count": 750, "p50": 83.0, "p90": 223.0, "p99": 245.0},
            "controller_annotations": _lat(40.0, 90.0, p99 - 20),
            "client_watch": _lat(60.0, 120.0, p99),
            "create_ack": _lat(8.0, 12.0, 30.0),
            "create_to_first_observed": _lat(10.0, 15.0, 40.0),
        },
        "throughput": {"offered_per_s": 75.0, "ready_per_s_mean": 74.1, "ready_per_s_peak_1s": 80.0},
        "usage": {
            "cpu_cores": {"kube-apiserver": 0.9, "agent-sandbox-controller": 0.3},
            "cpu_cores_total": 1.2,
        },
        "samples_ms": {"client_watch": [1.0], "controller_annotations": [1.0]},
    }


def _result(scenario: str, result: dict[str, Any], **params: Any) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "smoke": False,
        "params": params,
        "host": {"cpus": 2, "cpu_model": "Test CPU", "kubernetes": "1.35.4", "git_commit": "abc1234"},
        "load": {"before": [0.5, 0.4, 0.3], "after": [1.2, 0.6, 0.4]},
        "cluster": {
            "controller_flags": ["--kube-api-qps=1000", "--sandbox-claim-concurrent-workers=50"],
            "cluster_config": {"nodes": 100, "max_requests_inflight": 2000, "etcd_unsafe_no_fsync": True},
        },
        "result": result,
    }


def test_gate_verdict() -> None:
    assert report.gate_verdict({"count": 10, "p50": 100.0, "p90": 300.0, "p99": 500.0}) == "pass"
    assert report.gate_verdict({"count": 10, "p50": 100.0, "p90": 301.0, "p99": 600.0}) == "FAIL (p90, p99)"
    assert report.gate_verdict({"count": 0}) == "FAIL (no samples)"
    assert report.gate_verdict(None) == "FAIL (no samples)"


def test_render_burst_and_sustained() -> None:
    phases = [
        {**_claims(300.0), "rate": 45.0, "seconds": 60.0, "pool_replicas": 113, "passes_p99": True},
        {**_claims(700.0), "rate": 300.0, "seconds": 30.0, "pool_replicas": 750, "passes_p99": False},
    ]
    results = {
        "burst": _result("burst", {"pool_fill_s": 20.0, **_claims()}, pool=1050, rate=75.0, seconds=10.0),
        "sustained": _result(
            "sustained",
            {"phases": phases, "knee_per_s": 250.0, "broke_at_per_s": 300.0, "knee_criterion": "client P99"},
            pools=4,
            dwell_s=5.0,
            seed=1,
            headroom_s=10.0,
            rate=45.0,
            seconds=60.0,
            steps="300",
            step_seconds=30.0,
            knee_p99_ms=500.0,
        ),
    }
    text = report.render(results, {"burst-latency-cdf": "performance/burst-latency-cdf.png"})
    assert "Test CPU, 2 cores" in text
    assert "`--kube-api-qps=1000 --sandbox-claim-concurrent-workers=50`" in text
    assert "| controller histogram (gate method, bucket-interpolated) | 83 / 223 / 245 | 750 |" in text
    assert "| client create sent -> Ready on the watch (exact) | 60 / 120 / 180 | 750 |" in text
    assert "**pass**" in text
    assert "![burst-latency-cdf](performance/burst-latency-cdf.png)" in text
    assert "**Knee: 250 claims/s**" in text
    assert "| 300 | 30 | 750/750 | 60 / 120 / 700 |" in text
    assert "**no**" in text
    assert "load average before 0.50, after 1.20" in text


def test_render_other_scenarios_and_empty() -> None:
    refill = {"replicas": 300, "all_ready_s": 6.4, "creates_per_s_mean": 85.0, "series": {}}
    cold = {
        "count": 1000,
        "all_ready_s": 30.0,
        "latency_p50_s": 10.0,
        "controller_requests": {"POST": 2000.0},
    }
    scale = {
        "count": 5000,
        "idle": {"controller_rss_mib": 180.0, "cpu_cores": {"agent-sandbox-controller": 0.01}},
        "touch": {
            "events": 500,
            "controller_cpu_s": 0.5,
            "seconds": 4.0,
            "cpu_ms_per_event": 0.8,
            "reconciles": {"sandbox": 500.0},
        },
        "fill": {},
    }
    text = report.render(
        {
            "refill": _result("refill", refill),
            "cold": _result("cold", cold),
            "scale": _result("scale", scale),
        }
    )
    assert "| all members Ready (watch) | 6.40 s |" in text
    assert "POST 2000" in text
    assert "**180.0 MiB**" in text
    assert "**1.00 ms CPU per event** gross" in text
    assert "0.80 ms net of the idle rate" in text
    assert "No benchmark results yet" in report.render({})


def test_replace_block_keeps_hand_written_text() -> None:
    doc = f"# Performance\n\nintro\n\n{report.BEGIN}\nold\n{report.END}\n\n## Analysis\nkept\n"
    out = report.replace_block(doc, "new table\n")
    assert "old" not in out
    assert f"{report.BEGIN}\nnew table\n{report.END}" in out
    assert out.startswith("# Performance\n\nintro")
    assert out.endswith("## Analysis\nkept\n")
    appended = report.replace_block("# Performance\n", "x")
    assert appended == f"# Performance\n\n{report.BEGIN}\nx\n{report.END}\n"


def test_latest_picks_newest_non_smoke(tmp_path: Path) -> None:
    def write(name: str, **data: Any) -> None:
        (tmp_path / name).write_text(json.dumps({"scenario": name.split("-")[0], **data}))

    write("burst-20260101T000000Z.json", n=1)
    write("burst-20260102T000000Z.json", n=2)
    write("burst-20260103T000000Z.json", n=3, smoke=True)
    write("refill-20260101T000000Z.json", n=4)
    (tmp_path / "junk.json").write_text("not json")
    got = report.latest(tmp_path.glob("*.json"))
    assert {k: v["n"] for k, v in got.items()} == {"burst": 2, "refill": 4}
    assert report.latest(tmp_path.glob("*.json"), include_smoke=True)["burst"]["n"] == 3


def test_resolve_params_layers() -> None:
    burst = SCENARIOS["burst"]
    full = resolve_params(burst, smoke=False, environ={})
    assert (full["pool"], full["rate"], full["seconds"], full["nodes"]) == (1050, 75.0, 10.0, 100)
    smoke = resolve_params(burst, smoke=True, environ={})
    assert smoke["pool"] < 1050
    assert smoke["smoke"] is True
    env = resolve_params(burst, smoke=True, environ={"BENCH_RATE": "20", "BENCH_PROFILE": "yes"})
    assert env["rate"] == 20.0
    assert env["profile"] is True
    explicit = resolve_params(burst, smoke=False, overrides={"rate": "30"}, environ={"BENCH_RATE": "20"})
    assert explicit["rate"] == 30.0
    with pytest.raises(ParamError, match="has no parameter"):
        resolve_params(burst, smoke=False, overrides={"nope": "1"}, environ={})


def test_cost_per_claim() -> None:
    phase = {
        "ready": 100,
        "usage": {"cpu_seconds": {"kube-apiserver": 4.0, "agent-sandbox-controller": 1.0, "kwok": 0.0}},
        "apiserver_writes": {"PATCH sandboxes": 150.0, "POST sandboxclaims": 100.0},
        "controller_internals_ms": {"rest_patch": {"count": 10, "mean": 12.5, "p99": 40.0}},
    }
    text = "\n".join(report.cost_per_claim(phase))
    assert "**50.0 ms CPU** (gross 50.0) - kube-apiserver 40.0, agent-sandbox-controller 10.0 ms" in text
    assert "API writes per claim: **2.5** - PATCH sandboxes 1.50, POST sandboxclaims 1.00." in text
    assert "controller PATCH latency mean 12.5 / P99 ~40 ms" in text
    assert report.cost_per_claim({"ready": 0}) == []


def test_tagged_experiments_table(tmp_path: Path) -> None:
    run = _result("burst", {**_claims(), "ready": 750}, pool=600, rate=50.0, seconds=10.0)
    run["result"]["controller_internals_ms"] = {
        "claim_queue_wait": {"mean": 7300.0},
        "rest_patch": {"mean": 660.0},
    }
    run["result"]["usage"]["cpu_seconds"] = {"agent-sandbox-controller": 4.5}
    for stamp, tag in (("20260101T000000Z", "before"), ("20260101T000100Z", "after")):
        (tmp_path / f"burst-{tag}-{stamp}.json").write_text(json.dumps({**run, "tag": tag}))
    (tmp_path / "burst-20260101T000200Z.json").write_text(json.dumps(run))  # untagged: main tables only
    runs = report.tagged(tmp_path.glob("*.json"))
    assert [r["tag"] for r in runs] == ["before", "after"]
    assert "burst" not in report.latest([tmp_path / "burst-before-20260101T000000Z.json"])
    text = "\n".join(report.experiments(runs))
    assert (
        "| `before` | burst 50/s x 10 s, pool 600 | 60 / 120 / 180 | 83 / 223 / 245 | 74.1 | 7300 | 660 | 6.0 |"
        in text
    )
