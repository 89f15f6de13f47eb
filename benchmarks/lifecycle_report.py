"""The Markdown summary of a lifecycle benchmark run (`benchmarks/lifecycle.py`) and its percentiles.

Owns: `markdown` (the tables of `lifecycle-<UTC>.md`, rendered from a result's parts) and `percentiles`
(p50/p90/p99 with min/max: how every lifecycle latency is summarized, in the JSON and in the tables).
"""

from __future__ import annotations

import statistics
from typing import Any

from .stats import summarize

__all__ = ["markdown", "percentiles"]


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """count, p50/p90/p99, min and max of latencies in seconds (3 digits)."""
    return summarize(values, digits=3)


def _row(label: str, values: list[float], rounds: list[float] | None = None) -> str:
    p = percentiles(values)
    spread = ""
    if rounds:
        spread = f" | {statistics.median(rounds):.2f} ({min(rounds):.2f}-{max(rounds):.2f})"
    return f"| {label} | {p['count']} | {p['p50']:.2f} | {p['p90']:.2f} | {p['p99']:.2f} | {p['min']:.2f}-{p['max']:.2f}{spread} |"


def markdown(report: dict[str, Any]) -> str:
    """The `.md` of a lifecycle result: one table or line per part that ran."""
    meta = report["meta"]
    md = [f"Load {meta['load_before']} -> {meta['load_after']} (2 cores shared with other work).", ""]
    parts = report["parts"]
    if "resume" in parts:
        r = parts["resume"]
        md += [
            f"**Resume on request** ({r['sandboxes']} PVC-backed Sandboxes, {r['rounds']} rounds; seconds, client-side):",
            "",
            "| request to | n | p50 | p90 | p99 | min-max | round medians |",
            "|---|---|---|---|---|---|---|",
            _row("a running Sandbox (baseline)", r["samples_s"]["running"]),
            _row(
                "a suspended Sandbox, one at a time",
                r["samples_s"]["sequential"],
                r["round_medians_s"]["sequential"],
            ),
            _row(
                f"{r['sandboxes']} suspended Sandboxes at once",
                r["samples_s"]["concurrent"],
                r["round_medians_s"]["concurrent"],
            ),
            "",
        ]
    if "warm_env" in parts:
        w = parts["warm_env"]
        md += [
            f"**Claim with env** ({w['claims_per_round']} claims per kind per round, {w['rounds']} rounds; seconds):",
            "",
            "| claim | phase | p50 | p90 | p99 | min-max |",
            "|---|---|---|---|---|---|",
        ]
        for kind, label in (
            ("warm", "warm (template projects the claim env)"),
            ("cold", "forced cold (upstream)"),
        ):
            for phase in ("ready", "first_command", "total"):
                p = w["latency_s"][kind][phase]
                md.append(
                    f"| {label} | {phase} | {p['p50']:.3f} | {p['p90']:.3f} | {p['p99']:.3f} | {p['min']:.3f}-{p['max']:.3f} |"
                )
        md += [
            "",
            f"Round medians of the total, warm {w['round_medians_total_s']['warm']}, cold {w['round_medians_total_s']['cold']}.",
            "",
        ]
    if "archive" in parts:
        a = parts["archive"]
        md += [
            f"**{a['archives']} hibernated Sandboxes**: etcd in use +{(a['etcd_in_use_bytes']['after_archives'] - a['etcd_in_use_bytes']['before']) / 2**20:.1f} MiB "
            f"({a['etcd_bytes_per_archive']} bytes per archive; the same JSON as ConfigMaps: {a['etcd_bytes_per_configmap']} bytes each); "
            f"archive JSON {a['archive_json_bytes']} bytes; created in {a['create_seconds']['archives']} s; "
            f"RSS before/after: {a['rss_mib_before']} -> {a['rss_mib_after_archives']} MiB.",
            "",
        ]
    if "activity" in parts:
        c = parts["activity"]
        md += [
            f"**Activity writes** ({c['writes']} `last-activity` patches at {c['rate_per_s']}/s over {c['sandboxes']} Running Sandboxes): "
            f"{c['cpu_ms_per_write_net_total']} ms CPU per write net of idle, by component {c['cpu_ms_per_write_net']}.",
            "",
        ]
    return "\n".join(md)
