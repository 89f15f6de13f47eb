"""`agent-sandbox bench ...` (= `python -m benchmarks ...` in the checkout): run scenarios, write results,
regenerate docs/performance.md.

    agent-sandbox bench list
    agent-sandbox bench burst|sustained|refill|cold|scale [--smoke] [--set key=value ...] [--no-report]
    agent-sandbox bench all [--smoke] [--set key=value ...]
    agent-sandbox bench report [--include-smoke]   # --include-smoke: a preview, benchmarks/results/tmp/

Each scenario brings up its own local cluster (torn down afterwards), writes
`benchmarks/results/<scenario>-<UTC timestamp>.json`, and (unless `--no-report`) regenerates the generated
block of docs/performance.md and the PNG plots in docs/performance/ from the newest non-smoke result of each
scenario. `--smoke` runs a small preset (minutes) whose results go to the git-ignored
`benchmarks/results/tmp/` and never into the doc: `report --include-smoke` renders them into
`benchmarks/results/tmp/performance-preview.md` instead. Parameters are also read from `BENCH_<KEY>`; an
unknown parameter or a value of the wrong type is a usage error (exit 2) before any cluster starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import plots, report
from . import series as series_spread
from .interrupt import exit_status, stop_cleanly_on_sigterm
from .log import log
from .result_files import RESULTS, write_result
from .scenario_params import ParamError, resolve_params
from .scenarios import SCENARIOS, run_scenario

__all__ = ["main", "regenerate_report"]

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "performance.md"
# One run is one draw from a shared machine (issue 20): a full-size measurement is this many, back to back.
DEFAULT_RUNS = 5
PLOTS = ROOT / "docs" / "performance"


def regenerate_report(*, include_smoke: bool = False) -> Path:
    """Rewrite the generated block of docs/performance.md (and the plots) from the latest results.

    With `include_smoke` nothing tracked is touched: the report, smoke results included and labelled as
    such, goes to `benchmarks/results/tmp/performance-preview.md` (git-ignored) with its plots beside it, and
    that path is returned. Smoke sizes are minutes-long checks, not measurements: they never reach the doc.
    """
    if include_smoke:
        return _preview()
    paths = list(RESULTS.glob("*.json"))
    results = report.latest(paths)
    drawn = plots.render_all(results, PLOTS, DOC.parent) if results else {}
    spreads = series_spread.latest_spreads(paths)
    text = report.render(results, drawn, report.tagged(RESULTS.glob("*.json")), spreads)
    if results and not drawn:
        text += "\n_(plots skipped: matplotlib is not installed; `pip install -e '.[bench]'`)_\n"
    doc = DOC.read_text() if DOC.exists() else "# Performance\n"
    DOC.write_text(report.replace_block(doc, text))
    return DOC


def preview_path() -> Path:
    """Where `bench report --include-smoke` writes its preview (under the git-ignored results/tmp/)."""
    return RESULTS / "tmp" / "performance-preview.md"


def _preview() -> Path:
    out = preview_path()
    paths = [*RESULTS.glob("*.json"), *RESULTS.glob("tmp/*.json")]
    results = report.latest(paths, include_smoke=True)
    drawn = plots.render_all(results, out.parent / "preview-plots", out.parent) if results else {}
    spreads = series_spread.latest_spreads(paths, include_smoke=True)
    text = report.render(results, drawn, report.tagged(RESULTS.glob("*.json")), spreads)
    smoke = sorted(f"{name} (`{r.get('_file', '?')}`)" for name, r in results.items() if r.get("smoke"))
    banner = [
        "# Performance report preview (smoke results included)",
        "",
        "**Not the published figures.** Written by `agent-sandbox bench report --include-smoke`; "
        "docs/performance.md is unchanged.",
        "",
        f"Smoke runs (small sizes, a quick check, not a measurement): {', '.join(smoke) if smoke else 'none'}.",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(banner) + "\n" + text)
    return out


def _overrides(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ParamError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def _headline(name: str, data: dict[str, object]) -> str:
    res = data.get("result")
    if not isinstance(res, dict):
        return ""
    if name == "burst":
        lat = res["latency_ms"]
        return (
            f"histogram P50/P90/P99 {lat['controller_histogram'].get('p50')}/"
            f"{lat['controller_histogram'].get('p90')}/{lat['controller_histogram'].get('p99')} ms; "
            f"client {lat['client_watch'].get('p50')}/{lat['client_watch'].get('p90')}/"
            f"{lat['client_watch'].get('p99')} ms; gate {report.gate_verdict(lat['controller_histogram'])}"
        )
    if name == "overload":
        lat, lease = res["latency_ms"]["client_watch"], res.get("lease") or {}
        return (
            f"client P50/P99 {lat.get('p50')}/{lat.get('p99')} ms, ready {res.get('ready')}/{res.get('claims')}, "
            f"{res.get('launch_types')}, lease renewals {lease.get('renewals')} (max gap {lease.get('max_gap_s')} s, "
            f"holder changes {lease.get('holder_changes')}), controller alive {res.get('controller_alive')}"
        )
    if name == "sustained":
        return f"knee {res.get('knee_per_s')}/s (first failing {res.get('broke_at_per_s')}/s)"
    if name == "refill":
        return f"all Ready {res.get('all_ready_s')} s, creates/s {res.get('creates_per_s_mean')}"
    if name == "cold":
        return f"all Ready {res.get('all_ready_s')} s"
    if name == "scale":
        idle = res.get("idle") or {}
        return f"controller RSS {idle.get('controller_rss_mib')} MiB idle"
    return ""


def _params(name: str, names: Sequence[str], smoke: bool, overrides: dict[str, str]) -> dict[str, Any]:
    scenario = SCENARIOS[name]
    # Overrides that a scenario does not know are skipped for `all` (e.g. `pool` only means burst).
    known = {k: v for k, v in overrides.items() if k in scenario.defaults or len(names) == 1}
    return resolve_params(scenario, smoke=smoke, overrides=known)


def run(
    names: Sequence[str],
    *,
    smoke: bool,
    overrides: dict[str, str],
    write_report: bool,
    tag: str = "",
    runs: int = 1,
) -> int:
    """Run each scenario `runs` times back to back; a series of several runs also gets a spread file."""
    code = 0
    # Every scenario's parameters first: a mistyped one is reported before any cluster starts (ParamError).
    resolved = {name: _params(name, names, smoke, overrides) for name in names}
    for name, params in resolved.items():
        scenario = SCENARIOS[name]
        log(f"scenario {name}: {runs} run(s), {json.dumps(params, sort_keys=True)}")
        # One id for the runs taken together, so the report and `benchmarks.series` find them again.
        series = f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}" if runs > 1 else ""
        written: list[Path] = []
        for index in range(runs):
            try:
                data = asyncio.run(run_scenario(scenario, params))
            except KeyboardInterrupt as stop:
                # Ctrl-C, `kill` or a hangup (benchmarks/interrupt.py): the run's `finally` blocks have torn its
                # cluster down by now; one line and the status a shell gives for the signal, not a traceback.
                how = str(stop) or "Ctrl-C"
                log(f"scenario {name} run {index + 1}/{runs} interrupted ({how}); nothing of it is kept")
                return exit_status(stop)
            except Exception as exc:
                log(f"scenario {name} run {index + 1}/{runs} failed: {type(exc).__name__}: {exc}")
                code = 1
                continue
            if tag:
                data["tag"] = tag
            if series:
                data["series"] = {"id": series, "run": index + 1, "of": runs}
            # Smoke runs go to results/tmp/ (git-ignored); only full-size runs are kept and reported.
            path = write_result(
                f"{name}-{tag}" if tag else name, data, directory=RESULTS / "tmp" if smoke else None
            )
            written.append(path)
            log(f"scenario {name} run {index + 1}/{runs}: {_headline(name, data)} -> {path}")
        if series and len(written) > 1:
            log(
                f"scenario {name}: spread -> {series_spread.write_series(name, written, series, smoke=smoke, directory=written[0].parent)}"
            )
    if write_report and not smoke:
        log(f"report: {regenerate_report()}")
    elif smoke:
        log(
            "smoke run: docs/performance.md left as is (`agent-sandbox bench report --include-smoke` writes "
            f"a preview with the smoke results to {_shown(preview_path())})"
        )
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-sandbox bench", description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=[*SCENARIOS, "all", "report", "list"])
    parser.add_argument("--smoke", action="store_true", help="small sizes (a quick check, minutes)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--no-report", action="store_true", help="do not regenerate docs/performance.md")
    parser.add_argument(
        "--include-smoke",
        action="store_true",
        help="report: also use smoke results, into a preview (benchmarks/results/tmp/performance-preview.md; "
        "docs/performance.md is not touched)",
    )
    parser.add_argument(
        "--tag", default="", help="label an experiment (e.g. before/after a fix): kept out of the main tables"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=None,
        help="back-to-back runs per scenario (default 5, smoke 1); their spread goes to spread-<scenario>-*",
    )
    args = parser.parse_args(argv)
    if args.scenario == "list":
        for s in SCENARIOS.values():
            defaults = ", ".join(f"{k}={v}" for k, v in s.defaults.items())
            print(f"{s.name:<10} {s.summary}\n{'':<10} {defaults}")
        return 0
    if args.scenario == "report":
        written = regenerate_report(include_smoke=args.include_smoke)
        if args.include_smoke:
            print(f"preview (smoke results included; docs/performance.md unchanged): {written}")
        else:
            print(written)
        return 0
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    runs = args.runs if args.runs is not None else (1 if args.smoke else DEFAULT_RUNS)
    if runs < 1:
        parser.error("--runs must be >= 1")
    try:
        return run(
            names,
            smoke=args.smoke,
            overrides=_overrides(args.overrides),
            write_report=not args.no_report,
            tag=args.tag,
            runs=runs,
        )
    except ParamError as exc:
        parser.error(str(exc))  # one line and exit 2, as argparse reports its own usage errors


def _shown(path: Path) -> str:
    """`path` relative to the checkout when it is inside it (shorter in a log line)."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    sys.exit(main())
