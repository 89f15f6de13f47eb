"""A series: N back-to-back runs of one scenario and their run-to-run spread (issue 20).

One run is one draw from a shared machine: the same burst gave P99 477 ms and 734 ms back to back. So a
full-size measurement is a series (`agent-sandbox bench <scenario> --runs N`, default 5): every run writes
its own result JSON carrying `series: {id, run, of}`, and this module reduces the series to, per headline
metric of the scenario, min / median / max across runs, plus the machine's load and how many runs met the
scenario's target. It writes `spread-<scenario>-<UTC stamp>.json` and `.md` next to the runs; the
generated block of docs/performance.md shows the newest series per scenario.

Rebuild a series' spread from its files (e.g. after a run was interrupted):

    python -m benchmarks.series <series id>
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .report import gate_verdict
from .result_files import RESULTS, write_result
from .spread import spread

__all__ = ["METRICS", "TARGETS", "latest_spreads", "render", "run_metrics", "summarize", "write_series"]

Metrics = dict[str, float | None]
CLIENT_P99_MS = 500.0
"""Issue 20: client P99 <= 500 ms, for the burst and for the sustained knee."""


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _ppp(prefix: str, stats: Mapping[str, Any] | None) -> Metrics:
    stats = stats or {}
    return {f"{prefix} {q}": _num(stats.get(q)) for q in ("p50", "p90", "p99")}


def _burst(r: Mapping[str, Any]) -> Metrics:
    lat = r.get("latency_ms") or {}
    return {
        **_ppp("histogram ms", lat.get("controller_histogram")),
        **_ppp("client ms", lat.get("client_watch")),
        **_ppp("client (separate process) ms", lat.get("client_process")),
        "Ready claims/s": _num((r.get("throughput") or {}).get("ready_per_s_mean")),
        "cores busy": _num((r.get("usage") or {}).get("cpu_cores_total")),
    }


def _sustained(r: Mapping[str, Any]) -> Metrics:
    first = (r.get("phases") or [{}])[0]
    lat = first.get("latency_ms") or {}
    return {
        "reference rate /s": _num(first.get("rate")),
        **_ppp("client ms", lat.get("client_watch")),
        "histogram ms p99": _num((lat.get("controller_histogram") or {}).get("p99")),
        "knee /s": _num(r.get("knee_per_s")),
    }


def _overload(r: Mapping[str, Any]) -> Metrics:
    lat = (r.get("latency_ms") or {}).get("client_watch") or {}
    lease, kinds = r.get("lease") or {}, r.get("launch_types") or {}
    return {
        **_ppp("client ms", lat),
        "claims Ready": _num(r.get("ready")),
        "of claims": _num(r.get("claims")),
        "warm": _num(kinds.get("warm")),
        "cold": _num(kinds.get("cold")),
        "all Ready after s": _num((r.get("throughput") or {}).get("all_ready_after_s")),
        "lease renewals": _num(lease.get("renewals")),
        "largest renewal gap s": _num(lease.get("max_gap_s")),
        "lease holder changes": _num(lease.get("holder_changes")),
    }


def _refill(r: Mapping[str, Any]) -> Metrics:
    return {
        "all Ready s": _num(r.get("all_ready_s")),
        "creates/s": _num(r.get("creates_per_s_mean")),
        "Ready/s": _num(r.get("ready_per_s_mean")),
    }


def _cold(r: Mapping[str, Any]) -> Metrics:
    return {
        "all Ready s": _num(r.get("all_ready_s")),
        "latency p50 s": _num(r.get("latency_p50_s")),
        "latency p99 s": _num(r.get("latency_p99_s")),
        "controller CPU s": _num(r.get("controller_cpu_s")),
    }


def _scale(r: Mapping[str, Any]) -> Metrics:
    fill, idle = r.get("fill") or {}, r.get("idle") or {}
    return {
        "all Ready s": _num(r.get("all_ready_s")),
        "controller RSS idle MiB": _num(idle.get("controller_rss_mib")),
        "controller ms CPU per Sandbox": _num(fill.get("cpu_ms_per_sandbox")),
    }


METRICS: dict[str, Callable[[Mapping[str, Any]], Metrics]] = {
    "burst": _burst,
    "sustained": _sustained,
    "overload": _overload,
    "refill": _refill,
    "cold": _cold,
    "scale": _scale,
}
"""Per scenario: the headline metrics of one run's `result`."""


