"""Churn: claims created, bound, deleted one after another, with the controller's heap looked at between.

Owns: one leak experiment on a cluster it is handed. A template and a warm pool of `replicas`, then
`cycles` claim cycles (create -> Ready -> delete, every claim a new name; at most `workers` in flight,
started at most `rate` per second; with `expire_s` the claims carry a shutdownTime that far ahead with
`shutdownPolicy: Delete` and the controller deletes them, as in the soak), so the controller binds, refills and forgets thousands of claims,
Sandboxes and Pods while the number of live objects stays level. The controller runs with tracemalloc on
and the heap probe `churn_hook/sitecustomize.py` loaded; at each checkpoint (after each cycle count in `marks`,
after the last cycle, and after the cluster has drained and every TTL-held entry has expired) the probe reports
RSS, tracemalloc's traced total, every allocation site and the size of every map held by our objects.

Read the result as: traced bytes and map sizes that grow between the first checkpoint and the drained
one, per cycle, are a leak (the sites say where); RSS growing while they stay flat is the allocator
(freed memory not returned to the OS), not a leak.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from agent_sandbox.devcluster.processes import Started, rss_bytes
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, ApiClient, KubeError, NotFound

from .. import promtext
from .burst import claim_body, create_template_and_pool, is_ready, retrying, settle
from .soak import scrape_controller

__all__ = ["HOOK_DIR", "Churn", "churn", "probe_env"]

HOOK_DIR = Path(__file__).with_name("churn_hook")
SETTLE_S = 45.0  # > the 30 s TTL of the read-your-writes overlays: what they still hold after is kept


@contextlib.contextmanager
def probe_env(dump_dir: Path, frames: int = 1, extra: dict[str, str] | None = None) -> Iterator[None]:
    """Processes started inside load the heap probe, trace allocations `frames` deep (0: no tracing, the
    production setting: RSS and allocator figures only) and get `extra` variables (e.g. MALLOC_ARENA_MAX)."""
    extra = extra or {}
    keys = ("PYTHONTRACEMALLOC", "PYTHONPATH", "CHURN_HOOK_DIR", *extra)
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(extra)
    if frames > 0:
        os.environ["PYTHONTRACEMALLOC"] = str(frames)
    else:
        os.environ.pop("PYTHONTRACEMALLOC", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HOOK_DIR), saved["PYTHONPATH"]) if p)
    os.environ["CHURN_HOOK_DIR"] = str(dump_dir)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@dataclass
class Churn:
    """What a churn run measured (see the module docstring)."""

    params: dict[str, Any]
    cycles_done: int = 0
    cycles_failed: int = 0
    seconds: float = 0.0
    samples: list[dict[str, float]] = field(default_factory=list)  # every 10 s: at_s, rss_mib, depth
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # the probe's reports, in order

    def as_dict(self) -> dict[str, Any]:
        marks = [_summary(c) for c in self.checkpoints]
        out: dict[str, Any] = {
            "params": self.params,
            "cycles_done": self.cycles_done,
            "cycles_failed": self.cycles_failed,
            "seconds": round(self.seconds, 1),
            "checkpoints": marks,
            "samples": self.samples,
        }
        if len(self.checkpoints) >= 2:
            out["growth"] = growth(self.checkpoints[0], self.checkpoints[-1])
        return out


def _summary(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "label": report["label"],
        "cycles": report.get("cycles"),
        "rss_mib": round(report["rss_kib"] / 1024, 1),
        "traced_mib": round(report.get("traced_current", 0) / 2**20, 2),
        "tracemalloc_overhead_mib": round(report.get("tracemalloc_overhead", 0) / 2**20, 1),
        "malloc_mib": {k: round(v / 2**20, 1) for k, v in report.get("malloc", {}).items()},
        # pymalloc arenas are 1 MiB each (CPython >= 3.10); blocks = what live small objects use of them.
        "pymalloc_mib": {
            "arenas": report.get("pymalloc", {}).get("arenas_current", 0),
            "in_blocks": round(report.get("pymalloc", {}).get("allocated_blocks", 0) / 2**20, 1),
        },
        "gc_objects": report["gc_objects"],
        "types": report["types"][:15],
    }


def growth(first: dict[str, Any], last: dict[str, Any], top: int = 25) -> dict[str, Any]:
    """From checkpoint `first` to `last`: per-cycle traced growth, growing sites and growing maps."""
    cycles = max((last.get("cycles") or 0) - (first.get("cycles") or 0), 1)
    before = {site: (size, count) for site, size, count in first["sites"]}
    after = {site: (size, count) for site, size, count in last["sites"]}
    deltas = []
    for site in before.keys() | after.keys():
        b, a = before.get(site, (0, 0)), after.get(site, (0, 0))
        if a[0] != b[0]:
            deltas.append({"site": site, "bytes": a[0] - b[0], "blocks": a[1] - b[1], "bytes_after": a[0]})
    deltas.sort(key=lambda d: -d["bytes"])
    maps = []
    for key in first["containers"].keys() | last["containers"].keys():
        b = first["containers"].get(key, {"items": 0})["items"]
        a = last["containers"].get(key, {"items": 0})["items"]
        if a != b:
            sample = last["containers"].get(key, {}).get("sample", [])
            maps.append({"map": key, "before": b, "after": a, "sample": sample})
    maps.sort(key=lambda m: -(m["after"] - m["before"]))
    traced = last.get("traced_current", 0) - first.get("traced_current", 0)
    heap_a, heap_b = first.get("malloc", {}), last.get("malloc", {})
    py_a, py_b = first.get("pymalloc", {}), last.get("pymalloc", {})
    return {
        "from": first["label"],
        "to": last["label"],
        "cycles": cycles,
        "rss_mib": round((last["rss_kib"] - first["rss_kib"]) / 1024, 1),
        "traced_mib": round(traced / 2**20, 2),
        "traced_bytes_per_cycle": round(traced / cycles, 1),
        "malloc_in_use_mib": round((heap_b.get("in_use", 0) - heap_a.get("in_use", 0)) / 2**20, 1),
        "malloc_free_mib": round((heap_b.get("free", 0) - heap_a.get("free", 0)) / 2**20, 1),
        "pymalloc_arenas_mib": py_b.get("arenas_current", 0) - py_a.get("arenas_current", 0),
        "gc_objects": last["gc_objects"] - first["gc_objects"],
        "top_sites": deltas[:top],
        "top_shrinking_sites": sorted(deltas, key=lambda d: d["bytes"])[:5],
        "maps": maps[:top],
    }


async def _probe(dump_dir: Path, label: str, cycles: int, within: float = 180.0) -> dict[str, Any]:
    (dump_dir / f"request-{label}").touch()
    path = dump_dir / f"{label}.json"
    deadline = time.monotonic() + within
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"heap probe gave no {label} report in {within:.0f}s (is it loaded?)")
        await asyncio.sleep(0.5)
    report: dict[str, Any] = orjson.loads(path.read_bytes())
    if "error" in report:
        raise RuntimeError(f"heap probe failed at {label}: {report['error']}")
    report["cycles"] = cycles
    return report


def _depth(metrics_port: int) -> float:
    return promtext.scalar(scrape_controller(metrics_port), "workqueue_depth") or 0.0


async def _ready_watcher(api: ApiClient, namespace: str, waiting: dict[str, asyncio.Future[None]]) -> None:
    """Resolve the future of every claim seen Ready (one list per 0.3 s serves all workers)."""
    while True:
        if waiting:
            with contextlib.suppress(KubeError):
                for claim in await api.list(SANDBOX_CLAIM, namespace=namespace):
                    fut = waiting.get(claim["metadata"]["name"])
                    if fut is not None and not fut.done() and is_ready(claim):
                        fut.set_result(None)
        await asyncio.sleep(0.3)


async def _drained(api: ApiClient, namespace: str, replicas: int, metrics_port: int, within: float) -> bool:
    """No claim left, only the pool's members, queues empty (twice in a row)."""
    deadline = time.monotonic() + within
    calm = 0
    while time.monotonic() < deadline:
        claims = await retrying(lambda: api.list(SANDBOX_CLAIM, namespace=namespace), what="list claims")
        sandboxes = await retrying(lambda: api.list(SANDBOX, namespace=namespace), what="list sandboxes")
        depth = await asyncio.to_thread(_depth, metrics_port)
        calm = calm + 1 if not claims and len(sandboxes) == replicas and depth == 0 else 0
        if calm >= 2:
            return True
        await asyncio.sleep(2)
    return False


