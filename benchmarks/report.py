"""Render benchmark results (the JSON files under benchmarks/results/) as markdown for docs/performance.md.

Pure: dicts in, text out. `render(results, plots)` builds the generated part of the report;
`replace_block(doc, text)` swaps it in between the `BEGIN/END GENERATED` markers so the hand-written
analysis around it survives a regeneration. `latest(paths)` picks the newest result per scenario.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "BEGIN",
    "END",
    "cost_per_claim",
    "experiments",
    "gate_verdict",
    "latest",
    "render",
    "replace_block",
    "spreads_section",
    "tagged",
]

BEGIN = "<!-- BEGIN GENERATED: agent-sandbox bench report -->"
END = "<!-- END GENERATED -->"
GATE = {"p50": 300.0, "p90": 300.0, "p99": 500.0}
"""Upstream KWOK presubmit thresholds on the controller histogram (operations spec §9.7)."""


def _f(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int):
        text = f"{value:.{digits}f}" if digits else f"{round(value):d}"
        return text + unit
    return str(value)


def _g(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else "?"


def _ppp(stats: Mapping[str, Any] | None) -> str:
    if not stats or not stats.get("count"):
        return "-"
    return f"{_f(stats.get('p50'))} / {_f(stats.get('p90'))} / {_f(stats.get('p99'))}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def gate_verdict(hist: Mapping[str, Any] | None) -> str:
    """'pass' / 'FAIL' against the KWOK gate thresholds (no samples fails, as upstream)."""
    if not hist or not hist.get("count"):
        return "FAIL (no samples)"
    failed = [k for k, limit in GATE.items() if hist.get(k) is None or float(hist[k]) > limit]
    return "pass" if not failed else "FAIL (" + ", ".join(failed) + ")"


def latest(paths: Iterable[Path], *, include_smoke: bool = False) -> dict[str, dict[str, Any]]:
    """Newest result per scenario (by file name timestamp); smoke runs only if asked."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in sorted(paths):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or "scenario" not in data or data["scenario"] == "spread":
            continue  # spread records summarize runs; `series.latest_spreads` picks those
        if (data.get("smoke") and not include_smoke) or data.get("tag"):
            continue  # smoke runs and tagged experiments (before/after) stay out of the main tables
        data.setdefault("_file", path.name)
        out[data["scenario"]] = (path.name, data)
    return {k: v[1] for k, v in sorted(out.items())}


