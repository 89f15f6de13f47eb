"""benchmarks.series: a series of back-to-back runs reduced to min / median / max and a target count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks import cli, report, series
from benchmarks.proc_sampling import ProcSampler
from benchmarks.scenarios import SCENARIOS


def _burst(p50: float, p99: float, client_p99: float, load: float) -> dict[str, Any]:
    hist = {"count": 750, "p50": p50, "p90": p50 * 2, "p99": p99}
    client = {"count": 750, "p50": p50, "p90": p50 * 2, "p99": client_p99}
    return {
        "scenario": "burst",
        "params": {"rate": 75.0},
        "load": {"before": [load - 1, 0, 0], "after": [load - 0.5, 0, 0]},
        "result": {
            "complete": True,
            "latency_ms": {"controller_histogram": hist, "client_watch": client},
            "throughput": {"ready_per_s_mean": 74.0},
            "usage": {"load1_max": load, "cpu_cores_total": 1.8},
        },
    }


def test_a_burst_series_counts_the_runs_that_meet_the_gate_and_the_client_target() -> None:
    runs = [
        ("a.json", _burst(100, 400, 450, 1.0)),  # holds
        ("b.json", _burst(100, 400, 700, 2.0)),  # histogram passes, client P99 does not
        ("c.json", _burst(350, 900, 1200, 3.0)),  # fails
    ]
    record = series.summarize("burst", runs, "burst-x")
    assert record["target"]["held"] == 1
    assert record["target"]["of"] == 3
    assert [r["holds"] for r in record["runs"]] == [True, False, False]
    assert record["spread"]["client ms p99"] == {"min": 450.0, "median": 700.0, "max": 1200.0, "n": 3}
    assert record["load1_max"]["max"] == 3.0
    text = series.render(record)
    assert "held in 1 of 3 runs" in text
    assert "| client ms p99 | 450 | 700 | 1200 |" in text


def test_sustained_and_overload_targets() -> None:
    sustained = {
        "result": {"phases": [{"rate": 15.0, "passes_p99": True, "latency_ms": {}}], "knee_per_s": 15.0}
    }
    failing = {
        "result": {"phases": [{"rate": 15.0, "passes_p99": False, "latency_ms": {}}], "knee_per_s": 10.0}
    }
    record = series.summarize("sustained", [("a", sustained), ("b", failing)])
    assert (record["target"]["held"], record["target"]["of"]) == (1, 2)
    assert record["spread"]["knee /s"]["min"] == 10.0
    lease = {"renewals": 49, "max_gap_s": 2.5, "holder_changes": 0}
    ok = {"result": {"ready": 10, "claims": 10, "controller_alive": True, "lease": lease}}
    lost = {
        "result": {
            "ready": 10,
            "claims": 10,
            "controller_alive": True,
            "lease": {**lease, "holder_changes": 1},
        }
    }
    assert series.summarize("overload", [("a", ok), ("b", lost)])["target"]["held"] == 1


def test_scenarios_without_a_target_report_only_the_spread() -> None:
    runs = [("a", {"result": {"all_ready_s": 9.0}}), ("b", {"result": {"all_ready_s": 15.0}})]
    record = series.summarize("refill", runs)
    assert record["target"] is None
    assert record["spread"]["all Ready s"]["median"] == 12.0


def test_every_scenario_has_a_reducer() -> None:
    assert set(SCENARIOS) <= set(series.METRICS)


def test_written_spreads_are_found_per_scenario_and_tag_and_shown_in_the_report(tmp_path: Path) -> None:
    runs = []
    for i, p99 in enumerate((300.0, 450.0)):
        path = tmp_path / f"burst-2026120{i}.json"
        path.write_text(json.dumps(_burst(50, p99, p99, 1.5)))
        runs.append(path)
    written = series.write_series("burst", runs, "burst-s1", directory=tmp_path)
    assert written.with_suffix(".md").read_text().startswith("# spread of burst")
    tagged = {**_burst(50, 900, 900, 1.5), "tag": "exp"}
    (tmp_path / "burst-exp-20261203.json").write_text(json.dumps(tagged))
    series.write_series("burst", [tmp_path / "burst-exp-20261203.json"], "burst-s2", directory=tmp_path)
    found = series.latest_spreads(tmp_path.glob("*.json"))
    assert set(found) == {"burst", "burst (exp)"}
    assert found["burst"]["target"]["held"] == 2
    # The spread records are not results: the per-scenario "latest" table skips them.
    assert set(report.latest(tmp_path.glob("*.json"))) == {"burst"}
    text = "\n".join(report.spreads_section(found))
    assert "### Run-to-run spread" in text
    assert "held in 2 of 2 runs" in text


def test_cli_runs_a_scenario_back_to_back_and_writes_one_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p99s = iter((200.0, 800.0, 300.0))

    async def fake_run(scenario: Any, params: Any) -> dict[str, Any]:
        return _burst(50, next(p99s), 100, 1.0)

    monkeypatch.setattr(cli, "run_scenario", fake_run)
    monkeypatch.setattr(cli, "RESULTS", tmp_path)
    assert cli.run(["burst"], smoke=True, overrides={}, write_report=False, runs=3) == 0
    results = sorted((tmp_path / "tmp").glob("burst-*.json"))
    assert len(results) == 3
    ids = {json.loads(p.read_text())["series"]["id"] for p in results}
    assert len(ids) == 1
    (spread_file,) = (tmp_path / "tmp").glob("spread-burst-*.json")
    record = json.loads(spread_file.read_text())
    assert record["series"] == ids.pop()
    assert record["target"]["held"] == 2


def test_a_series_is_found_again_by_its_id_next_to_spread_records(tmp_path: Path) -> None:
    run = {**_burst(50, 300, 300, 1.0), "series": {"id": "burst-s9", "run": 1, "of": 1}}
    (tmp_path / "burst-20261201.json").write_text(json.dumps(run))
    (tmp_path / "burst-20261202.json").write_text(json.dumps(_burst(50, 300, 300, 1.0)))
    series.write_series("burst", [tmp_path / "burst-20261201.json"], "burst-s9", directory=tmp_path)
    found = series._series_files("burst-s9", tmp_path)  # the spread record's plain-string id is skipped
    assert [p.name for p in found] == ["burst-20261201.json"]


def test_the_sampler_reports_other_work_and_steal_on_the_box() -> None:
    sampler = ProcSampler({"ours": 1})
    sampler.samples = [
        {"t": 0.0, "load1": 1.0, "host": (100.0, 5.0), "cpu": {"ours": 10.0}, "rss": {"ours": 0}},
        {"t": 10.0, "load1": 2.0, "host": (118.0, 6.0), "cpu": {"ours": 20.0}, "rss": {"ours": 0}},
    ]
    usage = sampler.between(0.0, 10.0)
    assert (usage["host_busy_cores"], usage["other_cores"], usage["steal_cores"]) == (1.8, 0.8, 0.1)
    run = {**_burst(50, 300, 300, 1.0)}
    run["result"]["usage"].update(other_cores=0.8, steal_cores=0.1)
    record = series.summarize("burst", [("a.json", run)])
    assert record["runs"][0]["box"] == {"other_cores": 0.8, "steal_cores": 0.1}
    assert "other cores 0.8, steal cores 0.1" in series.render(record)
    probed = {**run, "host": {"cpu_probe_ms": 21.5}}
    assert series.summarize("burst", [("a.json", probed)])["runs"][0]["box"]["cpu_probe_ms"] == 21.5
