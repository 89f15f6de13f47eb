"""CPU and memory of the benchmark cluster's processes and of the host, read from /proc.

Owns: `ProcSampler` (CPU seconds and RSS of every component, the controller's open sockets and the host's
busy and stolen CPU, sampled every second; averages and peaks over a window), `process_cpu_seconds`,
`process_kernel_share` (system CPU and page faults), `peak_rss_mib` and `host_cpu_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "KernelShare",
    "ProcSampler",
    "host_cpu_seconds",
    "peak_rss_mib",
    "process_cpu_seconds",
    "process_kernel_share",
]

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: index 0 is field 3 (state) of proc(5)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _proc_cpu_rss(pid: int) -> tuple[float, int] | None:
    if (stat := _stat_fields(pid)) is None:
        return None
    cpu = (int(stat[11]) + int(stat[12])) / _TICKS
    rss = int(stat[21]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far (None when it is gone)."""
    sample = _proc_cpu_rss(pid)
    return sample[0] if sample else None


@dataclass(frozen=True, slots=True)
class KernelShare:
    """What the kernel did for a process so far: system CPU seconds and page faults served."""

    system_s: float
    minor_faults: int  # first touches of fresh memory (and re-touches of memory given back to the OS)


def process_kernel_share(pid: int) -> KernelShare | None:
    """System CPU and page faults of a process so far (None when it is gone).

    A Go heap that grows, or that its scavenger keeps returning to the OS and taking back, is paid here:
    each fresh 4 KiB page is a minor fault the kernel zeroes (~3 us on this VM)."""
    if (stat := _stat_fields(pid)) is None:
        return None
    return KernelShare(system_s=int(stat[12]) / _TICKS, minor_faults=int(stat[7]))


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
