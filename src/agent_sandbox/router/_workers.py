"""`--workers N`: N router processes sharing the proxy listeners (SO_REUSEPORT), one metrics endpoint.

One Python process runs on one core; `--workers` trades memory (one more process each) for using more
cores (docs/design/router-performance.md has the measurements). The process started by the user is the
supervisor: it runs a complete router (all listeners, probes, metrics) and starts N-1 workers, each a
full proxy with its own Pod cache and authorizer, bound to the same proxy addresses with SO_REUSEPORT
(the kernel spreads connections across them). Workers serve no probes or metrics listener: each writes
its metrics (Prometheus text) to a file in a private directory once a second, and the supervisor's
`/metrics` sums them with its own (same name and labels: values added; `*_build_info`: one copy).

Lifecycle: the supervisor is ready when it and every worker are (a worker's first metrics file marks it
ready); a worker that exits is restarted after a second; SIGTERM/SIGINT to the supervisor is passed on,
everyone drains, the supervisor waits for the workers. A worker whose supervisor disappears stops itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ._config import FLAGS

__all__ = ["WORKER_ENV", "MergedMetrics", "Supervisor", "worker_flags", "worker_metrics_loop"]

log = logging.getLogger("agent_sandbox.router.workers")

WORKER_ENV = "AGENT_SANDBOX_ROUTER_WORKER"
"""Set in a worker's environment to the path of its metrics file."""
_FRESH = 5.0
_RESTART_DELAY = 1.0


def worker_flags(argv: Sequence[str], *, http_address: str | None, https_address: str | None) -> list[str]:
    """A worker's command line: the supervisor's flags, then overrides (Go flags: the last one wins).

    Overrides: one worker (no nesting), no metrics or probe listener, and the proxy addresses with the
    ports the supervisor actually bound (so ":0" in tests means the same port for everyone).
    """
    kinds = {f.name: f.kind for f in FLAGS}
    flags: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-"):
            break  # positional arguments end flag parsing (Go), for the supervisor too
        flags.append(arg)
        name, eq, _ = arg.lstrip("-").partition("=")
        if not eq and kinds.get(name, "bool") != "bool" and i + 1 < len(argv):
            flags.append(argv[i + 1])  # "--flag value": the value travels with its flag
            i += 1
        i += 1
    flags += ["--workers=1", "--metrics-bind-address=0", "--health-probe-bind-address=0"]
    if http_address is not None:
        flags.append(f"--http-bind-address={http_address}")
    if https_address is not None:
        flags.append(f"--https-bind-address={https_address}")
    return flags


class MergedMetrics:
    """A collector: the supervisor's registry plus every worker's last metrics file, summed."""

    def __init__(self, own: CollectorRegistry, directory: Path) -> None:
        self.own = own
        self.directory = directory

    def _worker_families(self) -> Iterable[Metric]:
        for path in sorted(self.directory.glob("*.prom")):
            with contextlib.suppress(OSError, ValueError):
                yield from text_string_to_metric_families(path.read_text())

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        families = [*self.own.collect(), *self._worker_families()]
        for family in families:
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                if family.name.endswith("_build_info"):
                    values[key] = sample.value
                else:
                    values[key] = values.get(key, 0.0) + sample.value
        for (family_name, sample_name, labels), value in values.items():
            merged[family_name].add_sample(sample_name, dict(labels), value)
        return list(merged.values())


async def worker_metrics_loop(registry: CollectorRegistry, path: Path, stop: asyncio.Event) -> None:
    """In a worker: publish the registry to `path` every second; stop when the supervisor is gone."""
    parent = os.getppid()
    while not stop.is_set():
        _publish(registry, path)
        if os.getppid() != parent:
            log.warning("supervisor exited; worker stopping")
            stop.set()
            break
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await stop.wait()
    _unpublish(path)


def _publish(registry: CollectorRegistry, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(generate_latest(registry))  # a few KiB once a second: not worth a thread
    os.replace(tmp, path)


def _unpublish(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


class Supervisor:
    """Starts and watches the worker processes of one router."""

    def __init__(self, count: int, argv: Sequence[str]) -> None:
        self.count = count
        self.argv = list(argv)
        self.directory = Path(tempfile.mkdtemp(prefix="sandbox-router-workers-"))
        self.flags: list[str] = []
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._started: dict[int, float] = {}
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def _spawn(self, index: int) -> None:
        path = self.directory / f"worker-{index}.prom"
        env = {**os.environ, WORKER_ENV: str(path)}
        self._procs[index] = subprocess.Popen(
            [sys.executable, "-m", "agent_sandbox.router", *self.flags], env=env
        )
        self._started[index] = time.monotonic()
        log.info("started router worker", extra={"worker": index, "pid": self._procs[index].pid})

    def start(self, *, http_address: str | None, https_address: str | None) -> None:
        """Start the workers on the supervisor's bound proxy addresses ("host:port")."""
        self.flags = worker_flags(self.argv, http_address=http_address, https_address=https_address)
        for index in range(1, self.count):
            self._spawn(index)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(_RESTART_DELAY)
            for index, proc in list(self._procs.items()):
                if proc.poll() is not None and not self._stopping:
                    log.error(
                        "router worker exited; restarting", extra={"worker": index, "code": proc.returncode}
                    )
                    self._spawn(index)

    def ready(self) -> bool:
        """Every worker is running and has published metrics recently (it is serving)."""
        now = time.time()
        for index, proc in self._procs.items():
            path = self.directory / f"worker-{index}.prom"
            try:
                fresh = now - path.stat().st_mtime < _FRESH
            except OSError:
                fresh = False
            if proc.poll() is not None or not fresh:
                return False
        return True

    async def stop(self, grace: float) -> None:
        """Pass SIGTERM on and wait (SIGKILL after `grace` seconds)."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self._procs.values():
            while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110 - polls a child
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.remove_directory()

    def remove_directory(self) -> None:
        """Remove the workers' metrics directory (a normal stop, a failed or cancelled start, an exit without
        the stop: a second signal, the watchdog); a worker still writing its file there is gone or killed."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.poll() is None]


def merged_registry(own: CollectorRegistry, supervisor: Supervisor) -> CollectorRegistry:
    """A registry to serve on `/metrics`: the supervisor's metrics plus the workers'."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MergedMetrics(own, supervisor.directory))
    return registry
