"""The benchmark harness: a gate-tuned local cluster with the real controller, a load generator, trackers.

Owns:

* `Tuning`: the control plane and controller settings of the upstream KWOK scalability gate
  (operations spec §9.8: 100 kwok nodes, kube-apiserver in-flight 2000 / mutating 1000, etcd without
  fsync, controller QPS 1000 / burst 2000, sandbox and claim workers 50, warm-pool batch 300).
* `Bench`: one cluster per run (`async with Bench.up(...)`), always torn down in `finally`; an admin
  `ApiClient` for the load; `/proc` sampling of every component (CPU cores, RSS); `/metrics` scrapes of the
  controller; optional py-spy profiling of the controller.
* `ClaimTracker`: one watch over SandboxClaims recording, per claim, when the create was sent, when it was
  acknowledged, when Ready=True was first seen on the watch stream, and the controller's
  `controller-first-observed-at` / `claim-first-ready-at` annotations; optionally deletes each claim a
  dwell time after Ready (the upstream sustained phase).
* `SandboxTracker`: Sandbox ADDED and first-Ready times (refill and cold throughput).

Everything listens on 127.0.0.1. Times are wall-clock seconds (`time.time()`), the same clock the controller
stamps its annotations with, so the three latency views can be compared claim by claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster import (
    ETCD_VERSION,
    KUBERNETES_VERSION,
    KWOK_VERSION,
    ClusterConfig,
    DevCluster,
)
from agent_sandbox.devcluster.binaries import cache_root
from agent_sandbox.devcluster.config import POD_DELETION_INSTANT
from agent_sandbox.devcluster.controller import repo_root, start_binary_controller, start_controller
from agent_sandbox.devcluster.processes import Started, is_ours
from agent_sandbox.kube import (
    CRD,
    NAMESPACE,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    AlreadyExists,
    ApiClient,
    Gone,
    KubeError,
    NotFound,
    Object,
    PatchType,
    ResourceKind,
    ServerError,
)

from . import promtext

__all__ = [
    "RESULTS",
    "Bench",
    "ClaimTracker",
    "ProcSampler",
    "SandboxTracker",
    "Tuning",
    "host_info",
    "is_ready",
    "parse_rfc3339",
    "process_cpu_seconds",
    "write_result",
]

RESULTS = Path(__file__).resolve().parent / "results"
T = TypeVar("T")
_TICKS = os.sysconf("SC_CLK_TCK")
CLAIM_HIST = "agent_sandbox_claim_controller_startup_latency_ms"
CLIENT_HIST = "agent_sandbox_client_claim_startup_latency_ms"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- tuning


@dataclass(frozen=True, slots=True)
class Tuning:
    """Cluster and controller settings; defaults reproduce the upstream KWOK gate (§9.8)."""

    nodes: int = 100
    max_requests_inflight: int = 2000
    max_mutating_requests_inflight: int = 1000
    etcd_unsafe_no_fsync: bool = True
    scheduler_qps: float = 500.0
    scheduler_burst: int = 1000
    controller_manager_qps: float = 500.0
    controller_manager_burst: int = 1000
    kube_api_qps: int = 1000
    kube_api_burst: int = 2000
    sandbox_workers: int = 50
    claim_workers: int = 50
    warm_pool_workers: int = 1
    warm_pool_batch: int = 300
    extra_flags: tuple[str, ...] = ()
    # False: mark v1alpha1 `served: false` on the four CRDs before measuring, as upstream's kOps benchmark
    # does. While both are served the API server sends object changes through the conversion webhook in
    # sustained runs (~3% of the CPU per claim there; none seen in a burst), see docs/performance.md.
    serve_v1alpha1: bool = True
    # Serve kube-apiserver's pprof so a phase can profile it (`apiserver_profile`).
    apiserver_profiling: bool = False
    # Pods start at once: the KWOK gate runs kwok's instant pod-ready stage, so the benchmarks measure the
    # controller, not a simulated container start (the dev cluster's default is ~1 s, docs/devcluster.md).
    pod_start_delay_ms: int = 0
    pod_start_jitter_ms: int = 0
    # Deleted pods are removed at once, as the KWOK gate's kwok (fast pod-delete stage) does: one DELETE. The dev
    # cluster's default, "graceful", adds a kubelet's NotReady, terminate-at and terminated writes per deleted
    # pod (~13 % of the API server's CPU per claim cycle, docs/performance.md). docs/devcluster.md.
    pod_deletion: str = POD_DELETION_INSTANT
    # Another controller binary in place of ours (upstream's Go controller, same flags) for a same-machine A/B;
    # it serves no conversion webhook, so v1alpha1 is unserved whatever serve_v1alpha1 says.
    controller_binary: str = ""

    def cluster_config(self, name: str) -> ClusterConfig:
        return ClusterConfig(
            name=name,
            nodes=self.nodes,
            max_requests_inflight=self.max_requests_inflight,
            max_mutating_requests_inflight=self.max_mutating_requests_inflight,
            etcd_unsafe_no_fsync=self.etcd_unsafe_no_fsync,
            scheduler_qps=self.scheduler_qps,
            scheduler_burst=self.scheduler_burst,
            controller_manager_qps=self.controller_manager_qps,
            controller_manager_burst=self.controller_manager_burst,
            apiserver_profiling=self.apiserver_profiling,
            pod_start_delay_ms=self.pod_start_delay_ms,
            pod_start_jitter_ms=self.pod_start_jitter_ms,
            pod_deletion=self.pod_deletion,
        )

    def controller_flags(self) -> tuple[str, ...]:
        return (
            f"--kube-api-qps={self.kube_api_qps}",
            f"--kube-api-burst={self.kube_api_burst}",
            f"--sandbox-concurrent-workers={self.sandbox_workers}",
            f"--sandbox-claim-concurrent-workers={self.claim_workers}",
            f"--sandbox-warm-pool-concurrent-workers={self.warm_pool_workers}",
            f"--sandbox-warm-pool-max-batch-size={self.warm_pool_batch}",
            *self.extra_flags,
        )


# --------------------------------------------------------------------------- host, versions, output


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=repo_root(), capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return ""
    return out.stdout.strip()


def cpu_probe_ms(reps: int = 5) -> float:
    """Milliseconds one fixed pure-Python workload takes (fastest of `reps`): how fast this CPU is right now.

    A shared virtual machine can get slower without showing it as load or steal (a neighbour's cache and
    memory pressure, frequency): the same claim cycle then costs more CPU time. Taken before a run's cluster
    starts, it lets two runs' results be compared for the machine they had (December 2: the same overload
    took a third more API-server CPU per write in one hour than in the next)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        acc = 0
        for i in range(200_000):
            acc = (acc + i * i) % 1_000_003
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 2)