async def churn(
    api: ApiClient,
    controller: Started,
    metrics_port: int,
    dump_dir: Path,
    *,
    namespace: str,
    cycles: int,
    marks: tuple[int, ...],
    rate: float,
    workers: int,
    replicas: int,
    expire_s: float = 0.0,
) -> Churn:
    """Run one churn experiment (module docstring) in an empty namespace."""
    out = Churn(params={"cycles": cycles, "checkpoints": list(marks), "rate_per_s": rate,
                        "workers": workers, "replicas": replicas, "settle_s": SETTLE_S,
                        "expire_s": expire_s})  # fmt: skip
    await create_template_and_pool(api, namespace, replicas)
    await settle(api, namespace, claims=0, replicas=replicas, within=300)
    waiting: dict[str, asyncio.Future[None]] = {}
    watcher = asyncio.create_task(_ready_watcher(api, namespace, waiting))
    start = time.monotonic()

    async def sampler() -> None:
        while True:
            depth = await asyncio.to_thread(_depth, metrics_port)
            out.samples.append({"at_s": round(time.monotonic() - start, 1),
                                "rss_mib": round(rss_bytes(controller.pid) / 2**20, 1), "depth": depth})  # fmt: skip
            await asyncio.sleep(10)

    sampling = asyncio.create_task(sampler())
    gate = asyncio.Semaphore(workers)

    async def cycle(i: int) -> None:
        name = f"churn-{i:06d}"
        fut = waiting[name] = asyncio.get_running_loop().create_future()
        body = claim_body(name)
        if expire_s > 0:  # the soak's way: the controller deletes the claim at its shutdownTime
            at = (datetime.now(UTC) + timedelta(seconds=expire_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
            body["spec"]["lifecycle"] = {"shutdownTime": at, "shutdownPolicy": "Delete"}
        try:
            await retrying(lambda: api.create(SANDBOX_CLAIM, body, namespace=namespace))
            await asyncio.wait_for(fut, timeout=120)
        except (TimeoutError, KubeError):
            out.cycles_failed += 1
        finally:
            waiting.pop(name, None)
            if expire_s <= 0:
                with contextlib.suppress(NotFound):
                    await retrying(lambda: api.delete(SANDBOX_CLAIM, name, namespace=namespace))
        out.cycles_done += 1
        if out.cycles_done in marks:
            out.checkpoints.append(await _probe(dump_dir, f"after-{out.cycles_done}", out.cycles_done))

    async def gated(i: int) -> None:
        try:
            await cycle(i)
        finally:
            gate.release()

    tasks: set[asyncio.Task[None]] = set()
    try:
        for i in range(cycles):
            due = start + i / rate
            if (now := time.monotonic()) < due:
                await asyncio.sleep(due - now)
            await gate.acquire()
            task = asyncio.create_task(gated(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        out.seconds = time.monotonic() - start
        out.checkpoints.append(await _probe(dump_dir, "after-last", out.cycles_done))
        await _drained(api, namespace, replicas, metrics_port, within=300)
        await asyncio.sleep(SETTLE_S)
        out.checkpoints.append(await _probe(dump_dir, "drained", out.cycles_done))
    finally:
        watcher.cancel()
        sampling.cancel()
    return out


def markdown(data: dict[str, Any]) -> str:
    """The checkpoints, the growth from the first to the last one, and the top growing sites and maps."""
    lines = ["| checkpoint | cycles | RSS MiB | traced MiB | gc objects |", "|---|---|---|---|---|"]
    for c in data["checkpoints"]:
        lines.append(
            f"| {c['label']} | {c['cycles']} | {c['rss_mib']} | {c['traced_mib']} | {c['gc_objects']} |"
        )
    g = data.get("growth")
    if g:
        lines += [
            "",
            f"From {g['from']} to {g['to']} ({g['cycles']} cycles): RSS {g['rss_mib']:+} MiB, traced "
            f"{g['traced_mib']:+} MiB ({g['traced_bytes_per_cycle']:+} B/cycle), glibc heap in use "
            f"{g['malloc_in_use_mib']:+} MiB and free {g['malloc_free_mib']:+} MiB, pymalloc arenas "
            f"{g['pymalloc_arenas_mib']:+} MiB, gc objects {g['gc_objects']:+}.",
            "",
            "| growing site | bytes | blocks |",
            "|---|---|---|",
        ]
        lines += [f"| `{s['site'].rsplit('site-packages/', 1)[-1]}` | {s['bytes']:+} | {s['blocks']:+} |"
                  for s in g["top_sites"][:15]]  # fmt: skip
        lines += ["", "| map (class.attribute) | items before | items after |", "|---|---|---|"]
        lines += [f"| `{m['map']}` | {m['before']} | {m['after']} |" for m in g["maps"][:15]]
        lines += ["", "Some keys left in the growing maps at the end:", ""]
        lines += [f"- `{m['map']}`: {', '.join(m['sample'][:3])}" for m in g["maps"][:5] if m.get("sample")]
    return "\n".join(lines)
