"""Markdown for the router benchmark: the generated block of docs/performance.md's router section."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["BEGIN", "END", "render", "update_doc"]

BEGIN = "<!-- BEGIN GENERATED: python -m benchmarks.router -->"
END = "<!-- END GENERATED: python -m benchmarks.router -->"
GO_REFERENCE = {10: (7709, 4.5), 50: (7704, 17.0), 200: (6637, 74.0)}
"""Upstream's Go router on this machine type, same wrk load, small REST backend: c -> (req/s, p99 ms)."""


def _spread(s: Mapping[str, float], digits: int = 0) -> str:
    if not s:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def render(result: Mapping[str, Any], filename: str) -> str:
    host = result["host"]
    params = result["params"]
    lines = [
        f"Runs: `benchmarks/results/` {filename} (newest per backend; last run {result['elapsed_s']:.0f} s, {params['rounds']} rounds x "
        f"{params['duration']:.0f} s per cell, wrk 2 threads). Machine: {host['cpus']} CPUs ({host['cpu_model']}), "
        f"Python {host['python']}, commit {host['git_commit']}. Load average at start "
        f"{', '.join(f'{x:.2f}' for x in host['loadavg'])}; the machine is shared, so each cell also records "
        "the load it ran under (last column).",
        "",
        "Values: median (min-max) over rounds. `direct` = wrk straight to the backend (the backend's own cost); "
        "router rows go through `agent-sandbox-router` to the same backend. CPU = router CPU microseconds per "
        "request (all its processes), a load-independent measure of its own cost.",
        "",
        "| backend | target | c | body | req/s | p50 ms | p95 ms | p99 ms | router CPU us/req | errors | load |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = sorted(
        result["summary"],
        key=lambda r: (r["backend"], r["concurrency"], r["body"], r["target"] != "direct", r["target"]),
    )
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['target']} | {r['concurrency']} | {r['body']} | {_spread(r['rps'])} | "
            f"{_spread(r['p50_ms'], 1)} | {_spread(r['p95_ms'], 1)} | {_spread(r['p99_ms'], 1)} | "
            f"{_spread(r['router_cpu_us_per_req'])} | {r['errors']} | {_spread(r['load'], 1)} |"
        )
    lines += [
        "",
        "Upstream's Go router (issue reference, same machine type and wrk load, small REST backend):",
    ]
    lines += [f"c={c}: {rps:,} req/s, p99 {p99:g} ms." for c, (rps, p99) in GO_REFERENCE.items()]
    rss = result.get("rss") or {}
    if rss:
        lines += [
            "",
            f"Router RSS with {rss['streams']} concurrent open streams (requests the backend holds open; "
            f"{rss['completed']} completed): idle {rss['idle_mib']} MiB, while open {rss['open_mib']} MiB, "
            f"peak {rss['peak_mib']} MiB (Go router: 44-66 MiB).",
        ]
    return "\n".join(lines) + "\n"


def replace_block(doc: str, block: str) -> str:
    """Swap the generated block (appending the router section if the doc has none yet)."""
    wrapped = f"{BEGIN}\n{block}{END}"
    if BEGIN in doc and END in doc:
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        return head + wrapped + tail
    return doc.rstrip() + "\n\n## Sandbox Router\n\n" + wrapped + "\n"


def update_doc(doc: Path, result: Mapping[str, Any], filename: str) -> None:
    text = doc.read_text() if doc.exists() else "# Performance\n"
    doc.write_text(replace_block(text, render(result, filename)))


def combine(results: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[dict[str, Any], str]:
    """One result from several runs: for each backend the rows of the newest run that measured it.

    Args:
        results: (file name, result) pairs, oldest first.

    Returns:
        (combined result, the file names it came from, comma-separated).
    """
    newest: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for name, result in results:
        for backend in result["params"]["backends"]:
            newest[backend] = (name, result)
    used = {name: result for name, result in newest.values()}
    latest_name, latest = results[-1]
    combined = dict(latest)
    combined["summary"] = [
        row
        for backend, (_, result) in newest.items()
        for row in result["summary"]
        if row["backend"] == backend
    ]
    if not combined.get("rss"):
        combined["rss"] = next((r["rss"] for r in reversed(list(used.values())) if r.get("rss")), {})
    return combined, ", ".join(sorted(used)) or latest_name


def best_variant(
    summary: Sequence[Mapping[str, Any]], backend: str, c: int, body: str = "empty"
) -> str | None:
    """The router variant with the highest median req/s for one cell (for the design note)."""
    rows = [r for r in summary if r["backend"] == backend and r["concurrency"] == c and r["body"] == body]
    rows = [r for r in rows if r["target"] != "direct" and r["rps"]]
    return max(rows, key=lambda r: r["rps"]["median"])["target"] if rows else None