def _burst_holds(r: Mapping[str, Any]) -> bool:
    lat = r.get("latency_ms") or {}
    hist, client = lat.get("controller_histogram") or {}, lat.get("client_watch") or {}
    gate = gate_verdict(hist) == "pass"  # the KWOK gate's thresholds, judged where the report judges them
    p99 = _num(client.get("p99"))
    return gate and p99 is not None and p99 <= CLIENT_P99_MS and bool(r.get("complete", True))


def _sustained_holds(r: Mapping[str, Any]) -> bool:
    return bool(((r.get("phases") or [{}])[0]).get("passes_p99"))


def _overload_holds(r: Mapping[str, Any]) -> bool:
    lease = r.get("lease") or {}
    return (
        r.get("ready") == r.get("claims")
        and bool(r.get("controller_alive"))
        and lease.get("holder_changes") == 0
    )


TARGETS: dict[str, tuple[str, Callable[[Mapping[str, Any]], bool]]] = {
    "burst": ("gate: histogram P50/P90 <= 300 ms, P99 <= 500 ms and client P99 <= 500 ms", _burst_holds),
    "sustained": ("the reference rate holds (client P99 <= 500 ms, every claim Ready)", _sustained_holds),
    "overload": ("every claim Ready, controller alive, lease never changed hands", _overload_holds),
}
"""Per scenario with a target: what it is and whether one run's `result` met it."""


def _load1(data: Mapping[str, Any]) -> float | None:
    """The highest 1-minute load average recorded around or during the run."""
    res = data.get("result") or {}
    phase = ((res.get("phases") or [None])[0]) or res
    values = [
        *(((data.get("load") or {}).get(k) or [None])[0] for k in ("before", "after")),
        (phase.get("usage") or {}).get("load1_max"),
    ]
    have = [float(v) for v in values if _num(v) is not None]
    return round(max(have), 2) if have else None


def _box(data: Mapping[str, Any]) -> dict[str, float]:
    """Other processes' CPU and hypervisor steal during the measured phase (cores), and the CPU probe taken
    before the run (`host.cpu_probe_ms`), when recorded."""
    res = data.get("result") or {}
    usage = (((res.get("phases") or [None])[0]) or res).get("usage") or {}
    box = {k: float(usage[k]) for k in ("other_cores", "steal_cores") if _num(usage.get(k)) is not None}
    probe = _num((data.get("host") or {}).get("cpu_probe_ms"))
    return {**box, "cpu_probe_ms": probe} if probe is not None else box


def run_metrics(scenario: str, data: Mapping[str, Any]) -> Metrics:
    """The headline metrics of one result file's data (empty for a scenario without a reducer)."""
    reduce = METRICS.get(scenario)
    return reduce(data.get("result") or {}) if reduce else {}


def summarize(
    scenario: str, runs: Sequence[tuple[str, Mapping[str, Any]]], series: str = ""
) -> dict[str, Any]:
    """The spread record of `runs` ((file name, data), oldest first) of one scenario."""
    per_run: list[dict[str, Any]] = []
    for name, data in runs:
        target = TARGETS.get(scenario)
        per_run.append(
            {
                "file": name,
                "load1_max": _load1(data),
                "box": _box(data),
                "metrics": run_metrics(scenario, data),
                "holds": target[1](data.get("result") or {}) if target else None,
            }
        )
    keys = list(dict.fromkeys(k for r in per_run for k in r["metrics"]))
    holds = [r["holds"] for r in per_run if r["holds"] is not None]
    tag = str((runs[0][1].get("tag") or "") if runs else "")
    return {
        "scenario": "spread",
        "of": scenario,
        "tag": tag,
        "series": series,
        "runs": per_run,
        "params": dict(runs[0][1].get("params") or {}) if runs else {},
        "load1_max": spread([r["load1_max"] for r in per_run]),
        "spread": {k: spread([r["metrics"].get(k) for r in per_run]) for k in keys},
        "target": (
            {"what": TARGETS[scenario][0], "held": sum(holds), "of": len(holds)}
            if scenario in TARGETS
            else None
        ),
    }


