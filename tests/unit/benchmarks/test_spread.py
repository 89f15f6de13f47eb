"""benchmarks.spread: min / median / max across runs, per-claim writes, and the runs it selects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.spread import load_runs, render, spread, writes_per_claim


def _result(tag: str, p99: float, writes: dict[str, float]) -> dict[str, Any]:
    lat = {"p50": p99 / 4, "p90": p99 / 2, "p99": p99}
    phase = {
        "claims": 10,
        "ready": 10,
        "latency_ms": {"controller_histogram": lat, "client_watch": lat, "controller_annotations": lat},
        "usage": {"load1_min": 1.0, "load1_max": 2.0},
        "apiserver_writes": writes,
    }
    out: dict[str, Any] = {"scenario": "burst", "result": phase}
    if tag:
        out["tag"] = tag
    return out


def test_spread_ignores_missing_values() -> None:
    assert spread([300.0, None, 100.0, 200.0]) == {"min": 100.0, "median": 200.0, "max": 300.0, "n": 3}
    assert spread([None])["median"] is None


def test_writes_per_claim_divides_by_claims_and_sorts_by_count() -> None:
    phase = {"claims": 4, "apiserver_writes": {"POST events": 2.0, "PATCH sandboxes": 8.0}}
    assert list(writes_per_claim(phase).items()) == [("PATCH sandboxes", 2.0), ("POST events", 0.5)]


def test_load_runs_selects_the_tag_and_render_shows_the_spread(tmp_path: Path) -> None:
    for i, (tag, p99) in enumerate([("x", 400.0), ("", 9000.0), ("x", 200.0), ("x", 600.0)]):
        name = f"burst-{tag}-2026{i}.json" if tag else f"burst-2026{i}.json"
        (tmp_path / name).write_text(json.dumps(_result(tag, p99, {"PATCH sandboxes": 10.0})))
    runs = load_runs("burst", "x", 0, directory=tmp_path)
    assert len(runs) == 3
    text = render(runs)
    assert "| client_watch | 50 / 100 / 150 | 100 / 200 / 300 | 200 / 400 / 600 |" in text
    assert "writes/claim 1.0: PATCH sandboxes 1.0" in text
    assert len(load_runs("burst", "", 0, directory=tmp_path)) == 1
