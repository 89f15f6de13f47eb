"""The machine a result was measured on: hardware, software versions, current load and CPU speed.

Owns: `host_info` (recorded in every result) and `cpu_probe_ms` (how fast this CPU is right now, taken
before a run's cluster starts).
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster import ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION
from agent_sandbox.devcluster.controller import repo_root

__all__ = ["cpu_probe_ms", "host_info"]


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
