"""One benchmark cluster: the gate-tuned local control plane with the real controller, torn down by PID.

Owns: `Bench` - one cluster per run (`async with Bench.up(...)`), always torn down in `finally`, also when
the run is interrupted while the cluster or the controller is still starting; an admin
`ApiClient` for the load; `/proc` sampling of every component (CPU cores, RSS); `/metrics` scrapes of the
controller and the API server; the namespaces, templates and warm pools a scenario draws from; optional
py-spy profiling of the controller - plus the bring-up steps it waits for (the conversion webhook on every
CRD, v1alpha1 unserved when asked), `retry_503`, `isolate_clusters` (bench clusters under their own state
root) and `clear_stale_cluster` (a cluster whose bench process was killed outright is stopped by the next
run).

Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.binaries import cache_root
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.controller import start_binary_controller, start_controller
from agent_sandbox.devcluster.processes import Started, is_ours
from agent_sandbox.devcluster.state import clusters_root
from agent_sandbox.kube import (
    CRD,
    NAMESPACE,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    AlreadyExists,
    ApiClient,
    Object,
    PatchType,
    ResourceKind,
    ServerError,
)

from . import promtext
from .log import log, write_err
from .proc_sampling import ProcSampler
from .tuning import Tuning

__all__ = [
    "Bench",
    "await_conversion_webhook",
    "clear_stale_cluster",
    "isolate_clusters",
    "retry_503",
    "unserve_v1alpha1",
]

T = TypeVar("T")


_CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
)


async def await_conversion_webhook(api: ApiClient, within: float = 60.0) -> None:
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


async def unserve_v1alpha1(api: ApiClient) -> None:
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
_BENCH_ROOT_ENV = "AGENT_SANDBOX_BENCH_ROOT"


def isolate_clusters() -> Path:
    """Keep benchmark clusters in their own state root (`<cache>/bench/`, binaries shared by a symlink).

    On a shared machine a parallel `agent-sandbox dev down --all` (or `make down`) stops every cluster it
    finds under the cache root; a measurement in flight must not be one of them. Set
    `AGENT_SANDBOX_BENCH_ISOLATE=0` to keep bench clusters visible to `dev status`/`dev down`, or
    `AGENT_SANDBOX_BENCH_ROOT=<dir>` to put them elsewhere (a test's own directory) while the control-plane
    binaries still come from the cache.
    """
    if os.environ.get(_BENCH_CACHE_ENV, "1") == "0":
        return cache_root()
    real = cache_root()
    override = os.environ.get(_BENCH_ROOT_ENV, "")
    root = Path(override).expanduser().absolute() if override else real / "bench"
    if real == root or (not override and real.name == "bench"):
        return real  # isolated already (an earlier run in this process, or the caller's environment)
    root.mkdir(parents=True, exist_ok=True)
    (real / "bin").mkdir(parents=True, exist_ok=True)
    link = root / "bin"
    if not link.is_symlink():
        link.symlink_to(real / "bin", target_is_directory=True)
    os.environ["AGENT_SANDBOX_CACHE"] = str(root)
    return root


async def _finish_in_thread(call: Callable[[], T]) -> T:
    """Run a blocking step (start or stop of processes) in a thread; an interruption waits for it to end.

    Cancelling the await of `asyncio.to_thread` does not stop the thread: the step would go on starting
    processes while the teardown, already running, stops the ones recorded so far. So a cancellation (Ctrl-C,
    or `asyncio.run` cancelling what is left after SIGTERM/SIGHUP) waits for the step to finish first. The
    step is a plain future, not a task: `asyncio.run`'s shutdown cancels every task, and would cancel it too.
    """
    future = asyncio.get_running_loop().run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise


class _StartAborted(Exception):
    """Raised inside `DevCluster.up`'s thread at its next step once the run was interrupted."""


_OWNER_FILE = "bench-owner.json"


def _process_start(pid: int) -> int | None:
    """The start time of process `pid` (clock ticks since boot, /proc/<pid>/stat field 22); None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


def _pid_namespace() -> str | None:
    """This process's PID namespace (`pid:[4026531836]`); None when /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _owner_gone(pid: int, start: int) -> bool:
    """Whether process `pid` of this PID namespace, started at `start`, has ended.

    Under `hidepid` another user's process has no /proc entry, yet it runs: signal 0 then answers EPERM.
    """
    seen = _process_start(pid)
    if seen is not None:
        return seen != start  # another process under a reused PID
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # EPERM: it exists, only hidden
    return False  # visible to signals but its /proc entry unreadable: not known to be gone


def _record_owner(name: str) -> None:
    """Note in the cluster's directory which process runs it (see `clear_stale_cluster`)."""
    pid = os.getpid()
    owner = {
        "pid": pid,
        "start": _process_start(pid),
        "pidns": _pid_namespace(),
        "host": socket.gethostname(),
    }
    # Best effort: a note for a later run must never fail this one's start.
    with contextlib.suppress(OSError):
        (clusters_root() / name / _OWNER_FILE).write_text(json.dumps(owner))


def clear_stale_cluster(name: str) -> bool:
    """Stop the cluster `name` when the bench process that started it is gone; True if there was one.

    A bench killed with SIGKILL (or by a second signal during its teardown) leaves its cluster running, and
    the next run of the same scenario would refuse to start. A cluster whose owner still runs (a parallel
    bench of the same scenario) or cannot be known to be gone is left alone, and `DevCluster.up` then names
    the command that stops it: an owner not started by a bench, with no start time recorded, or on another
    host or in another PID namespace (two containers sharing the cache directory: its PID means nothing
    here, and a live bench would look dead).
    """
    existing = DevCluster.load(name)
    if existing is None or not any(existing.running().values()):
        return False  # nothing running: DevCluster.up clears a dead record itself
    try:
        owner = json.loads((existing.directory / _OWNER_FILE).read_text())
        pid, start, pidns, host = int(owner["pid"]), owner["start"], owner["pidns"], owner["host"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not isinstance(start, int) or pidns is None or pidns != _pid_namespace():
        return False
    if host != socket.gethostname() or not _owner_gone(pid, start):
        return False
    log(f"cluster {name}: left running by bench process {pid}, which is gone; stopping it")
    existing.down(quiet=True)
    return True


async def _start_cluster(config: ClusterConfig) -> DevCluster:
    """`DevCluster.up` in a thread; interrupted, it stops at its next step and nothing of it stays running.

    `DevCluster.up` stops what it started when a step fails; the interruption makes its next progress line
    fail (`_StartAborted`). The last line comes after the start, when `up` no longer cleans up: the cluster
    is then stopped here.
    """
    aborted = threading.Event()

    def say(msg: str) -> None:
        _record_owner(config.name)  # from the first step on: etcd is running by the time of the next line
        if aborted.is_set():
            raise _StartAborted(f"cluster {config.name}: start interrupted")
        write_err(msg)  # a lost terminal (EIO after a hangup) must not fail the start

    future = asyncio.get_running_loop().run_in_executor(None, lambda: DevCluster.up(config, log=say))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        aborted.set()
        # Nothing is printed before the cluster is down: the teardown must not depend on the terminal.
        cluster: DevCluster | None = None
        try:
            cluster = await future
        except _StartAborted:
            # Raised by a step (`up` has stopped everything) or by the line after the start (it has not).
            cluster = DevCluster.load(config.name)
        except Exception:
            pass  # the start failed on its own and `up` has cleaned up
        if cluster is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(cluster.down, quiet=True)
            )
        log(f"cluster {config.name}: down (interrupted while starting)")
        raise


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
        """Start the cluster and the controller; always stop both (by PID) when the block ends.

        Also when the run is interrupted (Ctrl-C, `kill`, a hangup) while they are still starting: the start
        runs in a thread that an interruption cannot stop, so the teardown waits for it (`_start_cluster`,
        `_finish_in_thread`) before stopping what it started.
        """
        root = isolate_clusters()
        log(
            f"cluster {name} (under {root}): {tuning.nodes} nodes, controller {' '.join(tuning.controller_flags())}"
        )
        await _finish_in_thread(lambda: clear_stale_cluster(name))
        cluster = await _start_cluster(tuning.cluster_config(name))
        api: ApiClient | None = None
        sampler: ProcSampler | None = None
        failed = True
        try:
            if tuning.controller_binary:
                started = await _finish_in_thread(
                    lambda: start_binary_controller(
                        cluster,
                        tuning.controller_binary,
                        extensions=extensions,
                        extra=tuning.controller_flags(),
                    )
                )
            else:
                started = await _finish_in_thread(
                    lambda: start_controller(cluster, extensions=extensions, extra=tuning.controller_flags())
                )
            api = await ApiClient.from_kubeconfig(str(cluster.kubeconfig), connections=4)
            if not tuning.controller_binary:
                await await_conversion_webhook(api)
            if not tuning.serve_v1alpha1 or tuning.controller_binary:
                await unserve_v1alpha1(api)
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
            # A failed run keeps the component logs (copied under <cache>/failed/) for the post-mortem. Quiet:
            # `down` prints between stopping the processes and removing the directory, and a print to a
            # terminal that hung up (EIO) would leave the directory behind; the line is logged after it.
            await _finish_in_thread(lambda: cluster.down(quiet=True, keep_logs=failed))
            kept = f"; logs kept under {cache_root() / 'failed'}/{name}-*" if failed else ""
            log(f"cluster {name}: down{kept}")

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