def host_info() -> dict[str, Any]:
    """The machine, software versions, the current load and CPU speed (recorded in every result)."""
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    pkgs: dict[str, str] = {}
    for dist in ("aiohttp", "orjson", "prometheus-client", "uvloop"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            pkgs[dist] = version(dist)
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "packages": pkgs,
        "kubernetes": KUBERNETES_VERSION,
        "etcd": ETCD_VERSION,
        "kwok": KWOK_VERSION,
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--", "src")),
        "loadavg": list(os.getloadavg()),
        "cpu_probe_ms": cpu_probe_ms(),
    }


def write_result(scenario: str, report: dict[str, Any], *, directory: Path | None = None) -> Path:
    """Write `<scenario>-<UTC timestamp>.json` under benchmarks/results/ and return its path."""
    out = directory or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{scenario}-{stamp}.json"
    n = 1
    while path.exists():  # two results within one second (smoke runs, a series' spread): never overwrite
        n += 1
        path = out / f"{scenario}-{stamp}.{n}.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    return path


def write_result_with_markdown(scenario: str, report: dict[str, Any]) -> Path:
    """`write_result`, plus `<same name>.md` holding `report["markdown"]` under a title."""
    path = write_result(scenario, report)
    path.with_suffix(".md").write_text(
        f"# {scenario} {path.stem.rsplit('-', 1)[-1]}\n\n{report['markdown']}\n"
    )
    return path


