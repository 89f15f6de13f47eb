"""Soak: many standing Sandboxes plus a steady stream of claims, watching the controller for leaks.

Owns: one soak run on a cluster it is handed -- `sandboxes` bare Sandboxes created first (they stay), a
template and a warm pool, then claims at `per_minute` for `minutes`, each claim expiring 30 s after it was
made (`shutdownPolicy: Delete`), so the controller binds, refills, expires and deletes all the time while the
number of live objects stays level. Every 10 s: the controller's RSS and open fds, the sum of its work queues'
depth (`workqueue_depth`), the Sandboxes and Pods in its cache (RSS follows what is cached, so a rise is read
against it), and its claim startup histogram. At the end: RSS per minute (a leak shows as minute 10 above
minute 2), queue depth once the stream stops (must drain to 0), the claim P99 per minute from the controller's
own histogram (the figure the burst gate uses), claims made vs claims observed Ready, and the controller's
error log lines. With a client watch process (benchmarks/client_watch.py, as `__main__` runs it): each claim's
exact latency as a client sees it (send -> Ready seen), per minute and per 10 s window next to the CPU each
cluster process used in it, the requests kube-apiserver served in it by verb and resource (GETs aside) and the
objects it sent through the conversion webhook (`timeline`: a relist, a wave of restarted watches, extra writes
or a conversion backlog shows there), and per minute the claims' starts by launch type and pod condition.
`--apiserver-profile` adds kube-apiserver CPU profiles over chosen windows of the stream.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster.processes import Started, rss_bytes
from agent_sandbox.kube import (
    CACHED_OBJECTS_METRIC,
    POD,
    SANDBOX,
    SANDBOX_CLAIM,
    ApiClient,
    cached_resource_label,
)

from .. import promtext
from ..claim_analysis import CLAIM_HIST
from ..client_watch import ClientWatchProcess
from ..objects import is_ready, rfc3339nano
from ..proc_sampling import KernelShare, process_cpu_seconds, process_kernel_share
from ..stats import diff_buckets, histogram_summary, summarize
from .burst import EXT, create_template_and_pool, retrying, settle

__all__ = [
    "Sample",
    "Soak",
    "apiserver_counts",
    "apiserver_heap",
    "create_sandboxes",
    "error_lines",
    "scrape_controller",
    "soak",
    "watch_cache_capacity",
]

EXPIRY_S = 30.0
CLAIM_STARTS = "agent_sandbox_claim_creation"
ERROR_LEVELS = frozenset({"error", "dpanic", "panic", "fatal"})


@dataclass
class Sample:
    """One look at the controller, `at_s` seconds after the claim stream started."""

    at_s: float
    rss_mib: float
    fds: int
    queue_depth: float
    sandboxes_cached: float  # `agent_sandbox_cached_objects`: the Sandboxes in the controller's informer
    pods_cached: float  # and its Pods (Terminating and Pending ones included)
    cpu_s: float  # the controller's process_cpu_seconds_total
    claim_buckets: list[tuple[float, float]] = field(repr=False)
    # `agent_sandbox_claim_creation` by "launch_type pod_condition": a warm claim whose member was still
    # booting ("warm not_ready") waits for its boot, which is where a pool running short shows.
    starts: dict[str, float] = field(default_factory=dict)
    # CPU seconds used so far by each process of the cluster (etcd, kube-apiserver, ...): a 10 s window whose
    # client latency is high is read against who was busy in it.
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    # System CPU and page faults of each process so far: whether a busy window's CPU went to the kernel
    # serving fresh memory (a growing Go heap faults in every new page) rather than to the work itself.
    kernel_by_process: dict[str, KernelShare] = field(default_factory=dict)
    # kube-apiserver's requests so far by verb and resource, every client (`apiserver_counts`): a window where
    # the API server is busy is read against relists, restarted watches and writes (the audit log skips reads).
    apiserver_requests: dict[str, float] = field(default_factory=dict)
    # kube-apiserver's Go heap in use (MiB) and garbage collections so far (`apiserver_heap`): a heap that is
    # still growing costs fresh pages and more frequent collections.
    apiserver_heap: dict[str, float] = field(default_factory=dict)
    # Events each of kube-apiserver's watch caches holds room for, by resource (`watch_cache_capacity`): the
    # ring doubles while its oldest event is younger than 75 s, so a stream's event rate sets how much it keeps.
    watch_cache_capacity: dict[str, int] = field(default_factory=dict)


_CONVERSIONS = "apiserver_crd_conversion_webhook_duration_seconds_count"
REQUEST_VERBS = ("LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION")


def apiserver_heap(samples: list[promtext.Sample]) -> dict[str, float]:
    """kube-apiserver's Go heap in use (MiB) and its garbage collections so far, from its `/metrics`."""
    out: dict[str, float] = {}
    if (inuse := promtext.scalar(samples, "go_memstats_heap_inuse_bytes")) is not None:
        out["heap_inuse_mib"] = round(inuse / 2**20, 1)
    if (collections := promtext.scalar(samples, "go_gc_duration_seconds_count")) is not None:
        out["gc_cycles"] = collections
    # What the Go runtime has handed back to the OS: pages it must fault in again when the heap regrows.
    if (released := promtext.scalar(samples, "go_memstats_heap_released_bytes")) is not None:
        out["heap_released_mib"] = round(released / 2**20, 1)
    return out


