"""What a fill of standalone Sandboxes costs: every process's CPU until the last change is converted, and the size.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.standalone_fill [--sandboxes 2000]
        [--runs 1] [--unserve] [--tag T]

Same cluster and controller as the burst benchmark (`Tuning()` = the KWOK gate settings). Per run, on a fresh
cluster: `--sandboxes` bare Sandboxes (no template, no pool: what a user who creates Sandboxes directly does,
and what the soak's 5,000 standing Sandboxes are), 40 creates in flight, then until all are Ready and
kube-apiserver has sent no object through the conversion webhook for 6 s (with v1alpha1 served, every stored
change of a Sandbox is converted for the v1alpha1 watch cache, so the fill is over only when that is). Reports
the seconds to all Ready, CPU seconds by process over the whole fill, the conversions, and the bytes of one
Sandbox as a client reads it (compact JSON, with its managedFields). Compare controllers with
`AGENT_SANDBOX_CONTROLLER_SRC` (docs/devcluster.md), runs interleaved.
Writes `benchmarks/results/standalone-fill[-TAG]-<UTC>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from agent_sandbox.kube import SANDBOX, ServerError

from .cluster import Bench
from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .objects import is_ready
from .reliability.soak import apiserver_counts, create_sandboxes
from .result_files import write_result
from .tuning import Tuning

NAMESPACE = "standalone"


async def _conversions(bench: Bench) -> float:
    return apiserver_counts(await bench.scrape_apiserver()).get("conversions", 0.0)


async def _ready(bench: Bench) -> int:
    try:
        items = await bench.api.list(SANDBOX, namespace=NAMESPACE)
    except ServerError:  # 504 "Too large resource version": the watch cache is behind the fill; ask again
        return -1
    return sum(map(is_ready, items))


async def one_run(sandboxes: int, tuning: Tuning) -> dict[str, Any]:
    """One fill on a fresh cluster (see the module docstring)."""
    async with Bench.up("bench-standalone", tuning, extensions=False) as bench:
        await bench.ensure_namespace(NAMESPACE)
        await asyncio.sleep(5.0)
        cpu0, conv0, load0, t0 = (
            bench.cpu_seconds(),
            await _conversions(bench),
            os.getloadavg()[0],
            time.monotonic(),
        )
        await create_sandboxes(bench.api, NAMESPACE, sandboxes)
        while True:  # polled: the harness must not add a watch of its own to what it measures
            if await _ready(bench) >= sandboxes:
                break
            await asyncio.sleep(2.0)
        ready_s = time.monotonic() - t0
        last, quiet = await _conversions(bench), 0
        while quiet < 3:
            await asyncio.sleep(2.0)
            now = await _conversions(bench)
            quiet, last = (quiet + 1 if now == last else 0), now
        cpu1 = bench.cpu_seconds()
        (first,) = (await bench.api.list_page(SANDBOX, namespace=NAMESPACE, limit=1)).items
        raw = await bench.api.request(
            "GET", SANDBOX.path(NAMESPACE, first["metadata"]["name"]), query="showManagedFields=true"
        )
        run = {
            "sandboxes": sandboxes,
            "ready_s": round(ready_s, 1),
            "load1": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "conversions": int(last - conv0),
            "cpu_s": {
                n: round(v - cpu0.get(n, 0.0), 2) for n, v in sorted(cpu1.items(), key=lambda kv: -kv[1])
            },
            "sandbox_bytes": len(json.dumps(json.loads(raw), separators=(",", ":"))),
        }
    print(f"run: {json.dumps(run)}", flush=True)
    return run


async def run(args: argparse.Namespace) -> None:
    tuning = Tuning(serve_v1alpha1=not args.unserve)
    runs = [await one_run(args.sandboxes, tuning) for _ in range(args.runs)]
    report = {
        "scenario": "standalone_fill",
        "tag": args.tag,
        "controller_src": os.environ.get("AGENT_SANDBOX_CONTROLLER_SRC", ""),
        "host": host_info(),
        "runs": runs,
    }
    print(write_result(f"standalone-fill-{args.tag}" if args.tag else "standalone-fill", report))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.standalone_fill", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sandboxes", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1, help="fills, each on a fresh cluster")
    parser.add_argument("--unserve", action="store_true", help="v1alpha1 served: false on the four CRDs")
    parser.add_argument("--tag", default="")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
