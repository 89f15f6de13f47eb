"""Where do Pods wait? Watch every Pod and report, each 10 s, how many sit in each stage and how long they took.

Run beside a benchmark (the soak, say) against its cluster: `python -m benchmarks.pod_stage_probe KUBECONFIG OUT`.
One JSON line per window: Pods created / bound / Ready / Terminating / deleted in the window, Pods per namespace by
state (unbound, bound, ready, terminating), and P50 / P90 of create -> bound (the scheduler), bound -> Ready (the
kubelet: kwok here) and Terminating -> gone. Times are when this watch saw each change, so they include the watch's
own delay; one extra watch on Pods is the probe's whole cost to the cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from agent_sandbox.kube import POD, ApiClient, Gone, KubeError, WatchEvent

from .stats import percentile

__all__ = ["PodStages", "main"]

WINDOW_S = 10.0
_COUNTS = ("created", "bound", "ready", "terminating", "deleted")
_WAITS = ("create_to_bound_s", "bound_to_ready_s", "terminating_to_gone_s")


@dataclass
class _Pod:
    namespace: str
    seen: float
    bound: float | None = None
    ready: float | None = None
    terminating: float | None = None

    @property
    def state(self) -> str:
        if self.terminating is not None:
            return "terminating"
        if self.bound is None:
            return "unbound"
        return "ready" if self.ready is not None else "bound"


def _quantile(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 2) if values else None


@dataclass
class PodStages:
    """Pod stage bookkeeping fed by watch events; `window()` reports and resets the per-window figures."""

    pods: dict[str, _Pod] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))
    waits: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in _WAITS})

    def observe(self, event: WatchEvent, now: float) -> None:
        meta = event.object.get("metadata") or {}
        uid = meta.get("uid", "")
        pod = self.pods.get(uid)
        if event.type == "DELETED":
            if pod is not None:
                if pod.terminating is not None:
                    self.waits["terminating_to_gone_s"].append(now - pod.terminating)
                del self.pods[uid]
                self.counts["deleted"] += 1
            return
        if pod is None:
            pod = self.pods[uid] = _Pod(meta.get("namespace", ""), now)
            self.counts["created"] += 1
        if pod.bound is None and (event.object.get("spec") or {}).get("nodeName"):
            pod.bound = now
            self.counts["bound"] += 1
            self.waits["create_to_bound_s"].append(now - pod.seen)
        conditions = (event.object.get("status") or {}).get("conditions") or ()
        if pod.ready is None and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
        ):
            pod.ready = now
            self.counts["ready"] += 1
            if pod.bound is not None:
                self.waits["bound_to_ready_s"].append(now - pod.bound)
        if pod.terminating is None and meta.get("deletionTimestamp"):
            pod.terminating = now
            self.counts["terminating"] += 1

    def window(self) -> dict[str, Any]:
        by_namespace: dict[str, dict[str, int]] = {}
        for pod in self.pods.values():
            states = by_namespace.setdefault(pod.namespace, {})
            states[pod.state] = states.get(pod.state, 0) + 1
        out = {
            "t": round(time.time()),
            "counts": dict(self.counts),
            "by_namespace": by_namespace,
            **{k: (_quantile(v, 50), _quantile(v, 90)) for k, v in self.waits.items()},
        }
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.waits = {k: [] for k in _WAITS}
        return out


async def probe(api: ApiClient, out: IO[str]) -> None:
    """Watch Pods in every namespace until cancelled, writing one line per window to `out`."""
    stages = PodStages()

    async def report() -> None:
        while True:
            await asyncio.sleep(WINDOW_S)
            out.write(orjson.dumps(stages.window()).decode() + "\n")
            out.flush()

    reporter = asyncio.create_task(report())
    rv = "0"
    try:
        while True:
            try:
                async for event in api.watch(POD, resource_version=rv, timeout_seconds=300):
                    rv = (event.object.get("metadata") or {}).get("resourceVersion", rv)
                    if event.type != "BOOKMARK":
                        stages.observe(event, time.monotonic())
            except Gone:
                rv, stages.pods = "0", {}
            except KubeError as exc:
                print(f"watch ended: {exc}; rewatching", file=sys.stderr)
                await asyncio.sleep(1)
    finally:
        reporter.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.pod_stage_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("kubeconfig")
    parser.add_argument("out", help="JSON lines file (appended)")
    args = parser.parse_args(argv)

    async def run(out: IO[str]) -> None:
        api = await ApiClient.from_kubeconfig(args.kubeconfig, qps=-1.0, burst=100)
        try:
            await probe(api, out)
        finally:
            await api.close()

    with open(args.out, "a") as out, contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
