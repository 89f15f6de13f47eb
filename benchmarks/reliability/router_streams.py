"""The router under many concurrent long-lived streams: bounded RSS, no file descriptor leak.

Owns: `rounds` rounds of `streams` concurrent `GET /stream/<seconds>` requests (a chunked body, one line
every 0.5 s) through the real `agent-sandbox-router` process to one backend (benchmarks/router/backend.py
on a 127.x address). Measured from /proc: the router's RSS and open fds idle, while the streams are open,
and after each round has closed (a leak shows as fds or RSS after round N above after round 1), plus how
many streams completed whole (every line, then the terminating chunk).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..router.processes import rss_kib, start_backend, start_router

__all__ = ["Round", "StreamsRun", "run_streams"]


@dataclass(frozen=True)
class Round:
    completed: int
    failed: int
    open_rss_mib: float
    open_fds: int
    after_rss_mib: float
    after_fds: int
    seconds: float


@dataclass
class StreamsRun:
    streams: int
    hold_s: float
    idle_rss_mib: float = 0.0
    idle_fds: int = 0
    peak_rss_mib: float = 0.0
    rounds: list[Round] = field(default_factory=list)
    first_failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rounds": [asdict(r) for r in self.rounds]}


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _one(router_port: int, ip: str, port: int, hold_s: float, failures: list[str]) -> bool:
    request = (
        f"GET /stream/{hold_s} HTTP/1.1\r\nHost: bench\r\nX-Sandbox-ID: bench\r\nX-Sandbox-Pod-IP: {ip}\r\n"
        f"X-Sandbox-Port: {port}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", router_port)
    except OSError as exc:
        failures.append(f"connect: {exc}")
        return False
    try:
        writer.write(request)
        async with asyncio.timeout(hold_s + 60):
            data = await reader.read()  # until the router closes (Connection: close)
        head, _, body = data.partition(b"\r\n\r\n")
        lines = body.count(b'{"ok":true}')
        ok = (
            head.startswith(b"HTTP/1.1 200")
            and body.endswith(b"0\r\n\r\n")
            and lines >= int(hold_s / 0.5) - 1
        )
        if not ok:
            status = head.split(b"\r\n", 1)[0]
            failures.append(f"{status!r}, {lines} lines, {len(body)} bytes")
        return ok
    except (OSError, TimeoutError) as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
        return False
    finally:
        writer.close()


async def run_streams(*, streams: int, hold_s: float, rounds: int) -> StreamsRun:
    """Start a backend and a router, run the rounds, stop both (by PID)."""
    ip = "127.78.0.1"
    backend = start_backend("python-rest", ip)
    router = start_router([])
    out = StreamsRun(streams=streams, hold_s=hold_s)
    try:
        await asyncio.sleep(1)
        out.idle_rss_mib, out.idle_fds = round(rss_kib(router.pid) / 1024, 1), _fds(router.pid)
        for _ in range(rounds):
            failures: list[str] = []
            start = time.monotonic()
            tasks = [asyncio.create_task(_one(router.port, ip, backend.port, hold_s, failures))
                     for _ in range(streams)]  # fmt: skip
            await asyncio.sleep(hold_s / 2)
            open_rss, open_fds = rss_kib(router.pid) / 1024, _fds(router.pid)
            results = await asyncio.gather(*tasks)
            took = time.monotonic() - start
            await asyncio.sleep(2)
            out.rounds.append(Round(
                completed=sum(results), failed=len(results) - sum(results),
                open_rss_mib=round(open_rss, 1), open_fds=open_fds,
                after_rss_mib=round(rss_kib(router.pid) / 1024, 1), after_fds=_fds(router.pid),
                seconds=round(took, 1),
            ))  # fmt: skip
            out.first_failures.extend(failures[: 5 - len(out.first_failures)])
        out.peak_rss_mib = round(rss_kib(router.pid, "VmHWM") / 1024, 1)
    finally:
        router.stop()
        backend.stop()
    return out
