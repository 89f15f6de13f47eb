"""Run-to-run spread of a scenario: min / median / max of each percentile over several result files.

One run is one draw from a noisy machine (issue 20: the same burst gave P99 477 ms and 734 ms back to
back). This reads the result JSONs of N runs (`--tag` selects an experiment, `--last` the newest N) and
prints, for every latency view of the claim phase, the min / median / max across runs of P50, P90 and
P99, plus the machine's load (1-min load average during the phase) and, per run, the API-server writes
per claim by verb and resource. Run it after N back-to-back runs:

    for i in 1 2 3 4 5; do flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.cli burst --tag x --no-report; done
    .venv/bin/python -m benchmarks.spread burst --tag x
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .result_files import RESULTS

__all__ = ["VIEWS", "load_runs", "phase_of", "render", "spread", "writes_per_claim"]

VIEWS = ("controller_histogram", "client_watch", "client_process", "controller_annotations")
PERCENTILES = ("p50", "p90", "p99")


def load_runs(
    scenario: str, tag: str, last: int, directory: Path = RESULTS
) -> list[tuple[str, dict[str, Any]]]:
    """The newest `last` results of `scenario` with `tag` ("" = untagged), oldest first."""
    prefix = f"{scenario}-{tag}-" if tag else f"{scenario}-"
    out: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(directory.glob(f"{prefix}*.json")):
        data = json.loads(path.read_text())
        if data.get("scenario") != scenario or (data.get("tag") or "") != tag:
            continue
        out.append((path.name, data))
    return out[-last:] if last > 0 else out


def phase_of(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The claim phase of a result (sustained: its first phase, the reference rate)."""
    result = data["result"]
    phases = result.get("phases")
    return phases[0] if phases else result


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """min / median / max of the values that exist (None when none do)."""
    have = [v for v in values if v is not None]
    if not have:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(have), "median": statistics.median(have), "max": max(have), "n": len(have)}


def writes_per_claim(phase: Mapping[str, Any]) -> dict[str, float]:
    """API-server writes (all clients) during the phase per claim, by "VERB resource"."""
    n = phase.get("claims") or 0
    writes = phase.get("apiserver_writes") or {}
    return {k: round(v / n, 2) for k, v in sorted(writes.items(), key=lambda kv: -kv[1])} if n else {}


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def render(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Markdown: the spread table, then one line per run (file, load, gate views, writes/claim)."""
    if not runs:
        return "no runs"
    phases = [phase_of(d) for _, d in runs]
    lines = [
        f"{len(runs)} runs; min / median / max across runs of each percentile (ms)",
        "",
        "| view | P50 | P90 | P99 |",
        "|---|---|---|---|",
    ]
    for view in VIEWS:
        cells = []
        for q in PERCENTILES:
            s = spread([(ph["latency_ms"].get(view) or {}).get(q) for ph in phases])
            cells.append(f"{_f(s['min'])} / {_f(s['median'])} / {_f(s['max'])}")
        lines.append(f"| {view} | {' | '.join(cells)} |")
    load = spread([(ph.get("usage") or {}).get("load1_max") for ph in phases])
    lines += [
        "",
        f"load1 during the phase (max per run): {load['min']} / {load['median']} / {load['max']}",
        "",
    ]
    for (name, _), ph in zip(runs, phases, strict=True):
        usage = ph.get("usage") or {}
        hist, client = ph["latency_ms"]["controller_histogram"], ph["latency_ms"]["client_watch"]
        writes = writes_per_claim(ph)
        lines.append(
            f"- {name}: load1 {usage.get('load1_min')}-{usage.get('load1_max')}, ready {ph.get('ready')}/"
            f"{ph.get('claims')}, histogram {_f(hist.get('p50'))}/{_f(hist.get('p90'))}/{_f(hist.get('p99'))}, "
            f"client {_f(client.get('p50'))}/{_f(client.get('p90'))}/{_f(client.get('p99'))} ms; "
            f"writes/claim {sum(writes.values()):.1f}: " + ", ".join(f"{k} {v}" for k, v in writes.items())
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spread", description=__doc__.splitlines()[0])
    parser.add_argument("scenario")
    parser.add_argument("--tag", default="", help="the experiment tag of the runs ('' = untagged)")
    parser.add_argument("--last", type=int, default=5, help="newest N runs (0 = all)")
    args = parser.parse_args(argv)
    print(render(load_runs(args.scenario, args.tag, args.last)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