def watch_cache_capacity(samples: list[promtext.Sample]) -> dict[str, int]:
    """kube-apiserver's watch cache capacity (events) per resource, those above the 100-event floor.

    The gauge is `watch_cache_capacity`, without the `apiserver_` prefix its sibling metrics carry
    (k8s.io/apiserver 0.35 `cacher/metrics`: this one alone is declared without the namespace).
    """
    out: dict[str, int] = {}
    for s in samples:
        if s.name == "watch_cache_capacity" and s.value > 100:
            resource = s.labels.get("resource", "")
            out[resource] = out.get(resource, 0) + int(s.value)
    return dict(sorted(out.items()))


def apiserver_counts(samples: list[promtext.Sample]) -> dict[str, float]:
    """Request counts by verb and resource ("LIST pods", "PATCH sandboxes/status") from kube-apiserver's
    `apiserver_request_total`, every verb but GET (clients poll with GETs), and the objects it sent through
    the conversion webhook ("conversions": with v1alpha1 served, one per stored change of a Sandbox or claim,
    for the v1alpha1 watch cache, so a backlog after a fill shows there)."""
    out = promtext.apiserver_requests(samples, REQUEST_VERBS)
    conversions = [s.value for s in samples if s.name == _CONVERSIONS]
    if conversions:
        out["conversions"] = sum(conversions)
    return out


