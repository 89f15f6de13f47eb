"""Runtime server benchmark: command latency/throughput on both protocols, file transfer speed and memory.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.runtime [--rounds 3] [--requests 300]

Starts `agent-sandbox-runtime` as its own process on a private loopback address (so the load generator in
this process does not share the server's event loop), then, `--rounds` times:

* `POST /execute {"command":"true"}` (legacy HTTP) and gRPC `Execute(["true"])`: `--requests` calls at
  concurrency 1, 10 and 50; per-call latency p50/p99 and calls/s;
* upload and download of 1 MB and 100 MB files: legacy multipart `POST /upload` and `GET /download`,
  sandboxd `PUT` / `GET /v1/files`; MB/s, and the server's peak RSS during each transfer (VmHWM, reset
  through /proc/<pid>/clear_refs before it) next to its RSS before, so "streamed, not buffered" is visible.

Every figure is reported as min/median/max over the rounds, with the machine's load average before and
after. Writes `benchmarks/results/runtime-<UTC time>.json` and `.md`. Both processes share this machine's
2 cores (the client's CPU competes with the server's), as a router or SDK next to a sandbox would.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from grpc import aio

from agent_sandbox.api import processv1 as pb

from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .result_files import write_result_with_markdown

CONCURRENCY = (1, 10, 50)
SIZES = {"1MB": 1 << 20, "100MB": 100 << 20}


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def _free_ports(host: str, count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
    }


class Server:
    """`agent-sandbox-runtime` in its own process on 127.251.x.y."""

    def __init__(self, root: Path) -> None:
        self.host = f"127.251.{random.randint(0, 255)}.{random.randint(2, 254)}"
        self.legacy, self.rest, self.grpc = _free_ports(self.host, 3)
        exe = Path(sys.executable).with_name("agent-sandbox-runtime")
        argv = [str(exe), f"--listen-host={self.host}", f"--root-dir={root}", f"--legacy-port={self.legacy}"]
        argv += [f"--rest-port={self.rest}", f"--grpc-port={self.grpc}", "--max-upload-bytes=1073741824"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def wait(self) -> None:
        async with aiohttp.ClientSession() as s:
            for _ in range(300):
                try:
                    async with s.get(f"http://{self.host}:{self.rest}/v1/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
        raise RuntimeError("runtime did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)


async def _load(call: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            t0 = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"p50_ms": _pct(latencies, 0.5), "p99_ms": _pct(latencies, 0.99), "per_s": requests / wall}


async def bench_commands(server: Server, requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    connector = aiohttp.TCPConnector(limit=100)
    async with aiohttp.ClientSession(connector=connector) as http:
        body = b'{"command": "true"}'

        async def legacy() -> None:
            async with http.post(f"http://{server.host}:{server.legacy}/execute", data=body) as r:
                assert (await r.json())["exit_code"] == 0

        for c in CONCURRENCY:
            await _load(legacy, min(20, requests), c)  # warm-up (connections, code paths)
            out[f"legacy_execute_c{c}"] = await _load(legacy, requests, c)
    async with aio.insecure_channel(f"{server.host}:{server.grpc}") as channel:
        path, req_t, resp_t, _ = pb.METHODS["Execute"]
        execute = channel.unary_unary(
            path, request_serializer=req_t.SerializeToString, response_deserializer=resp_t.FromString
        )
        request = pb.ExecuteRequest(config=pb.ProcessConfig(command=["true"]))

        async def grpc_execute() -> None:
            resp = await execute(request, timeout=60)
            assert resp.exit_code == 0

        for c in CONCURRENCY:
            await _load(grpc_execute, min(20, requests), c)
            out[f"grpc_execute_c{c}"] = await _load(grpc_execute, requests, c)
    return out


async def bench_transfers(server: Server, scratch: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pid = server.proc.pid
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for label, size in SIZES.items():
            src = scratch / f"src-{label}"
            if not src.exists():
                with src.open("wb") as f:
                    f.write(os.urandom(size))
            for kind in ("legacy_upload", "rest_put", "legacy_download", "rest_get"):
                rss_before = _status_kb(pid, "VmRSS")
                _reset_peak(pid)
                t0 = time.perf_counter()
                if kind == "legacy_upload":
                    with src.open("rb") as f:
                        form = aiohttp.FormData(quote_fields=False)
                        form.add_field("file", f, filename=f"up/{label}.bin")
                        async with http.post(f"http://{server.host}:{server.legacy}/upload", data=form) as r:
                            assert r.status == 200, await r.text()
                elif kind == "rest_put":
                    with src.open("rb") as f:
                        async with http.put(
                            f"http://{server.host}:{server.rest}/v1/files/put/{label}.bin", data=f
                        ) as r:
                            assert r.status == 204, await r.text()
                else:
                    url = (
                        f"http://{server.host}:{server.legacy}/download/up%2F{label}.bin"
                        if kind == "legacy_download"
                        else f"http://{server.host}:{server.rest}/v1/files/put/{label}.bin"
                    )
                    got = 0
                    async with http.get(url) as r:
                        assert r.status == 200
                        async for chunk in r.content.iter_chunked(1 << 16):
                            got += len(chunk)
                    assert got == size
                wall = time.perf_counter() - t0
                out[f"{kind}_{label}"] = {
                    "mb_per_s": size / 2**20 / wall,
                    "server_rss_before_mib": rss_before / 1024,
                    "server_peak_rss_mib": _status_kb(pid, "VmHWM") / 1024,
                }
    return out


def _summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name in rounds[0]:
        summary[name] = {metric: _spread([r[name][metric] for r in rounds]) for metric in rounds[0][name]}
    return summary


def _markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    def cell(d: dict[str, float]) -> str:
        return f"{d['median']:g} ({d['min']:g}-{d['max']:g})"

    lines = [
        f"Runtime benchmark, {meta['rounds']} rounds x {meta['requests']} calls; median (min-max) over rounds; "
        f"load {meta['load_before']} -> {meta['load_after']} (1/5/15 min).",
        "",
        "| call | concurrency | p50 ms | p99 ms | calls/s |",
        "|---|---|---|---|---|",
    ]
    for proto in ("legacy_execute", "grpc_execute"):
        for c in CONCURRENCY:
            row = summary[f"{proto}_c{c}"]
            label = "`POST /execute true`" if proto == "legacy_execute" else "gRPC `Execute([true])`"
            lines.append(
                f"| {label} | {c} | {cell(row['p50_ms'])} | {cell(row['p99_ms'])} | {cell(row['per_s'])} |"
            )
    lines += [
        "",
        "| transfer | size | MB/s | server RSS before (MiB) | server peak RSS during (MiB) |",
        "|---|---|---|---|---|",
    ]
    names = {
        "legacy_upload": "legacy `POST /upload`",
        "rest_put": "sandboxd `PUT /v1/files`",
        "legacy_download": "legacy `GET /download`",
        "rest_get": "sandboxd `GET /v1/files`",
    }
    for kind, label in names.items():
        for size in SIZES:
            row = summary[f"{kind}_{size}"]
            lines.append(
                f"| {label} | {size} | {cell(row['mb_per_s'])} | {cell(row['server_rss_before_mib'])} | "
                f"{cell(row['server_peak_rss_mib'])} |"
            )
    return "\n".join(lines)


async def run(rounds: int, requests: int) -> dict[str, Any]:
    load_before = [round(x, 2) for x in os.getloadavg()]
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        for i in range(rounds):
            server = Server(Path(tmp) / f"root{i}")
            try:
                await server.wait()
                one = await bench_commands(server, requests)
                one.update(await bench_transfers(server, scratch))
            finally:
                server.stop()
            results.append(one)
            print(f"round {i + 1}/{rounds} done", file=sys.stderr, flush=True)
    meta = {
        "rounds": rounds,
        "requests": requests,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    summary = _summarise(results)
    return {
        "scenario": "runtime",
        "meta": meta,
        "host": host_info(),
        "summary": summary,
        "rounds": results,
        "markdown": _markdown(summary, meta),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300, help="calls per concurrency level and protocol")
    args = parser.parse_args()
    report = asyncio.run(run(args.rounds, args.requests))
    path = write_result_with_markdown("runtime", report)
    print(report["markdown"])
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