def _f(value: Any) -> str:
    if value is None:
        return "-"
    v = float(value)
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def render(record: Mapping[str, Any]) -> str:
    """Markdown for one spread record: target line, metric table (min / median / max), load, runs."""
    runs = record.get("runs") or []
    tag = f", experiment `{record['tag']}`" if record.get("tag") else ""
    lines = [
        f"{len(runs)} back-to-back runs of `{record.get('of')}` (series `{record.get('series') or '-'}`{tag})."
    ]
    target = record.get("target")
    if target:
        lines.append(f"Target - {target['what']}: **held in {target['held']} of {target['of']} runs**.")
    load = record.get("load1_max") or {}
    lines += [
        f"Load average (1 min, highest per run): {_f(load.get('min'))} / {_f(load.get('median'))} / "
        f"{_f(load.get('max'))} (min / median / max).",
        "",
        "| metric | min | median | max |",
        "|---|---|---|---|",
    ]
    for key, s in (record.get("spread") or {}).items():
        lines.append(f"| {key} | {_f(s.get('min'))} | {_f(s.get('median'))} | {_f(s.get('max'))} |")
    lines.append("")
    for r in runs:
        held = "" if r.get("holds") is None else (" - holds" if r["holds"] else " - fails")
        shown = ", ".join(f"{k} {_f(v)}" for k, v in list(r["metrics"].items())[:6])
        box = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in (r.get("box") or {}).items())
        lines.append(
            f"- `{r['file']}` (load {_f(r.get('load1_max'))}{', ' + box if box else ''}){held}: {shown}"
        )
    return "\n".join(lines) + "\n"


def write_series(
    scenario: str, paths: Sequence[Path], series: str, *, smoke: bool = False, directory: Path | None = None
) -> Path:
    """Reduce the runs in `paths` and write `spread-<scenario>-<stamp>.json` + `.md`; returns the JSON.

    Written next to the runs (`directory`, default benchmarks/results/, or its tmp/ for smoke runs)."""
    runs = [(p.name, json.loads(p.read_text())) for p in paths]
    record = summarize(scenario, runs, series)
    record["markdown"] = render(record)
    if smoke:
        record["smoke"] = True
    where = directory or (RESULTS / "tmp" if smoke else RESULTS)
    path = write_result(f"spread-{scenario}", record, directory=where)
    path.with_suffix(".md").write_text(f"# spread of {scenario} ({series})\n\n{record['markdown']}")
    return path


def latest_spreads(paths: Iterable[Path], *, include_smoke: bool = False) -> dict[str, dict[str, Any]]:
    """Newest spread record per scenario and experiment tag (key `burst`, `burst (tag)`); smoke only if asked."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(paths):
        if not path.name.startswith("spread-"):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(data, dict)
            and data.get("scenario") == "spread"
            and (include_smoke or not data.get("smoke"))
        ):
            data.setdefault("_file", path.name)
            out[f"{data.get('of')} ({data['tag']})" if data.get("tag") else str(data.get("of"))] = data
    return out


def _series_files(series: str, directory: Path) -> list[Path]:
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        tagged = data.get("series") if isinstance(data, dict) else None  # spread records carry a plain id
        if isinstance(tagged, dict) and tagged.get("id") == series:
            found.append(path)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.series", description=__doc__.splitlines()[0])
    parser.add_argument("series", help="the series id written into each run (`<scenario>-<UTC stamp>`)")
    parser.add_argument("--smoke", action="store_true", help="look in benchmarks/results/tmp/")
    args = parser.parse_args(argv)
    files = _series_files(args.series, RESULTS / "tmp" if args.smoke else RESULTS)
    if not files:
        print(f"no result carries series {args.series!r}", file=sys.stderr)
        return 1
    scenario = str(json.loads(files[0].read_text()).get("scenario"))
    path = write_series(scenario, files, args.series, smoke=args.smoke)
    print(path.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