@dataclass
class Soak:
    """What a soak run measured (see the module docstring)."""

    params: dict[str, Any]
    sandboxes_ready_s: float = 0.0
    claims_sent: int = 0
    claims_failed: int = 0
    samples: list[Sample] = field(default_factory=list)
    drained_s: float | None = None
    errors: list[str] = field(default_factory=list)
    # The client view (a separate process watching claims, benchmarks/client_watch.py): exact, where the
    # controller's histogram interpolates inside its 250-500-750 ms buckets. Wall-clock stream start, and
    # per claim (requested, Ready seen) in epoch seconds.
    started_wall: float | None = None
    client: dict[str, tuple[float, float | None]] | None = None

    def _client_latencies(self) -> list[tuple[float, float]]:
        """(send time, ms to Ready seen) of every claim the client saw Ready with a send stamp, by send time."""
        return sorted(
            (requested, (ready - requested) * 1000)
            for ready, requested in (self.client or {}).values()
            if requested is not None
        )

    def timeline(self) -> list[dict[str, Any]]:
        """Per interval between two looks (~10 s): cores per process and the client latency of claims sent in it."""
        out: list[dict[str, Any]] = []
        sent = self._client_latencies()
        for a, b in zip(self.samples, self.samples[1:], strict=False):
            span = b.at_s - a.at_s
            if span <= 0:
                continue
            cores = {
                name: round((b.cpu_by_process[name] - before) / span, 2)
                for name, before in a.cpu_by_process.items()
                if name in b.cpu_by_process
            }
            row: dict[str, Any] = {"at_s": a.at_s, "cores": cores}
            requests = {
                key: int(n - a.apiserver_requests.get(key, 0.0))
                for key, n in sorted(b.apiserver_requests.items())
                if n > a.apiserver_requests.get(key, 0.0)
            }
            if requests:
                row["apiserver_requests"] = requests
            if "heap_inuse_mib" in b.apiserver_heap:
                row["apiserver_heap_mib"] = b.apiserver_heap["heap_inuse_mib"]
            if "heap_released_mib" in b.apiserver_heap:
                row["apiserver_heap_released_mib"] = b.apiserver_heap["heap_released_mib"]
            kernel = _kernel_window(a.kernel_by_process, b.kernel_by_process, span)
            if kernel:
                row["kernel"] = kernel
            if "gc_cycles" in a.apiserver_heap and "gc_cycles" in b.apiserver_heap:
                row["apiserver_gc_cycles"] = int(
                    b.apiserver_heap["gc_cycles"] - a.apiserver_heap["gc_cycles"]
                )
            if b.watch_cache_capacity:
                row["watch_cache_capacity"] = b.watch_cache_capacity
            if self.started_wall is not None and sent:
                lo, hi = self.started_wall + a.at_s, self.started_wall + b.at_s
                window = [ms for t, ms in sent if lo <= t < hi]
                row["client_ms"] = summarize(window)
            out.append(row)
        return out

    def client_view(self) -> dict[str, Any] | None:
        """Client latencies (ms) over the run and per minute of the claims' send time."""
        if self.client is None or self.started_wall is None:
            return None
        sent = self._client_latencies()
        by_minute: dict[int, list[float]] = {}
        for requested, ms in sent:
            by_minute.setdefault(int((requested - self.started_wall) // 60) + 1, []).append(ms)
        return {
            "seen_ready": len(self.client),
            "latency_ms": summarize([ms for _, ms in sent]),
            "minutes": {m: summarize(v) for m, v in sorted(by_minute.items())},
        }

    def as_dict(self) -> dict[str, Any]:
        by_minute: dict[int, list[Sample]] = {}
        for s in self.samples:
            by_minute.setdefault(int(s.at_s // 60) + 1, []).append(s)
        minutes = []
        prev: list[tuple[float, float]] = self.samples[0].claim_buckets if self.samples else []
        prev_sample = self.samples[0] if self.samples else None
        for minute, samples in sorted(by_minute.items()):
            base = prev_sample.starts if prev_sample else {}
            last = samples[-1]
            window = diff_buckets(last.claim_buckets, prev)
            prev = last.claim_buckets
            elapsed = last.at_s - prev_sample.at_s if prev_sample else 0.0
            cores = (last.cpu_s - prev_sample.cpu_s) / elapsed if prev_sample and elapsed > 0 else None
            prev_sample = last
            minutes.append({
                "minute": minute,
                "rss_mib_max": max(s.rss_mib for s in samples),
                "fds_max": max(s.fds for s in samples),
                "queue_depth_max": max(s.queue_depth for s in samples),
                "sandboxes_cached_max": max(s.sandboxes_cached for s in samples),
                "pods_cached_max": max(s.pods_cached for s in samples),
                "controller_cores": None if cores is None else round(cores, 3),
                "claims": histogram_summary(window),
                "starts": {k: round(v - base.get(k, 0.0)) for k, v in sorted(last.starts.items())},
            })  # fmt: skip
        total = (
            diff_buckets(self.samples[-1].claim_buckets, self.samples[0].claim_buckets)
            if self.samples
            else []
        )
        return {
            "params": self.params,
            "sandboxes_ready_s": round(self.sandboxes_ready_s, 1),
            "claims_sent": self.claims_sent,
            "claims_failed": self.claims_failed,
            "claims_observed_ready": histogram_summary(total)["count"],
            "claim_latency_ms": histogram_summary(total),
            "drained_s": self.drained_s,
            "error_lines": len(self.errors),
            "first_errors": self.errors[:5],
            "minutes": minutes,
            "client_process": self.client_view(),
            "timeline": self.timeline(),
        }


def _kernel_window(
    before: dict[str, KernelShare], after: dict[str, KernelShare], span: float
) -> dict[str, dict[str, float]]:
    """Per process with kernel work in the window: system cores and thousands of minor faults per second."""
    out: dict[str, dict[str, float]] = {}
    for name, a in before.items():
        if (b := after.get(name)) is None:
            continue
        system = (b.system_s - a.system_s) / span
        faults = (b.minor_faults - a.minor_faults) / span / 1000
        if system > 0 or faults > 0:
            out[name] = {"system_cores": round(system, 3), "minor_faults_k_per_s": round(faults, 1)}
    return out


def error_lines(log: Path, offset: int = 0) -> list[str]:
    """Lines of a controller log (JSON or console) at level error or worse, from byte `offset`."""
    out: list[str] = []
    with log.open("rb") as fh:
        fh.seek(offset)
        for raw in fh:
            line = raw.decode(errors="replace").rstrip()
            try:
                entry = orjson.loads(line)
                level = str(entry.get("level", "")).lower() if isinstance(entry, dict) else ""
            except orjson.JSONDecodeError:
                parts = line.split()
                level = parts[1].lower() if len(parts) > 1 else ""
            if level in ERROR_LEVELS:
                out.append(line[:400])
    return out


def scrape_controller(metrics_port: int) -> list[promtext.Sample]:
    """The controller's /metrics on `metrics_port`, parsed (blocking: call it in a thread from async code)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
        return promtext.parse(resp.read().decode())


def _look(controller: Started, metrics_port: int, at_s: float, pids: dict[str, int] | None = None) -> Sample:
    samples = scrape_controller(metrics_port)
    cpu = {name: s for name, pid in (pids or {}).items() if (s := process_cpu_seconds(pid)) is not None}
    kernel = {name: k for name, pid in (pids or {}).items() if (k := process_kernel_share(pid)) is not None}
    return Sample(
        at_s=round(at_s, 1),
        rss_mib=round(rss_bytes(controller.pid) / 2**20, 1),
        fds=len(os.listdir(f"/proc/{controller.pid}/fd")),
        queue_depth=promtext.scalar(samples, "workqueue_depth") or 0.0,
        sandboxes_cached=promtext.scalar(
            samples, CACHED_OBJECTS_METRIC, resource=cached_resource_label(SANDBOX)
        )
        or 0.0,
        pods_cached=promtext.scalar(samples, CACHED_OBJECTS_METRIC, resource=cached_resource_label(POD))
        or 0.0,
        cpu_s=promtext.scalar(samples, "process_cpu_seconds_total") or 0.0,
        claim_buckets=promtext.histogram(samples, CLAIM_HIST),
        starts=promtext.counter_by_labels(samples, CLAIM_STARTS, ("launch_type", "pod_condition")),
        cpu_by_process=cpu,
        kernel_by_process=kernel,
    )


async def create_sandboxes(api: ApiClient, namespace: str, count: int, concurrency: int = 40) -> None:
    """`count` bare Sandboxes `s-00000`... (busybox, no template), `concurrency` creates in flight, retried."""
    gate = asyncio.Semaphore(concurrency)
    body = {"containers": [{"name": "main", "image": "busybox"}]}

    async def one(i: int) -> None:
        obj = {"apiVersion": SANDBOX.api_version, "kind": "Sandbox", "metadata": {"name": f"s-{i:05d}"},
               "spec": {"podTemplate": {"spec": body}}}  # fmt: skip
        async with gate:
            await retrying(lambda: api.create(SANDBOX, obj, namespace=namespace), what=f"sandbox {i}")

    await asyncio.gather(*(one(i) for i in range(count)))


async def _all_ready(api: ApiClient, namespace: str, count: int, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        items = await retrying(lambda: api.list(SANDBOX, namespace=namespace), what="list sandboxes")
        if sum(map(is_ready, items)) >= count:
            return
        await asyncio.sleep(5)
    raise TimeoutError(f"{count} Sandboxes not Ready within {within:.0f}s")


async def soak(
    api: ApiClient,
    controller: Started,
    metrics_port: int,
    *,
    sandboxes: int,
    per_minute: float,
    minutes: float,
    replicas: int,
    namespaces: tuple[str, str],
    client_watch: ClientWatchProcess | None = None,
    pids: dict[str, int] | None = None,
    profile_at: tuple[float, ...] = (),
    profiler: Callable[[float], Awaitable[None]] | None = None,
    pause_s: float = 0.0,
) -> Soak:
    """Run one soak (see the module docstring) in two empty namespaces: (standing, claims).

    `client_watch`: a started watcher process; the soak waits for its watch before the stream, stamps each
    claim with its send time, and stops it once the queues drained. `profiler(at_s)` is started at each of
    `profile_at` (seconds into the stream), e.g. to take kube-apiserver's CPU profile over a window.
    `pause_s`: seconds between the pool settling and the stream (0: the stream follows the fill at once).
    """
    standing, claims_ns = namespaces
    out = Soak(params={"sandboxes": sandboxes, "per_minute": per_minute, "minutes": minutes,
                       "replicas": replicas, "expiry_s": EXPIRY_S, "pause_s": pause_s})  # fmt: skip
    t0 = time.monotonic()
    await create_sandboxes(api, standing, sandboxes)
    await _all_ready(api, standing, sandboxes, within=1800)
    out.sandboxes_ready_s = time.monotonic() - t0
    await create_template_and_pool(api, claims_ns, replicas)
    await settle(api, claims_ns, claims=0, replicas=replicas, within=600)
    await asyncio.sleep(pause_s)
    log_offset = controller.log.stat().st_size
    if client_watch is not None and not await client_watch.wait_watching():
        raise RuntimeError("the client watch process did not start its watch")

    out.started_wall = time.time()
    start = time.monotonic()
    stop_at = start + minutes * 60
    interval = 60.0 / per_minute
    inflight: set[asyncio.Task[None]] = set()

    async def claim(i: int) -> None:
        expire = (datetime.now(UTC) + timedelta(seconds=EXPIRY_S)).strftime("%Y-%m-%dT%H:%M:%SZ")
        sent = rfc3339nano(time.time())
        body = {"apiVersion": EXT, "kind": "SandboxClaim",
                "metadata": {"name": f"c-{i:06d}", "annotations": {c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT: sent}},
                "spec": {"warmPoolRef": {"name": "pool"},
                         "lifecycle": {"shutdownTime": expire, "shutdownPolicy": "Delete"}}}  # fmt: skip
        try:
            await api.create(SANDBOX_CLAIM, body, namespace=claims_ns)
        except Exception:  # counted; a soak keeps going
            out.claims_failed += 1

    async def look() -> Sample:
        metrics = promtext.parse((await api.request("GET", "/metrics")).decode())
        counts, heap = apiserver_counts(metrics), apiserver_heap(metrics)
        sample = await asyncio.to_thread(_look, controller, metrics_port, time.monotonic() - start, pids)
        sample.apiserver_requests = counts
        sample.apiserver_heap = heap
        sample.watch_cache_capacity = watch_cache_capacity(metrics)
        return sample

    async def sampler() -> None:
        while True:
            out.samples.append(await look())
            await asyncio.sleep(10)

    async def profile(at_s: float) -> None:
        assert profiler is not None
        await asyncio.sleep(max(0.0, start + at_s - time.monotonic()))
        await profiler(at_s)

    sampling = asyncio.create_task(sampler())
    profiling = [asyncio.create_task(profile(at)) for at in profile_at if profiler is not None]
    i = 0
    while (now := time.monotonic()) < stop_at:
        due = start + i * interval
        if due > now:
            await asyncio.sleep(due - now)
        task = asyncio.create_task(claim(i))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        out.claims_sent += 1
        i += 1
    await asyncio.gather(*inflight, *profiling)
    # The stream stopped: the work queues must drain (claims still expire for EXPIRY_S, then nothing).
    stopped = time.monotonic()
    while time.monotonic() - stopped < EXPIRY_S + 120:
        await asyncio.sleep(5)
        if out.samples[-1].at_s > stopped - start + EXPIRY_S and out.samples[-1].queue_depth == 0:
            out.drained_s = round(time.monotonic() - stopped, 1)
            break
    sampling.cancel()
    if client_watch is not None:
        out.client = await client_watch.stop()
    out.samples.append(await look())
    out.errors = error_lines(controller.log, log_offset)
    return out