def parse_rfc3339(value: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp with optional fraction ('Z' or offset); None if unusable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def rfc3339nano(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_ready(obj: Object) -> bool:
    return any(
        cond.get("type") == "Ready" and cond.get("status") == "True"
        for cond in (obj.get("status") or {}).get("conditions") or ()
    )


# --------------------------------------------------------------------------- /proc sampling


def _proc_cpu_rss(pid: int) -> tuple[float, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    cpu = (int(stat[11]) + int(stat[12])) / _TICKS
    rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far (None when it is gone)."""
    sample = _proc_cpu_rss(pid)
    return sample[0] if sample else None


def peak_rss_mib(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def _socket_count(pid: int) -> int:
    """Open sockets of a process (the controller's API connections dominate)."""
    count = 0
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                    count += 1
    return count


def host_cpu_seconds() -> tuple[float, float] | None:
    """(busy, stolen) CPU seconds of the whole host so far, summed over its CPUs (/proc/stat).

    Busy counts every process, ours or not; stolen is time the hypervisor gave to other guests. Together
    with our processes' own CPU they say whether a slow run had less machine than a fast one."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = fields
        return (user + nice + system + irq + softirq) / _TICKS, steal / _TICKS
    return None


class ProcSampler:
    """Samples CPU seconds and RSS of the given processes (and the host load) every `interval` seconds."""

    def __init__(self, processes: dict[str, int], interval: float = 1.0) -> None:
        self.processes = processes
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "t": time.time(),
            "load1": os.getloadavg()[0],
            "host": host_cpu_seconds(),
            "cpu": {},
            "rss": {},
        }
        for name, pid in self.processes.items():
            got = _proc_cpu_rss(pid)
            if got is not None:
                row["cpu"][name], row["rss"][name] = got
        ctrl = self.processes.get("agent-sandbox-controller")
        if ctrl is not None:
            row["sockets"] = _socket_count(ctrl)
        return row

    async def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.samples.append(self.sample())

    def between(self, t0: float, t1: float) -> dict[str, Any]:
        """Average CPU cores and peak RSS (MiB) of each process over [t0, t1], plus the load average range."""
        rows = [r for r in self.samples if t0 - self.interval <= r["t"] <= t1 + self.interval]
        if len(rows) < 2:
            return {}
        first, last = rows[0], rows[-1]
        span = max(last["t"] - first["t"], 1e-9)
        cores = {
            n: round((last["cpu"][n] - first["cpu"].get(n, last["cpu"][n])) / span, 2)
            for n in last["cpu"]
            if n in first["cpu"]
        }
        peak = {n: round(max(r["rss"].get(n, 0) for r in rows) / 2**20, 1) for n in last["rss"]}
        loads = [r["load1"] for r in rows]
        sockets = [r["sockets"] for r in rows if "sockets" in r]
        cpu_s = {n: round(last["cpu"][n] - first["cpu"][n], 2) for n in last["cpu"] if n in first["cpu"]}
        host: dict[str, float] = {}
        if first.get("host") and last.get("host"):
            busy = (last["host"][0] - first["host"][0]) / span
            host = {
                "host_busy_cores": round(busy, 2),
                # Busy time of processes that are not ours (other work on the box), and hypervisor steal.
                "other_cores": round(max(busy - sum(cores.values()), 0.0), 2),
                "steal_cores": round((last["host"][1] - first["host"][1]) / span, 2),
            }
        return {
            "seconds": round(span, 1),
            "controller_sockets_max": max(sockets) if sockets else None,
            "cpu_seconds": cpu_s,
            "cpu_cores": cores,
            "cpu_cores_total": round(sum(cores.values()), 2),
            "rss_peak_mib": peak,
            "load1_min": round(min(loads), 2),
            "load1_max": round(max(loads), 2),
            **host,
        }

    def series(self, name: str, t0: float) -> list[tuple[float, float, float]]:
        """(t - t0, CPU cores over the previous interval, RSS MiB) of one process."""
        out: list[tuple[float, float, float]] = []
        prev: dict[str, Any] | None = None
        for row in self.samples:
            if name in row["cpu"] and prev is not None and name in prev["cpu"]:
                dt = max(row["t"] - prev["t"], 1e-9)
                out.append(
                    (
                        round(row["t"] - t0, 2),
                        round((row["cpu"][name] - prev["cpu"][name]) / dt, 3),
                        round(row["rss"][name] / 2**20, 1),
                    )
                )
            prev = row
        return out


# --------------------------------------------------------------------------- trackers


@dataclass(slots=True)
class ClaimRecord:
    namespace: str
    name: str
    scheduled: float = 0.0  # planned send time (epoch)
    sent: float = 0.0
    acked: float | None = None
    ready: float | None = None
    first_observed: float | None = None  # controller annotation
    first_ready: float | None = None  # controller annotation
    sandbox: str = ""
    launch_type: str = ""
    error: str = ""
    deleted: bool = False


class ClaimTracker:
    """Creates claims and watches them to Ready (see module docstring)."""

    def __init__(self, api: ApiClient, *, dwell: float | None = None) -> None:
        self.api = api
        self.dwell = dwell
        self.records: dict[str, ClaimRecord] = {}
        self._ready_count = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.inflight = 0
        self.max_inflight = 0
        self.deleted = 0

    # -- watch
    async def start(self) -> None:
        page = await self.api.list_page(SANDBOX_CLAIM, limit=1)
        self._task = asyncio.create_task(self._watch(page.resource_version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self, rv: str) -> None:
        while True:
            try:
                async for ev in self.api.watch(SANDBOX_CLAIM, resource_version=rv, timeout_seconds=600):
                    meta = ev.object.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if ev.type in ("ADDED", "MODIFIED"):
                        self._observe(ev.object)
            except Gone:
                rv = (await self.api.list_page(SANDBOX_CLAIM, limit=1)).resource_version
            except KubeError as exc:
                log(f"claim watch: {exc}; resuming")
                await asyncio.sleep(0.2)

    def _observe(self, obj: Object) -> None:
        meta = obj["metadata"]
        rec = self.records.get(f"{meta.get('namespace')}/{meta['name']}")
        if rec is None:
            return
        if rec.ready is None and is_ready(obj):
            rec.ready = time.time()
            self._ready_count += 1
            sandbox = ((obj.get("status") or {}).get("sandbox") or {}).get("name") or ""
            rec.sandbox = sandbox
            rec.launch_type = "warm" if sandbox and sandbox != meta["name"] else "cold"
            self._wake()
            if self.dwell is not None:
                self._spawn(self._delete_later(rec))
        ann = meta.get("annotations") or {}
        if rec.first_ready is None and ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT):
            rec.first_ready = parse_rfc3339(ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT))
            rec.first_observed = parse_rfc3339(ann.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT))

    def _wake(self) -> None:
        keep = []
        for target, fut in self._waiters:
            if self._ready_count >= target and not fut.done():
                fut.set_result(None)
            elif not fut.done():
                keep.append((target, fut))
        self._waiters = keep

    async def wait_ready(self, count: int, within: float) -> bool:
        """Wait until `count` tracked claims are Ready; False on timeout."""
        if self._ready_count >= count:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((count, fut))
        try:
            await asyncio.wait_for(fut, within)
        except TimeoutError:
            return False
        return True

    async def wait_annotations(self, within: float) -> None:
        """Give the controller's post-Ready metadata patch time to show on the watch."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if all(r.first_ready is not None for r in self.records.values() if r.ready is not None):
                return
            await asyncio.sleep(0.2)

    @property
    def ready_count(self) -> int:
        return self._ready_count

    # -- load
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_later(self, rec: ClaimRecord) -> None:
        assert self.dwell is not None
        await asyncio.sleep(self.dwell)
        with contextlib.suppress(NotFound):
            try:
                await self.api.delete(SANDBOX_CLAIM, rec.name, namespace=rec.namespace)
            except KubeError as exc:
                log(f"delete claim {rec.name}: {exc}")
                return
        rec.deleted = True
        self.deleted += 1

    def body(self, namespace: str, name: str, pool: str, sent: float) -> Object:
        return {
            "apiVersion": f"{c.EXTENSIONS_GROUP}/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT: rfc3339nano(sent)},
            },
            "spec": {"warmPoolRef": {"name": pool}},
        }

    async def create(self, namespace: str, name: str, pool: str, scheduled: float) -> None:
        rec = ClaimRecord(namespace, name, scheduled=scheduled)
        rec.sent = time.time()
        self.records[f"{namespace}/{name}"] = rec
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await self.api.create(SANDBOX_CLAIM, self.body(namespace, name, pool, rec.sent))
            rec.acked = time.time()
        except KubeError as exc:
            rec.error = str(exc)[:200]
        finally:
            self.inflight -= 1

    async def drive(
        self,
        arrivals: Sequence[float],
        targets: Sequence[tuple[str, str]],
        *,
        prefix: str,
        max_inflight: int = 2000,
    ) -> float:
        """Open-loop load: claim i is created at t0 + arrivals[i] in targets[i] = (namespace, pool).

        Returns t0 (epoch). Requests are fired without waiting for earlier ones; if more than
        `max_inflight` are unanswered the driver waits (recorded as send lag, never silently dropped).
        """
        loop = asyncio.get_running_loop()
        t0_mono = loop.time() + 0.05
        t0 = time.time() + 0.05
        gate = asyncio.Semaphore(max_inflight)

        async def one(i: int, ns: str, pool: str) -> None:
            try:
                await self.create(ns, f"{prefix}-{i:05d}", pool, t0 + arrivals[i])
            finally:
                gate.release()

        for i, offset in enumerate(arrivals):
            delay = t0_mono + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await gate.acquire()
            ns, pool = targets[i]
            self._spawn(one(i, ns, pool))
        return t0

    async def wait_sent(self) -> None:
        while self.inflight:  # noqa: ASYNC110 (a counter, polled rarely)
            await asyncio.sleep(0.05)


class SandboxTracker:
    """Watches Sandboxes: when each was first seen (ADDED) and first Ready (throughput of refill / cold)."""

    def __init__(self, api: ApiClient, namespace: str | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.added: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        page = await self.api.list_page(SANDBOX, namespace=self.namespace, limit=1)
        self._task = asyncio.create_task(self._watch(page.resource_version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self, rv: str) -> None:
        while True:
            try:
                async for ev in self.api.watch(
                    SANDBOX, namespace=self.namespace, resource_version=rv, timeout_seconds=600
                ):
                    meta = ev.object.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if ev.type == "BOOKMARK":
                        continue
                    key = f"{meta.get('namespace')}/{meta.get('name')}"
                    now = time.time()
                    if ev.type == "ADDED":
                        self.added.setdefault(key, now)
                    if ev.type != "DELETED" and key not in self.ready and is_ready(ev.object):
                        self.ready[key] = now
            except Gone:
                rv = (await self.api.list_page(SANDBOX, namespace=self.namespace, limit=1)).resource_version
            except KubeError as exc:
                log(f"sandbox watch: {exc}; resuming")
                await asyncio.sleep(0.2)

    async def wait_ready(self, count: int, within: float) -> bool:
        deadline = time.monotonic() + within
        while len(self.ready) < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True


# --------------------------------------------------------------------------- the bench

_CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
)


async def _await_conversion_webhook(api: ApiClient, within: float = 60.0) -> None:
    """Wait until the controller has pointed every CRD at its conversion webhook, then let it settle.

    The controller patches the CRDs right after it starts; the API server then rebuilds each CRD's storage
    and, for a moment, answers requests for those kinds with 503 "apiserver is shutting down".
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        urls = []
        for name in _CRDS:
            crd = await api.get(CRD, name)
            webhook = ((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
            urls.append((webhook.get("clientConfig") or {}).get("url"))
        if all(urls):
            await asyncio.sleep(2.0)
            return
        await asyncio.sleep(0.2)
    log("conversion webhook not configured on every CRD; continuing")


async def _unserve_v1alpha1(api: ApiClient) -> None:
    """Set `served: false` on the v1alpha1 version of every CRD (then let the storage rebuild settle)."""
    for name in _CRDS:
        crd = await api.get(CRD, name)
        for i, version in enumerate(crd["spec"]["versions"]):
            if version["name"] == "v1alpha1" and version.get("served"):
                patch = [{"op": "replace", "path": f"/spec/versions/{i}/served", "value": False}]
                await api.patch(CRD, name, patch, patch_type=PatchType.JSON)
    await asyncio.sleep(2.0)


async def retry_503(call: Callable[[], Awaitable[T]], within: float = 30.0) -> T:
    """Run an API call, retrying 503s (CRD storage being rebuilt) for up to `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except ServerError as exc:
            if exc.status != 503 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


_BENCH_CACHE_ENV = "AGENT_SANDBOX_BENCH_ISOLATE"


def isolate_clusters() -> Path:
    """Keep benchmark clusters in their own state root (`<cache>/bench/`, binaries shared by a symlink).

    On a shared machine a parallel `agent-sandbox dev down --all` (or `make down`) stops every cluster it
    finds under the cache root; a measurement in flight must not be one of them. Set
    `AGENT_SANDBOX_BENCH_ISOLATE=0` to keep bench clusters visible to `dev status`/`dev down`.
    """
    if os.environ.get(_BENCH_CACHE_ENV, "1") == "0":
        return cache_root()
    real = cache_root()
    if real.name == "bench":
        return real
    root = real / "bench"
    root.mkdir(parents=True, exist_ok=True)
    (real / "bin").mkdir(parents=True, exist_ok=True)
    link = root / "bin"
    if not link.is_symlink():
        link.symlink_to(real / "bin", target_is_directory=True)
    os.environ["AGENT_SANDBOX_CACHE"] = str(root)
    return root


@dataclass
class Bench:
    """One benchmark cluster with the controller; use `async with Bench.up(...) as bench`."""

    cluster: DevCluster
    controller: Started
    tuning: Tuning
    api: ApiClient
    sampler: ProcSampler
    metrics_port: int
    notes: list[str] = field(default_factory=list)

    @classmethod
    @contextlib.asynccontextmanager
    async def up(cls, name: str, tuning: Tuning, *, extensions: bool = True) -> AsyncIterator[Bench]:
        """Start the cluster and the controller; always stop both (by PID) when the block ends."""
        root = isolate_clusters()
        log(
            f"cluster {name} (under {root}): {tuning.nodes} nodes, controller {' '.join(tuning.controller_flags())}"
        )
        cluster = await asyncio.to_thread(DevCluster.up, tuning.cluster_config(name))
        api: ApiClient | None = None
        sampler: ProcSampler | None = None
        failed = True
        try:
            if tuning.controller_binary:
                started = await asyncio.to_thread(
                    start_binary_controller,
                    cluster,
                    tuning.controller_binary,
                    extensions=extensions,
                    extra=tuning.controller_flags(),
                )
            else:
                started = await asyncio.to_thread(
                    start_controller, cluster, extensions=extensions, extra=tuning.controller_flags()
                )
            api = await ApiClient.from_kubeconfig(str(cluster.kubeconfig), connections=4)
            if not tuning.controller_binary:
                await _await_conversion_webhook(api)
            if not tuning.serve_v1alpha1 or tuning.controller_binary:
                await _unserve_v1alpha1(api)
            procs = {s.name: s.pid for s in cluster.state.started if is_ours(s.pid, s.exe)}
            procs["bench-harness"] = os.getpid()  # the load generator shares the same cores
            sampler = ProcSampler(procs)
            sampler.start()
            yield cls(cluster, started, tuning, api, sampler, cluster.state.extra_ports["controller_metrics"])
            failed = False
        finally:
            if sampler is not None:
                await sampler.stop()
            if api is not None:
                await api.close()
            # A failed run keeps the component logs (copied under <cache>/failed/) for the post-mortem.
            await asyncio.to_thread(cluster.down, quiet=not failed, keep_logs=failed)
            log(f"cluster {name}: down")

    # -- description
    def describe(self) -> dict[str, Any]:
        return {
            "tuning": asdict(self.tuning),
            "controller_flags": list(self.tuning.controller_flags()),
            "cluster_config": asdict(self.cluster.config),
        }

    # -- metrics
    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each process of the cluster and the controller (not the harness)."""
        return {n: v for n, v in self.sampler.sample()["cpu"].items() if n != "bench-harness"}

    def scrape_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as resp:
            body: bytes = resp.read()
        return body.decode()

    async def scrape(self) -> list[promtext.Sample]:
        return promtext.parse(await asyncio.to_thread(self.scrape_text))

    async def scrape_apiserver(self) -> list[promtext.Sample]:
        """kube-apiserver's own /metrics (request counts by verb/resource for every client)."""
        return promtext.parse((await self.api.request("GET", "/metrics")).decode())

    # -- objects
    async def ensure_namespace(self, name: str) -> None:
        with contextlib.suppress(AlreadyExists):
            body: Object = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            await retry_503(lambda: self.api.create(NAMESPACE, body))

    async def create_template(self, namespace: str, name: str = "template-0") -> None:
        body: Object = {
            "apiVersion": f"{c.EXTENSIONS_GROUP}/v1beta1",
            "kind": "SandboxTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "podTemplate": {
                    "spec": {
                        "containers": [{"name": "main", "image": "alpine", "command": ["sleep", "28800"]}]
                    }
                }
            },
        }
        with contextlib.suppress(AlreadyExists):
            await retry_503(lambda: self.api.create(SANDBOX_TEMPLATE, body))

    async def create_pool(
        self, namespace: str, name: str, replicas: int, template: str = "template-0"
    ) -> None:
        body: Object = {
            "apiVersion": f"{c.EXTENSIONS_GROUP}/v1beta1",
            "kind": "SandboxWarmPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
        }
        with contextlib.suppress(AlreadyExists):
            await retry_503(lambda: self.api.create(SANDBOX_WARM_POOL, body))

    async def scale_pool(self, namespace: str, name: str, replicas: int) -> None:
        patch = {"spec": {"replicas": replicas}}
        await retry_503(lambda: self.api.patch(SANDBOX_WARM_POOL, name, patch, namespace=namespace))

    async def pool_ready(self, namespace: str, name: str) -> tuple[int, int]:
        """(readyReplicas, spec.replicas) of a pool."""
        pool = await self.api.get(SANDBOX_WARM_POOL, name, namespace=namespace)
        return int((pool.get("status") or {}).get("readyReplicas") or 0), int(pool["spec"]["replicas"])

    async def wait_pools_ready(
        self, pools: Sequence[tuple[str, str]], within: float, *, label: str = "pool"
    ) -> float:
        """Wait until every (namespace, pool) has readyReplicas >= replicas; returns seconds taken."""
        t0 = time.monotonic()
        last = 0.0
        while True:
            states = [await self.pool_ready(ns, p) for ns, p in pools]
            if all(r >= want for r, want in states):
                return time.monotonic() - t0
            if time.monotonic() - t0 > within:
                raise TimeoutError(f"{label} not Ready within {within:.0f}s: {states}")
            if time.monotonic() - last > 10:
                last = time.monotonic()
                log(f"{label}: ready {sum(r for r, _ in states)}/{sum(w for _, w in states)}")
            await asyncio.sleep(0.5)

    async def count(self, kind: ResourceKind, namespace: str | None = None) -> int:
        return len(await self.api.list(kind, namespace=namespace))

    # -- profiling
    def profiler(self, duration: float, out: Path, *, rate: int = 100) -> subprocess.Popen[bytes] | None:
        """Start `py-spy record` on the controller for `duration` s, collapsed stacks into `out`."""
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            self.notes.append("py-spy not installed: no profile (pip install -e '.[bench]')")
            return None
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            exe,
            "record",
            "--pid",
            str(self.controller.pid),
            "--duration",
            str(max(1, round(duration))),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--nonblocking",
            "--output",
            str(out),
        ]
        return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def finish_profiler(proc: subprocess.Popen[bytes] | None, within: float = 60.0) -> None:
    if proc is None:
        return
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 (a child process)
        await asyncio.sleep(0.2)
    if proc.poll() is None:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)
