"""Client-side latency histograms in the Prometheus text format (spec §3.12): `get_metrics()`, `print_metrics()`.

Upstream keeps these in `prometheus_client`'s default registry; the SDK keeps its own few histograms
(no dependency) with upstream's names, label and buckets, and renders the same exposition text:
`sandbox_client_discovery_latency_ms{mode,status}` (gateway and tunnel discovery),
`sandbox_client_suspend_latency_ms{status}`, `sandbox_client_resume_latency_ms{status}`, and, ours,
`sandbox_client_create_latency_ms{status}` (create_sandbox: POST to Ready).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter

__all__ = ["get_metrics", "observe", "print_metrics", "timed"]

BUCKETS_MS = (100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000, 240000)
_HELP = {
    "sandbox_client_discovery_latency_ms": "Time to discover the sandbox endpoint (gateway address, tunnel).",
    "sandbox_client_suspend_latency_ms": "Time to suspend a sandbox.",
    "sandbox_client_resume_latency_ms": "Time to resume a sandbox.",
    "sandbox_client_create_latency_ms": "Time from creating a claim to the sandbox being Ready.",
}
_lock = threading.Lock()
#: (name, sorted label pairs) -> [bucket counts..., +Inf count, sum]
_series: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}


def observe(name: str, value_ms: float, **labels: str) -> None:
    key = (name, tuple(sorted(labels.items())))
    with _lock:
        series = _series.setdefault(key, [0.0] * (len(BUCKETS_MS) + 2))
        for i, bound in enumerate(BUCKETS_MS):
            if value_ms <= bound:
                series[i] += 1
        series[-2] += 1
        series[-1] += value_ms


@contextmanager
def timed(name: str, **labels: str) -> Iterator[None]:
    """Observe the block's duration with `status="success"` or `"failure"`."""
    start = perf_counter()
    status = "failure"
    try:
        yield
        status = "success"
    finally:
        observe(name, (perf_counter() - start) * 1000, **labels, status=status)


def _labels(pairs: tuple[tuple[str, str], ...], extra: str = "") -> str:
    parts = [f'{k}="{v}"' for k, v in pairs] + ([extra] if extra else [])
    return "{" + ",".join(parts) + "}" if parts else ""


def get_metrics() -> str:
    """Every histogram in the Prometheus text exposition format."""
    lines: list[str] = []
    with _lock:
        snapshot = {k: list(v) for k, v in _series.items()}
    for name in sorted({n for n, _ in snapshot}):
        lines += [f"# HELP {name} {_HELP.get(name, name)}", f"# TYPE {name} histogram"]
        for (series_name, pairs), values in sorted(snapshot.items()):
            if series_name != name:
                continue
            for bound, count in zip(BUCKETS_MS, values, strict=False):
                le = f'le="{float(bound)}"'
                lines.append(f"{name}_bucket{_labels(pairs, le)} {count}")
            inf = 'le="+Inf"'
            lines.append(f"{name}_bucket{_labels(pairs, inf)} {values[-2]}")
            lines.append(f"{name}_count{_labels(pairs)} {values[-2]}")
            lines.append(f"{name}_sum{_labels(pairs)} {values[-1]}")
    return "\n".join(lines) + ("\n" if lines else "")


def print_metrics() -> None:
    """Print `get_metrics()`."""
    print(get_metrics(), end="")
