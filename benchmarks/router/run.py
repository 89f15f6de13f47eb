"""Router throughput/latency under `wrk`, the backends alone, and router RSS with 1,000 open streams.

    python -m benchmarks.router [--rounds 3] [--duration 8] [--concurrency 10,50,200] [--bodies empty,4k]
                                [--backends nginx,python-rest] [--variants uvloop,asyncio,workers2]
                                [--streams 1000] [--quick] [--no-report]

Method (docs/performance.md, "Sandbox Router"):

* Backends on their own 127.x address: nginx (static, one worker: shows the router's own ceiling), the
  small aiohttp REST app (benchmarks/router/backend.py), and the project's runtime when installed.
* For every round, every backend and every cell (concurrency x body), wrk (2 threads, keep-alive) runs
  against the backend directly and then through each router variant; variants are restarted every round
  and cells are interleaved, so machine load drifts hit every variant alike. Spread over rounds is
  reported (min / median / max), never only the best run.
* `empty` = GET with an 11-byte response; `4k` = POST with a 4 KiB request body and a 4 KiB response.
* Also recorded per cell: router CPU microseconds per request (/proc, all router processes), the host
  load average before and after, and wrk's error counts (a run with errors is flagged, not dropped).
* RSS: the default router with `--streams` concurrent requests held open by the backend (`/hold`).

The whole run holds `/tmp/agent-sandbox-bench.lock` so benchmarks never overlap. Results:
`benchmarks/results/router-<UTC>.json`; the markdown block in docs/performance.md is regenerated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..host import host_info
from ..log import log
from ..result_files import write_result
from . import report
from .processes import Proc, cpu_seconds, rss_kib, start_backend, start_router, wrk

__all__ = ["VARIANTS", "main"]

LOCK = Path("/tmp/agent-sandbox-bench.lock")
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "performance.md"

VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "uvloop": ([], {}),
    "uvloop-nolog": (["--access-log=false"], {}),
    "asyncio": ([], {"AGENT_SANDBOX_EVENT_LOOP": "asyncio"}),
    "workers2": (["--workers=2"], {}),
}
"""Router configurations compared: flags and environment. `uvloop` is the default configuration."""

_addresses = itertools.count(1)


def _next_ip() -> str:
    n = next(_addresses)
    return f"127.77.{n // 250}.{n % 250 + 1}"


@contextlib.contextmanager
def bench_lock() -> Iterator[None]:
    with LOCK.open("a") as fh:
        log(f"waiting for {LOCK}")
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pids(proc: Proc) -> list[int]:
    """The process and its direct children (router workers, nginx worker)."""
    pids = [proc.pid]
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            children = (task / "children").read_text().split()
            pids += [int(c) for c in children]
    return pids


def _cell(
    url: str,
    *,
    c: int,
    body: str,
    duration: float,
    headers: dict[str, str],
    router: Proc | None,
    backend: Proc,
) -> dict[str, Any]:
    path = "/4k" if body == "4k" else "/"
    load_before = os.getloadavg()[0]
    router_pids = _pids(router) if router else []
    backend_pids = _pids(backend)
    cpu_r0, cpu_b0 = cpu_seconds(router_pids), cpu_seconds(backend_pids)
    out = wrk(url + path, connections=c, duration=duration, body=body, headers=headers)
    cpu_r1, cpu_b1 = cpu_seconds(router_pids), cpu_seconds(backend_pids)
    requests = max(out["requests"], 1)
    seconds = out["duration_us"] / 1e6
    return {
        "rps": round(out["requests"] / seconds, 1),
        "p50_ms": out["p50_us"] / 1000,
        "p90_ms": out["p90_us"] / 1000,
        "p95_ms": out["p95_us"] / 1000,
        "p99_ms": out["p99_us"] / 1000,
        "max_ms": out["max_us"] / 1000,
        "requests": out["requests"],
        "errors": out["errors"],
        "router_cpu_us_per_req": round((cpu_r1 - cpu_r0) * 1e6 / requests, 1) if router else None,
        "backend_cpu_us_per_req": round((cpu_b1 - cpu_b0) * 1e6 / requests, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def _measure(params: dict[str, Any]) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for rnd in range(params["rounds"]):
        for kind in params["backends"]:
            ip = _next_ip()
            backend = start_backend(kind, ip)
            try:
                targets: list[tuple[str, Proc | None]] = [("direct", None)]
                targets += [(v, None) for v in params["variants"]]
                for name, _ in targets:
                    router = None
                    if name != "direct":
                        flags, env = VARIANTS[name]
                        router = start_router(flags, env=env)
                    try:
                        url = (
                            f"http://{ip}:{backend.port}"
                            if router is None
                            else f"http://127.0.0.1:{router.port}"
                        )
                        headers = (
                            {}
                            if router is None
                            else {
                                "X-Sandbox-ID": "bench",
                                "X-Sandbox-Pod-IP": ip,
                                "X-Sandbox-Port": str(backend.port),
                            }
                        )
                        for c, body in itertools.product(params["concurrency"], params["bodies"]):
                            if kind == "runtime" and body != "empty":
                                continue
                            # Warm-up (keep-alive pools, allocator) outside the measurement.
                            wrk(url + "/", connections=c, duration=1, body="empty", headers=headers)
                            cell = _cell(
                                url,
                                c=c,
                                body=body,
                                duration=params["duration"],
                                headers=headers,
                                router=router,
                                backend=backend,
                            )
                            cell.update(round=rnd, backend=kind, target=name, concurrency=c, body=body)
                            log(
                                f"round {rnd} {kind:11} {name:12} c={c:<3} {body:5} {cell['rps']:8.0f} req/s "
                                f"p99 {cell['p99_ms']:6.1f} ms  router {cell['router_cpu_us_per_req']} us/req  "
                                f"load {cell['load_before']}"
                            )
                            cells.append(cell)
                    finally:
                        if router is not None:
                            router.stop()
            finally:
                backend.stop()
    return cells


async def _hold_streams(router_port: int, backend_ip: str, backend_port: int, n: int, seconds: float) -> int:
    request = (
        f"GET /hold/{seconds} HTTP/1.1\r\nHost: bench\r\nX-Sandbox-ID: bench\r\nX-Sandbox-Pod-IP: {backend_ip}\r\n"
        f"X-Sandbox-Port: {backend_port}\r\n\r\n"
    ).encode()

    async def one() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", router_port)
        try:
            writer.write(request)
            line = await reader.readline()
            return line.startswith(b"HTTP/1.1 200")
        finally:
            writer.close()

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    return sum(1 for r in results if r is True)


def _rss(params: dict[str, Any]) -> dict[str, Any]:
    ip = _next_ip()
    backend = start_backend("python-rest", ip)
    router = start_router([])
    try:
        idle = rss_kib(router.pid)
        hold = 8.0
        loop = asyncio.new_event_loop()
        task = loop.create_task(_hold_streams(router.port, ip, backend.port, params["streams"], hold))
        loop.run_until_complete(asyncio.sleep(hold / 2))
        during = rss_kib(router.pid)
        ok = loop.run_until_complete(task)
        loop.close()
        return {
            "streams": params["streams"],
            "completed": ok,
            "idle_mib": round(idle / 1024, 1),
            "open_mib": round(during / 1024, 1),
            "peak_mib": round(rss_kib(router.pid, "VmHWM") / 1024, 1),
        }
    finally:
        router.stop()
        backend.stop()


def summarize(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spread over rounds per (backend, target, concurrency, body)."""
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["backend"], cell["target"], cell["concurrency"], cell["body"]), []).append(
            cell
        )
    rows = []
    for (backend, target, c, body), runs in groups.items():

        def spread(key: str, runs: list[dict[str, Any]] = runs) -> dict[str, float]:
            values = [r[key] for r in runs if r[key] is not None]
            if not values:
                return {}
            return {"min": min(values), "median": statistics.median(values), "max": max(values)}

        rows.append(
            {
                "backend": backend,
                "target": target,
                "concurrency": c,
                "body": body,
                "runs": len(runs),
                "rps": spread("rps"),
                "p50_ms": spread("p50_ms"),
                "p95_ms": spread("p95_ms"),
                "p99_ms": spread("p99_ms"),
                "router_cpu_us_per_req": spread("router_cpu_us_per_req"),
                "errors": sum(sum(r["errors"].values()) for r in runs),
                "load": spread("load_before"),
            }
        )
    return rows


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {
        "rounds": args.rounds,
        "duration": args.duration,
        "concurrency": [int(x) for x in args.concurrency.split(",")],
        "bodies": args.bodies.split(","),
        "backends": args.backends.split(","),
        "variants": args.variants.split(","),
        "streams": args.streams,
    }
    if args.quick:
        params.update(rounds=1, duration=3.0, concurrency=[50], bodies=["empty"], streams=200)
    unknown = [v for v in params["variants"] if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    return params


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", default="10,50,200")
    parser.add_argument("--bodies", default="empty,4k")
    parser.add_argument("--backends", default="nginx,python-rest")
    parser.add_argument("--variants", default="uvloop,asyncio,workers2")
    parser.add_argument(
        "--streams", type=int, default=1000, help="open streams for the RSS measurement; 0 skips it"
    )
    parser.add_argument("--quick", action="store_true", help="one short round at c=50 (smoke test)")
    parser.add_argument("--no-report", action="store_true", help="do not rewrite docs/performance.md")
    args = parser.parse_args(argv)
    params = _params(args)
    with bench_lock():
        started = time.time()
        host = host_info()
        cells = _measure(params)
        rss = _rss(params) if params["streams"] else {}
        result = {
            "scenario": "router",
            "params": params,
            "host": host,
            "started": started,
            "elapsed_s": round(time.time() - started, 1),
            "summary": summarize(cells),
            "rss": rss,
            "cells": cells,
            "load_after": list(os.getloadavg()),
        }
    directory = None if not args.quick else ROOT / "benchmarks" / "results" / "tmp"
    path = write_result("router", result, directory=directory)
    log(f"wrote {path}")
    if not args.no_report and not args.quick:
        runs = sorted(path.parent.glob("router-*.json"))
        combined, names = report.combine([(p.name, json.loads(p.read_text())) for p in runs])
        report.update_doc(DOC, combined, names)
        log(f"updated {DOC}")
    return 0