def tagged(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every tagged (experiment) result, oldest first."""
    out: list[dict[str, Any]] = []
    for path in sorted(paths, key=lambda p: p.name.rsplit("-", 1)[-1]):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("tag") and not data.get("smoke"):
            data.setdefault("_file", path.name)
            out.append(data)
    return out


def _experiment_row(r: Mapping[str, Any], workload: str, res: Mapping[str, Any]) -> tuple[str, ...]:
    lat, tp, usage = res["latency_ms"], res.get("throughput") or {}, res.get("usage") or {}
    internals = res.get("controller_internals_ms") or {}
    ready = res.get("ready") or 0
    ctrl_cpu = (usage.get("cpu_seconds") or {}).get("agent-sandbox-controller")
    return (
        f"`{r.get('tag')}`",
        workload,
        _ppp(lat.get("client_watch")),
        _ppp(lat.get("controller_histogram")),
        _f(tp.get("ready_per_s_mean"), 1),
        _f((internals.get("claim_queue_wait") or {}).get("mean")),
        _f((internals.get("rest_patch") or {}).get("mean")),
        _f(1000 * ctrl_cpu / ready, 1) if ctrl_cpu and ready else "-",
        f"{_f(usage.get('load1_min'), 1)}-{_f(usage.get('load1_max'), 1)}",
        f"`{r.get('_file', '')}`",
    )


def experiments(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per tagged claim run (a sustained run: one per phase): the comparisons of docs/performance.md."""
    rows = []
    for r in results:
        res = r.get("result") or {}
        par = r.get("params") or {}
        if "latency_ms" in res:
            # An overload run keeps its rate and pools in the result, not in the parameters.
            rate, seconds = res.get("rate", par.get("rate")), res.get("seconds", par.get("seconds"))
            pool = res.get("pool_replicas", par.get("pool", "?"))
            workload = f"{r['scenario']} {_g(rate)}/s x {_g(seconds)} s, pool {pool}"
            rows.append(_experiment_row(r, workload, res))
        for phase in res.get("phases") or ():
            if "latency_ms" in phase:
                workload = (
                    f"{r['scenario']} {_g(phase.get('rate'))}/s x {_g(phase.get('seconds'))} s, "
                    f"pools {par.get('pools', '?')} x {phase.get('pool_replicas', '?')}"
                )
                rows.append(_experiment_row(r, workload, phase))
    if not rows:
        return []
    header = [
        "tag",
        "workload",
        "client P50/P90/P99 ms",
        "histogram P50/P90/P99 ms",
        "Ready/s",
        "claim queue wait ms",
        "PATCH ms",
        "controller CPU ms/claim",
        "load1",
        "file",
    ]
    return ["### Experiments (tagged runs, interleaved before/after)", "", *_table(header, rows), ""]


def _load_line(r: Mapping[str, Any]) -> str:
    load = r.get("load") or {}
    before, after = load.get("before") or [None], load.get("after") or [None]
    return f"load average before {_f(before[0], 2)}, after {_f(after[0], 2)}"


def _usage_line(usage: Mapping[str, Any] | None) -> str:
    if not usage or not usage.get("cpu_cores"):
        return "-"
    cores = sorted(usage["cpu_cores"].items(), key=lambda kv: -kv[1])
    parts = ", ".join(f"{k} {v:.2f}" for k, v in cores)
    return f"{usage.get('cpu_cores_total', 0):.2f} cores total ({parts}); load1 {_f(usage.get('load1_min'), 1)}-{_f(usage.get('load1_max'), 1)}"


def _machine(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    any_result = next(iter(results.values()))
    host = any_result.get("host") or {}
    cluster = any_result.get("cluster") or {}
    cfg = cluster.get("cluster_config") or {}
    rows = [
        (
            "CPU",
            f"{host.get('cpu_model', '?')}, {host.get('cpus', '?')} cores (shared with the whole control plane)",
        ),
        ("memory", f"{host.get('memory_gib', '?')} GiB"),
        ("kernel / Python", f"{host.get('kernel', '?')} / {host.get('python', '?')}"),
        (
            "control plane",
            f"Kubernetes {host.get('kubernetes', '?')}, etcd {host.get('etcd', '?')}, kwok {host.get('kwok', '?')}",
        ),
        ("client libraries", ", ".join(f"{k} {v}" for k, v in (host.get("packages") or {}).items()) or "-"),
        (
            "agent-sandbox commit",
            f"{host.get('git_commit', '?')}{' (+ local changes)' if host.get('git_dirty') else ''}",
        ),
        (
            "cluster",
            f"{cfg.get('nodes', '?')} kwok nodes, kube-apiserver --max-requests-inflight={cfg.get('max_requests_inflight', '?')} "
            f"--max-mutating-requests-inflight={cfg.get('max_mutating_requests_inflight', '?')}, etcd "
            f"{'--unsafe-no-fsync' if cfg.get('etcd_unsafe_no_fsync') else 'with fsync'}, scheduler QPS "
            f"{cfg.get('scheduler_qps', '?')}/{cfg.get('scheduler_burst', '?')}, controller-manager QPS "
            f"{cfg.get('controller_manager_qps', '?')}/{cfg.get('controller_manager_burst', '?')}"
            + _pod_start(cfg),
        ),
        ("controller flags", "`" + " ".join(cluster.get("controller_flags") or []) + "`"),
    ]
    return ["### Machine, versions, flags", "", *_table(["", ""], rows), ""]


def _pod_start(cfg: Mapping[str, Any]) -> str:
    delay, jitter = cfg.get("pod_start_delay_ms"), cfg.get("pod_start_jitter_ms")
    if delay is None:  # results from before the knob existed: pods started at once
        return ""
    if not delay and not jitter:
        start = ", pods Ready at once (kwok's instant pod-ready, as the KWOK gate)"
    else:
        start = f", pod start {delay}-{delay + (jitter or 0)} ms"
    # Results from before the pod_deletion knob had the graceful deletion.
    if cfg.get("pod_deletion") == "instant":
        return start + ", deleted pods removed at once (kwok's fast pod-delete, as the KWOK gate)"
    return start + ", graceful pod deletion (NotReady, capped grace period, terminated status, as a kubelet)"


def _claim_views(phase: Mapping[str, Any]) -> list[Sequence[str]]:
    lat = phase.get("latency_ms") or {}
    hist = lat.get("controller_histogram") or {}
    return [
        ("controller histogram (gate method, bucket-interpolated)", _ppp(hist), _f(hist.get("count"))),
        (
            "controller annotations (first-observed -> first-ready, exact)",
            _ppp(lat.get("controller_annotations")),
            _f((lat.get("controller_annotations") or {}).get("count")),
        ),
        (
            "client create sent -> Ready on the watch (exact)",
            _ppp(lat.get("client_watch")),
            _f((lat.get("client_watch") or {}).get("count")),
        ),
        (
            "client create sent -> create acknowledged",
            _ppp(lat.get("create_ack")),
            _f((lat.get("create_ack") or {}).get("count")),
        ),
        (
            "client create sent -> controller first observed",
            _ppp(lat.get("create_to_first_observed")),
            _f((lat.get("create_to_first_observed") or {}).get("count")),
        ),
    ]


def cost_per_claim(phase: Mapping[str, Any]) -> list[str]:
    """Markdown lines: CPU ms per Ready claim by component, and API writes per claim by resource."""
    ready = phase.get("ready") or 0
    usage = phase.get("usage") or {}
    cpu = usage.get("cpu_seconds") or {}
    writes = phase.get("apiserver_writes") or {}
    if not ready or not (cpu or writes):
        return []
    base = phase.get("baseline_cores") or {}
    span = float(usage.get("seconds") or 0.0)
    net = {k: max(0.0, v - float(base.get(k, 0.0)) * span) for k, v in cpu.items()}
    cpu_rows = sorted(((k, 1000.0 * v / ready) for k, v in net.items() if v), key=lambda kv: -kv[1])
    total = sum(v for _, v in cpu_rows)
    gross = sum(1000.0 * v / ready for v in cpu.values())
    lines = [
        f"Cost per Ready claim (everything the claims caused during the window, including pool refill, "
        f"minus the idle baseline measured just before): **{total:.1f} ms CPU** (gross {gross:.1f}) - "
        + ", ".join(f"{k} {v:.1f}" for k, v in cpu_rows)
        + " ms.",
        "",
    ]
    if writes:
        rows = sorted(((k, v / ready) for k, v in writes.items()), key=lambda kv: (-kv[1], kv[0]))
        lines += [
            f"API writes per claim: **{sum(v for _, v in rows):.1f}** - "
            + ", ".join(f"{k} {v:.2f}" for k, v in rows)
            + ".",
            "",
        ]
    internals = phase.get("controller_internals_ms") or {}
    parts = []
    for key, label in (
        ("rest_patch", "controller PATCH latency"),
        ("rest_post", "POST latency"),
        ("claim_queue_wait", "claim work-queue wait"),
        ("claim_reconcile", "claim reconcile time"),
    ):
        st = internals.get(key) or {}
        if st.get("count"):
            parts.append(f"{label} mean {_f(st.get('mean'), 1)} / P99 ~{_f(st.get('p99'))} ms")
    if parts:
        lines += ["Controller internals: " + "; ".join(parts) + ".", ""]
    return lines


def _burst(r: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    res, par = r["result"], r["params"]
    tp = res.get("throughput") or {}
    hist = (res.get("latency_ms") or {}).get("controller_histogram")
    lines = [
        f"### burst: pool {par['pool']}, {par['rate']:g} claims/s for {par['seconds']:g} s",
        "",
        f"{res['ready']}/{res['claims']} claims Ready ({res.get('create_errors', 0)} create errors), "
        f"launch types {res.get('launch_types')}; pool filled in {res.get('pool_fill_s')} s; {_load_line(r)}.",
        "",
        *_table(["latency view", "P50 / P90 / P99 (ms)", "samples"], _claim_views(res)),
        "",
        f"KWOK gate (histogram P50 <= 300, P90 <= 300, P99 <= 500 ms): **{gate_verdict(hist)}**. "
        f"Throughput: offered {_f(tp.get('offered_per_s'), 1)}/s, Ready {_f(tp.get('ready_per_s_mean'), 1)}/s mean, "
        f"peak {_f(tp.get('ready_per_s_peak_1s'), 1)}/s (1 s); all Ready {_f(tp.get('all_ready_after_s'), 2)} s after the first create. "
        f"CPU during the burst: {_usage_line(res.get('usage'))}.",
        "",
        *cost_per_claim(res),
    ]
    lines += _plots(plots, "burst")
    return lines


def _sustained(r: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    res, par = r["result"], r["params"]
    rows = []
    for ph in res.get("phases") or []:
        lat = ph.get("latency_ms") or {}
        tp = ph.get("throughput") or {}
        usage = ph.get("usage") or {}
        rows.append(
            (
                f"{ph['rate']:g}",
                f"{ph['seconds']:g}",
                f"{ph['ready']}/{ph['claims']}",
                _ppp(lat.get("client_watch")),
                _ppp(lat.get("controller_histogram")),
                _ppp(lat.get("controller_annotations")),
                _f(tp.get("ready_per_s_mean"), 1),
                ", ".join(f"{k} {v}" for k, v in sorted((ph.get("launch_types") or {}).items())),
                f"{ph.get('pool_replicas')}",
                _f(usage.get("cpu_cores_total"), 2),
                f"{_f(usage.get('load1_min'), 1)}-{_f(usage.get('load1_max'), 1)}",
                "yes" if ph.get("passes_p99") else "**no**",
            )
        )
    knee = res.get("knee_per_s")
    lines = [
        f"### sustained: Poisson arrivals over {par['pools']} pools, claims deleted {par['dwell_s']:g} s after Ready",
        "",
        f"Seeded (seed {par['seed']} + phase index); pool replicas = ceil(rate / pools x {par['headroom_s']:g} s). "
        f"First phase {par['rate']:g}/s for {par['seconds']:g} s, then steps {par['steps']} claims/s of "
        f"{par['step_seconds']:g} s each. {_load_line(r)}.",
        "",
        *_table(
            [
                "rate /s",
                "s",
                "Ready",
                "client P50/P90/P99 ms",
                "histogram P50/P90/P99 ms",
                "annotations P50/P90/P99 ms",
                "Ready/s",
                "launch",
                "pool/ns",
                "CPU cores",
                "load1",
                f"P99 <= {par['knee_p99_ms']:g}",
            ],
            rows,
        ),
        "",
        f"**Knee: {_f(knee)} claims/s** (highest step meeting: {res.get('knee_criterion')}); "
        f"first failing step: {_f(res.get('broke_at_per_s'))}/s.",
        "",
    ]
    phases = res.get("phases") or []
    if phases:
        lines += [f"First phase ({phases[0]['rate']:g}/s):", "", *cost_per_claim(phases[0])]
    lines += _plots(plots, "sustained")
    return lines


def _refill(r: Mapping[str, Any], plots: Mapping[str, str]) -> list[str]:
    res = r["result"]
    rows = [
        ("pool 0 -> N", f"{res['replicas']}"),
        ("all members Ready (watch)", _f(res.get("all_ready_s"), 2, " s")),
        ("pool status readyReplicas = N", _f(res.get("pool_status_ready_s"), 2, " s")),
        (
            "first create / first Ready",
            f"{_f(res.get('first_create_s'), 3, ' s')} / {_f(res.get('first_ready_s'), 3, ' s')}",
        ),
        (
            "Sandbox creates/s mean / peak (1 s)",
            f"{_f(res.get('creates_per_s_mean'), 1)} / {_f(res.get('creates_per_s_peak_1s'), 1)}",
        ),
        (
            "Ready/s mean / peak (1 s)",
            f"{_f(res.get('ready_per_s_mean'), 1)} / {_f(res.get('ready_per_s_peak_1s'), 1)}",
        ),
        ("CPU during the fill", _usage_line(res.get("usage"))),
        (
            "controller requests",
            ", ".join(f"{k} {int(v)}" for k, v in (res.get("controller_requests") or {}).items()),
        ),
    ]
    return [
        "### refill: one pool 0 -> N Ready",
        "",
        f"{_load_line(r)}. Upstream reference: 0 -> 300 Ready in ~6.4 s (sandbox creates ~85/s with APF queueing).",
        "",
        *_table(["", ""], rows),
        "",
        *_plots(plots, "refill"),
    ]


def _cold(r: Mapping[str, Any]) -> list[str]:
    res = r["result"]
    rows = [
        ("Sandboxes (no pool)", f"{res.get('count')}"),
        ("create requests sent in", _f(res.get("create_requests_s"), 2, " s")),
        (
            "first / all Ready",
            f"{_f(res.get('first_ready_s'), 2, ' s')} / **{_f(res.get('all_ready_s'), 2, ' s')}**",
        ),
        (
            "per-Sandbox create -> Ready P50 / P90 / P99",
            f"{_f(res.get('latency_p50_s'), 2)} / {_f(res.get('latency_p90_s'), 2)} / {_f(res.get('latency_p99_s'), 2)} s",
        ),
        ("controller CPU", _f(res.get("controller_cpu_s"), 1, " s")),
        (
            "controller RSS before / peak",
            f"{res.get('controller_rss_before_mib')} / {res.get('controller_peak_rss_mib')} MiB",
        ),
        (
            "controller API requests",
            ", ".join(f"{k} {int(v)}" for k, v in (res.get("controller_requests") or {}).items() if v),
        ),
        ("CPU during the run", _usage_line(res.get("usage"))),
    ]
    return ["### cold: Sandboxes without a pool", "", f"{_load_line(r)}.", "", *_table(["", ""], rows), ""]


def _scale(r: Mapping[str, Any]) -> list[str]:
    res = r["result"]
    fill, idle, touch = res.get("fill") or {}, res.get("idle") or {}, res.get("touch") or {}
    ctrl = "agent-sandbox-controller"
    rows = [
        ("Sandboxes", f"{res.get('count')} ({res.get('create_errors', 0)} create errors)"),
        (
            "create -> all Ready",
            f"{_f(res.get('all_ready_s'), 1, ' s')} ({_f(res.get('ready_per_s_mean'), 1)}/s)",
        ),
        (
            "controller CPU during the fill",
            f"{_f(fill.get('controller_cpu_s'), 1, ' s')} ({_f(fill.get('cpu_ms_per_sandbox'), 2)} ms per Sandbox, {_f(fill.get('cpu_ms_per_reconcile'), 2)} ms per reconcile)",
        ),
        (
            "reconciles during the fill",
            ", ".join(f"{k} {int(v)}" for k, v in (fill.get("reconciles") or {}).items()),
        ),
        (
            "controller RSS idle / peak",
            f"**{_f(idle.get('controller_rss_mib'), 1)} MiB** / {_f(idle.get('controller_peak_rss_mib'), 1)} MiB",
        ),
        (
            "controller CPU idle",
            f"{_f((idle.get('cpu_cores') or {}).get(ctrl), 3)} cores over {_f(idle.get('seconds'), 0)} s "
            f"(measured {_f(res.get('quiet_after_ready_s'), 0, ' s')} after the last Ready, once reconciles "
            "stopped); reconciles "
            + (", ".join(f"{k} {int(v)}" for k, v in (idle.get("reconciles") or {}).items()) or "none")
            + ", API requests "
            + (
                ", ".join(f"{k} {int(v)}" for k, v in (idle.get("controller_requests") or {}).items())
                or "none"
            ),
        ),
        (
            "RSS of every component (idle)",
            ", ".join(f"{k} {v}" for k, v in (idle.get("rss_mib") or {}).items()),
        ),
        (
            "no-op event cost",
            f"{touch.get('events')} metadata patches -> "
            + ", ".join(f"{k} {int(v)}" for k, v in (touch.get("reconciles") or {}).items())
            + f" reconciles; **{_f(_per(touch.get('controller_cpu_s'), touch.get('events')), 2)} ms CPU per event**"
            f" gross (an upper bound: includes whatever else ran in the {_f(touch.get('seconds'), 1)} s window),"
            f" {_f(touch.get('cpu_ms_per_event'), 2)} ms net of the idle rate",
        ),
    ]
    return ["### scale: idle Sandboxes", "", f"{_load_line(r)}.", "", *_table(["", ""], rows), ""]


def _per(total_s: Any, count: Any) -> float | None:
    """Milliseconds per item, or None."""
    if not isinstance(total_s, int | float) or not isinstance(count, int | float) or not count:
        return None
    return 1000.0 * float(total_s) / float(count)


def _plots(plots: Mapping[str, str], prefix: str) -> list[str]:
    out = [f"![{name}]({path})" for name, path in sorted(plots.items()) if name.startswith(prefix)]
    return [*out, ""] if out else []


def _profiles(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines: list[str] = []
    for name, r in results.items():
        res = r.get("result") or {}
        profs: list[tuple[str, Mapping[str, Any]]] = []
        if res.get("profile"):
            profs.append((name, res["profile"]))
        for ph in res.get("phases") or []:
            if ph.get("profile"):
                profs.append((f"{name} {ph['rate']:g}/s", ph["profile"]))
        for label, p in profs:
            if not p.get("samples"):
                continue
            areas = ", ".join(f"{a['name']} {a['pct']}%" for a in (p.get("areas") or [])[:8])
            top = [
                (str(i + 1), f"`{e['name']}`", f"{e['pct']}%")
                for i, e in enumerate((p.get("self") or [])[:12])
            ]
            lines += [
                f"#### profile: {label} ({p['samples']} samples, `{p.get('file', '')}`)",
                "",
                f"Self time by area: {areas}.",
                "",
                *_table(["#", "function (self time)", "share"], top),
                "",
            ]
    return (["### Profiles (py-spy, controller process)", "", *lines]) if lines else []


def spreads_section(spreads: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The newest series of each scenario: its spread (min / median / max across back-to-back runs)."""
    if not spreads:
        return []
    lines = [
        "### Run-to-run spread (newest series of each scenario)",
        "",
        "Each scenario run back to back (`agent-sandbox bench <scenario> --runs 5`), as a user would, without",
        "waiting for a quiet machine. The single-run sections below show the newest run's detail.",
        "",
    ]
    order = ["burst", "sustained", "overload", "refill", "cold", "scale"]

    def rank(key: str) -> tuple[int, str]:
        base = key.split(" ", 1)[0]
        return (order.index(base) if base in order else len(order), key)

    for name in sorted(spreads, key=rank):
        record = spreads[name]
        lines += [
            f"#### {name} (`{record.get('_file', '')}`)",
            "",
            str(record.get("markdown", "")).rstrip(),
            "",
        ]
    return lines


def render(
    results: Mapping[str, Mapping[str, Any]],
    plots: Mapping[str, str] | None = None,
    tagged_runs: Sequence[Mapping[str, Any]] = (),
    spreads: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The generated report section: spreads of the newest series, then the latest result per scenario."""
    plots = plots or {}
    if not results:
        return "_No benchmark results yet: run `make bench` (or `agent-sandbox bench <scenario>`)._\n"
    lines: list[str] = _machine(results)
    lines += spreads_section(spreads or {})
    renderers = {
        "burst": lambda r: _burst(r, plots),
        "sustained": lambda r: _sustained(r, plots),
        "refill": lambda r: _refill(r, plots),
        "cold": _cold,
        "scale": _scale,
    }
    for name in ("burst", "sustained", "refill", "cold", "scale"):
        if name in results:
            lines += renderers[name](results[name])
    lines += _profiles(results)
    lines += experiments(tagged_runs)
    files = ", ".join(f"`{r.get('_file', '?')}`" for r in results.values())
    lines += [f"Source files (benchmarks/results/): {files}.", ""]
    return "\n".join(lines)


def replace_block(doc: str, generated: str) -> str:
    """Put `generated` between the markers of `doc` (appending the block when it has none)."""
    block = f"{BEGIN}\n{generated.rstrip()}\n{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return head + block + tail
    return doc.rstrip() + "\n\n" + block + "\n"
