"""`agent-sandbox bench` usage errors (exit 2, one line) and the smoke preview that leaves the doc alone.

No cluster: a bad parameter is refused before any scenario runs, and the report only reads result files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from benchmarks import cli
from benchmarks.scenario_params import ParamError, resolve_params
from benchmarks.scenarios import SCENARIOS

pytestmark = pytest.mark.unit


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the scenarios `bench` would run, instead of starting a cluster for them."""
    ran: list[str] = []

    async def fake(scenario: Any, params: dict[str, Any]) -> dict[str, Any]:
        ran.append(scenario.name)
        raise RuntimeError("not in a unit test")

    monkeypatch.setattr(cli, "run_scenario", fake)
    return ran


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["burst", "--smoke", "--set", "bogus=1"],
            {},
            "--set bogus: burst has no parameter 'bogus' (its parameters: nodes, settle, profile,",
        ),
        (
            ["burst", "--smoke", "--set", "pool=abc"],
            {},
            "--set pool: burst parameter 'pool' expects an integer, got 'abc' (default 1050)",
        ),
        (
            ["burst", "--smoke"],
            {"BENCH_POOL": "xyz"},
            "BENCH_POOL: burst parameter 'pool' expects an integer, got 'xyz' (default 1050)",
        ),
        (
            ["burst", "--smoke", "--set", "rate=fast"],
            {},
            "--set rate: burst parameter 'rate' expects a number, got 'fast'",
        ),
        (
            ["burst", "--smoke", "--set", "profile=maybe"],
            {},
            "--set profile: burst parameter 'profile' expects a boolean (1/true/yes/on or 0/false/no/off), "
            "got 'maybe'",
        ),
        (["burst", "--smoke", "--set", "pool"], {}, "--set expects key=value, got 'pool'"),
    ],
)
def test_a_bad_parameter_is_a_usage_error_before_anything_runs(
    argv: list[str],
    env: dict[str, str],
    expected: str,
    no_runs: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Until December 6 these were KeyError / ValueError tracebacks (exit 1)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"agent-sandbox bench: error: {expected}" in err
    assert "Traceback" not in err
    assert no_runs == []


def test_all_checks_every_scenario_before_the_first_runs(
    no_runs: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench all` with `BENCH_STEPS=x` (a sustained parameter): refused at once, not after burst ran."""
    monkeypatch.setenv("BENCH_NODES", "many")
    with pytest.raises(SystemExit) as exited:
        cli.main(["all", "--smoke"])
    assert exited.value.code == 2
    assert "BENCH_NODES: burst parameter 'nodes' expects an integer, got 'many'" in capsys.readouterr().err
    assert no_runs == []


def test_valid_values_still_resolve() -> None:
    burst = SCENARIOS["burst"]
    got = resolve_params(
        burst, smoke=True, overrides={"profile": "off", "pool": "7"}, environ={"BENCH_RATE": "2.5"}
    )
    assert (got["profile"], got["pool"], got["rate"]) == (False, 7, 2.5)
    with pytest.raises(ParamError, match="has no parameter 'nope'"):
        resolve_params(burst, smoke=False, overrides={"nope": "1"}, environ={})


def _smoke_burst() -> dict[str, Any]:
    lat = {"count": 5, "min": 1.0, "mean": 2.0, "p50": 2.0, "p90": 3.0, "p99": 4.0, "max": 4.0}
    return {
        "scenario": "burst",
        "smoke": True,
        "params": {"pool": 20, "rate": 5.0, "seconds": 2.0},
        "host": {"cpus": 2, "cpu_model": "Test CPU", "kubernetes": "1.35.4", "git_commit": "abc1234"},
        "load": {"before": [0.5, 0.4, 0.3], "after": [1.2, 0.6, 0.4]},
        "cluster": {"controller_flags": [], "cluster_config": {"nodes": 10}},
        "result": {
            "claims": 10,
            "ready": 10,
            "create_errors": 0,
            "launch_types": {"warm": 10},
            "latency_ms": {
                "controller_histogram": {"count": 10, "p50": 50.0, "p90": 90.0, "p99": 99.0},
                "controller_annotations": lat,
                "client_watch": lat,
                "create_ack": lat,
                "create_to_first_observed": lat,
            },
            "throughput": {"offered_per_s": 5.0, "ready_per_s_mean": 5.0, "ready_per_s_peak_1s": 5.0},
            "usage": {"cpu_cores": {"kube-apiserver": 0.1}, "cpu_cores_total": 0.1},
            "samples_ms": {"client_watch": [1.0], "controller_annotations": [1.0]},
        },
    }


def test_report_include_smoke_writes_a_labelled_preview_not_the_doc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Until December 6 `bench report --include-smoke`, suggested after every smoke run as a "preview",
    rewrote the tracked docs/performance.md (and its plots) with smoke numbers, unlabelled."""
    results, doc, plots_dir = tmp_path / "results", tmp_path / "docs" / "performance.md", tmp_path / "plots"
    (results / "tmp").mkdir(parents=True)
    doc.parent.mkdir()
    doc.write_text("# Performance\n\nhand-written\n")
    (results / "tmp" / "burst-20261206T092234Z.json").write_text(json.dumps(_smoke_burst()))
    monkeypatch.setattr(cli, "RESULTS", results)
    monkeypatch.setattr(cli, "DOC", doc)
    monkeypatch.setattr(cli, "PLOTS", plots_dir)

    assert cli.main(["report", "--include-smoke"]) == 0

    out = capsys.readouterr().out
    preview = results / "tmp" / "performance-preview.md"
    assert out.strip() == f"preview (smoke results included; docs/performance.md unchanged): {preview}"
    assert doc.read_text() == "# Performance\n\nhand-written\n"
    assert not plots_dir.exists()
    text = preview.read_text()
    assert text.startswith("# Performance report preview (smoke results included)")
    assert (
        "Smoke runs (small sizes, a quick check, not a measurement): burst (`burst-20261206T092234Z.json`)"
        in text
    )
    assert "burst-20261206T092234Z.json" in text.split("Source files", 1)[1]


def test_the_hint_after_a_smoke_run_says_where_the_preview_goes(
    no_runs: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("BENCH_POOL", raising=False)
    assert cli.main(["burst", "--smoke", "--no-report"]) == 1  # the fake scenario failed
    err = capsys.readouterr().err
    assert "`agent-sandbox bench report --include-smoke` writes a preview with the smoke results to " in err
    assert "benchmarks/results/tmp/performance-preview.md" in err
