"""The router benchmark's pure parts: spread over rounds and the generated markdown block."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.router import report
from benchmarks.router.run import summarize

pytestmark = pytest.mark.unit


def cell(rnd: int, rps: float, target: str = "uvloop", cpu: float | None = 70.0) -> dict[str, Any]:
    return {
        "round": rnd,
        "backend": "nginx",
        "target": target,
        "concurrency": 50,
        "body": "empty",
        "rps": rps,
        "p50_ms": 1.0,
        "p95_ms": 5.0,
        "p99_ms": 10.0 + rnd,
        "router_cpu_us_per_req": cpu,
        "errors": {"connect": 0, "read": rnd, "write": 0, "status": 0, "timeout": 0},
        "load_before": 1.0,
    }


def test_summarize_reports_the_spread_not_the_best() -> None:
    (row,) = summarize([cell(0, 100.0), cell(1, 300.0), cell(2, 200.0)])
    assert row["rps"] == {"min": 100.0, "median": 200.0, "max": 300.0}
    assert row["p99_ms"] == {"min": 10.0, "median": 11.0, "max": 12.0}
    assert row["runs"] == 3
    assert row["errors"] == 3  # read errors of rounds 1 and 2 are summed, never dropped


def test_direct_rows_have_no_router_cpu() -> None:
    (row,) = summarize([cell(0, 1000.0, target="direct", cpu=None)])
    assert row["router_cpu_us_per_req"] == {}


def test_render_and_replace_block() -> None:
    result = {
        "host": {
            "cpus": 2,
            "cpu_model": "x",
            "python": "3.11",
            "git_commit": "abc",
            "loadavg": [1.0, 2.0, 3.0],
        },
        "params": {"rounds": 3, "duration": 8.0},
        "elapsed_s": 10.0,
        "summary": summarize([cell(0, 100.0), cell(0, 900.0, target="direct", cpu=None)]),
        "rss": {"streams": 1000, "completed": 1000, "idle_mib": 50.0, "open_mib": 60.0, "peak_mib": 61.0},
    }
    text = report.render(result, "router-x.json")
    lines = [ln for ln in text.splitlines() if ln.startswith("| nginx")]
    assert lines[0].startswith("| nginx | direct | 50 | empty | 900 (900-900)")  # direct first
    assert "| nginx | uvloop | 50 | empty | 100 (100-100) |" in lines[1]
    assert "1000 concurrent open streams" in text
    doc = report.replace_block("# Performance\n", text)
    assert "## Sandbox Router" in doc
    again = report.replace_block(doc, "new\n")
    assert again.count(report.BEGIN) == 1
    assert "new\n" in again
    assert "router-x.json" not in again


def test_combine_takes_the_newest_run_per_backend() -> None:
    def run(backends: list[str], rps: float, rss: dict[str, Any]) -> dict[str, Any]:
        cells = [{**cell(0, rps), "backend": b} for b in backends]
        return {"params": {"backends": backends}, "summary": summarize(cells), "rss": rss, "elapsed_s": 1.0}

    old = run(["nginx", "python-rest"], 100.0, {"streams": 1000})
    new = run(["runtime"], 300.0, {})
    combined, names = report.combine([("router-1.json", old), ("router-2.json", new)])
    assert {r["backend"] for r in combined["summary"]} == {"nginx", "python-rest", "runtime"}
    assert combined["rss"] == {"streams": 1000}  # the newest run that measured it
    assert names == "router-1.json, router-2.json"
