"""PNG plots of the benchmark results (matplotlib, the `bench` extra): latency CDFs, throughput over time.

Each function takes a result dict and writes one PNG; `render_all` returns {plot name: relative path} for
the report. Without matplotlib nothing is drawn and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["available", "render_all"]


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax: Any, values: Sequence[float], label: str, **kw: Any) -> None:
    if not values:
        return
    xs = sorted(values)
    n = len(xs)
    ax.step(xs, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})", **kw)


def _gate_lines(ax: Any) -> None:
    ax.axvline(300, color="grey", linestyle=":", linewidth=1)
    ax.axvline(500, color="red", linestyle=":", linewidth=1)
    ax.text(300, 0.92, "300 ms ", color="grey", fontsize=7, ha="right")
    ax.text(500, 0.85, " 500 ms (gate P99)", color="red", fontsize=7)


def _hist_points(ax: Any, hist: Mapping[str, Any], color: str) -> None:
    pts = [(hist.get(k), q) for k, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))]
    pts = [(x, q) for x, q in pts if x is not None]
    if pts:
        ax.scatter(
            [x for x, _ in pts], [q for _, q in pts], marker="x", color=color, zorder=5,
            label="controller histogram P50/P90/P99 (gate method)",
        )  # fmt: skip


def burst(result: Mapping[str, Any], out: Path) -> list[Path]:
    plt = _plt()
    res = result["result"]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    _cdf(ax, res["samples_ms"]["client_watch"], "client create -> Ready (watch)")
    _cdf(ax, res["samples_ms"]["controller_annotations"], "controller first-observed -> Ready")
    _hist_points(ax, res["latency_ms"]["controller_histogram"], "black")
    _gate_lines(ax)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of claims")
    ax.set_title(
        f"burst: {result['params']['rate']:g} claims/s, pool {result['params']['pool']} - latency CDF"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    paths.append(out / "burst-latency-cdf.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key, label in (("sent_per_s", "claims created /s"), ("ready_per_s", "claims Ready /s")):
        series = res["series"][key]
        ax.step([t for t, _ in series], [v for _, v in series], where="post", label=label)
    ax.set_xlabel("seconds since the first create")
    ax.set_ylabel("per second")
    ax.set_title("burst: throughput over time")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(out / "burst-throughput.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def sustained(result: Mapping[str, Any], out: Path) -> list[Path]:
    plt = _plt()
    phases = result["result"]["phases"]
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for ph in phases:
        _cdf(ax, ph["samples_ms"]["client_watch"], f"{ph['rate']:g}/s")
    _gate_lines(ax)
    ax.set_xscale("log")
    ax.set_xlabel("client create -> Ready (ms, log)")
    ax.set_ylabel("fraction of claims")
    ax.set_title("sustained: latency CDF per arrival rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    paths.append(out / "sustained-latency-cdf.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    offset = 0.0
    for ph in phases:
        ready = ph["series"]["ready_per_s"]
        ax1.step(
            [offset + t for t, _ in ready], [v for _, v in ready], where="post", label=f"{ph['rate']:g}/s"
        )
        win = [w for w in ph["windows_10s"] if w.get("p99") is not None]
        ax2.plot([offset + w["t"] + 5 for w in win], [w["p99"] for w in win], marker="o", markersize=3)
        offset += (ready[-1][0] if ready else ph["seconds"]) + 5
    ax1.set_ylabel("claims Ready /s")
    ax1.set_title("sustained: throughput and 10 s-window P99 (phases back to back)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7, ncol=4)
    ax2.axhline(500, color="red", linestyle=":", linewidth=1)
    ax2.set_ylabel("client P99 per 10 s (ms)")
    ax2.set_xlabel("seconds of load (phases concatenated)")
    ax2.set_yscale("log")
    ax2.grid(alpha=0.3, which="both")
    paths.append(out / "sustained-throughput.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def refill(result: Mapping[str, Any], out: Path) -> list[Path]:
    plt = _plt()
    res = result["result"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key, label in (("created_per_s", "Sandboxes created /s"), ("ready_per_s", "Sandboxes Ready /s")):
        series = res["series"][key]
        ax.step([t for t, _ in series], [v for _, v in series], where="post", label=label)
    ax.set_xlabel("seconds since the pool was scaled")
    ax.set_ylabel("per second")
    ax.set_title(f"refill: pool 0 -> {res['replicas']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path = out / "refill-throughput.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def render_all(results: Mapping[str, Mapping[str, Any]], out: Path, relative_to: Path) -> dict[str, str]:
    """Draw every plot the results allow into `out`; {name: path relative to `relative_to`}."""
    if not available():
        return {}
    out.mkdir(parents=True, exist_ok=True)
    drawers = {"burst": burst, "sustained": sustained, "refill": refill}
    paths: dict[str, str] = {}
    for name, fn in drawers.items():
        if name in results:
            for path in fn(results[name], out):
                paths[path.stem] = str(path.relative_to(relative_to))
    return paths
