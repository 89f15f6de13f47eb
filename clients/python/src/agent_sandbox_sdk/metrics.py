"""Client-side latency histograms in the Prometheus text format (spec §3.12): `get_metrics()`, `print_metrics()`.

Upstream keeps these in `prometheus_client`'s default registry; the SDK keeps its own few histograms
(no dependency) with upstream's names, label and buckets, and renders the same exposition text:
`sandbox_client_discovery_latency_ms{mode,status}` (recorded by `_connection.py` where upstream's
connectors record it: `mode="gateway"` while waiting for the Gateway address, `"port_forward"` and
`"sandboxd_pod_tunnel"` while starting a kubectl tunnel; nothing for the direct and in-cluster modes,
which discover nothing), `sandbox_client_suspend_latency_ms{status}`, `sandbox_client_resume_latency_ms{status}`,
and, ours, `sandbox_client_create_latency_ms{status}` (create_sandbox: POST to Ready). `status` is
`"success"` or `"failure"` (an exception); an interrupted operation (cancelled, Ctrl-C) records nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter

__all__ = ["get_metrics", "observe", "print_metrics", "timed"]

#: Upstream 1.0.8's `_LATENCY_BUCKETS_MS` exactly (k8s_agent_sandbox/metrics.py): dashboards and alerts
#: written for upstream's `le` boundaries read ours unchanged.
BUCKETS_MS = (100, 250, 500, 750, 1000, 1250, 1500, 2000, 2500, 5000, 10000, 30000, 60000, 120000, 240000)
#: Upstream's HELP texts for its histograms (the exposition text is the same).
_HELP = {
    "sandbox_client_discovery_latency_ms": "Latency of establishing connection to the sandbox in milliseconds",
    "sandbox_client_suspend_latency_ms": "Latency of suspending the sandbox in milliseconds",
    "sandbox_client_resume_latency_ms": "Latency of resuming the sandbox in milliseconds",
    "sandbox_client_create_latency_ms": "Time from creating a claim to the sandbox being Ready.",
}
_lock = threading.Lock()
#: (name, sorted label pairs) -> [bucket counts..., +Inf count, sum]
_series: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = {}


def observe(name: str, value_ms: float, **labels: str) -> None:
    """Add one observation (milliseconds) to the histogram `name` with these labels."""
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
    """Observe the block's duration: `status="success"` when it ends normally, `"failure"` when it raises.

    An interruption records nothing: a task cancelled (`asyncio.timeout`, a TaskGroup), Ctrl-C, or a flow
    closed at a step (GeneratorExit) neither succeeded nor failed, and counting it as a failure would read
    every caller-side timeout as a broken Gateway or tunnel. The exception leaves the block unchanged.
    """
    start = perf_counter()
    try:
        yield
    except Exception:
        observe(name, (perf_counter() - start) * 1000, **labels, status="failure")
        raise
    # BaseException that is not an Exception (CancelledError, KeyboardInterrupt, GeneratorExit,
    # SystemExit) passes through without an observation.
    observe(name, (perf_counter() - start) * 1000, **labels, status="success")


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
