"""Go SDK benchmark: time to first instruction of concurrent creates, with and without a client-side limit.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.go_sdk [--rounds 3] [--concurrent 20]

Brings up its own dev cluster (controller, router, local runner; torn down afterwards) with a warm pool of
runtime sandboxes and runs `clients/go/hack/ttfi` (built here with the Go toolchain): `--concurrent`
goroutines of one process each `CreateSandbox(pool)` and `Run("echo ttfi")` through the router; time to
first instruction = the create call -> the command's answer. Each round runs two settings, interleaved so both
see the same machine, the pool refilled and Ready before each batch:

* `sdk default`: the SDK's own default, no client-side rate limit (since this change);
* `client-go default`: `QPS 5, burst 10`, what an unset `rest.Config` gave before it.

Also the CPU each component used during a batch (`/proc`; the Go process's own CPU from its rusage).
Reported per round (p50/p99/max) and over rounds (min/median/max of the per-round p50 and p99), with the
machine's load average. Writes `benchmarks/results/go-sdk-<UTC time>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.router import router_url, start_router

from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .log import log
from .result_files import write_result_with_markdown
from .sdk import NAMESPACE, _apply_pool, _cpu_by_component, _wait_pool_ready
from .stats import summarize

GO_MODULE = Path(__file__).resolve().parent.parent / "clients" / "go"
SETTINGS = {"sdk default": (0.0, 0), "client-go default": (5.0, 10)}


def build(out_dir: Path) -> Path:
    """`go build` the ttfi program (the Go build cache makes repeats cheap)."""
    binary = out_dir / "ttfi"
    subprocess.run(["go", "build", "-o", str(binary), "./hack/ttfi"], cwd=GO_MODULE, check=True)
    return binary


def batch(binary: Path, cluster: DevCluster, router: str, n: int, qps: float, burst: int) -> dict[str, Any]:
    """One batch of `n` concurrent creates; the TTFI samples and the CPU (ms) each component spent."""
    argv = [
        str(binary),
        f"-kubeconfig={cluster.kubeconfig}",
        f"-router={router}",
        f"-namespace={NAMESPACE}",
        "-pool=pool",
        f"-concurrent={n}",
        f"-qps={qps}",
        f"-burst={burst}",
    ]
    cpu_before, children_before = _cpu_by_component(cluster), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"ttfi failed ({proc.returncode}): {proc.stderr.strip()}")
    cpu_after, children_after = _cpu_by_component(cluster), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {
        name: round((cpu_after[name] - cpu_before.get(name, 0.0)) * 1000)
        for name in cpu_after
        if name != "sdk (this process)"
    }
    cpu["go sdk (ttfi process)"] = round(
        (
            children_after.ru_utime
            + children_after.ru_stime
            - children_before.ru_utime
            - children_before.ru_stime
        )
        * 1000
    )
    return {
        "ttfi_ms": json.loads(proc.stdout)["ttfi_ms"],
        "batch_wall_ms": round(wall * 1000),
        "cpu_ms": {name: ms for name, ms in sorted(cpu.items(), key=lambda kv: -kv[1]) if ms > 0},
    }


def run(rounds: int, n: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-go-sdk-"))
    binary = build(work)
    cluster = DevCluster.up(ClusterConfig(name=f"bench-go-sdk-{os.getpid()}", nodes=2))
    results: list[dict[str, Any]] = []
    try:
        start_controller(cluster)
        start_router(cluster)
        router = router_url(cluster)
        assert router is not None
        pool_size = max(n, 10)
        _apply_pool(cluster, pool_size)
        for i in range(rounds):
            row: dict[str, Any] = {"load_before": os.getloadavg()}
            for setting, (qps, burst) in SETTINGS.items():
                log(f"round {i + 1}/{rounds}: {setting}")
                _wait_pool_ready(cluster, pool_size)
                time.sleep(2)  # the refill's own writes settle, as a user's next batch would find it
                got = batch(binary, cluster, router, n, qps, burst)
                row[setting] = {**got, "ttfi": summarize(got["ttfi_ms"])}
            row["load_after"] = os.getloadavg()
            results.append(row)
    finally:
        cluster.down(quiet=True)
    over = {
        setting: {
            q: {
                "min": min(r[setting]["ttfi"][q] for r in results),
                "median": statistics.median(r[setting]["ttfi"][q] for r in results),
                "max": max(r[setting]["ttfi"][q] for r in results),
            }
            for q in ("p50", "p99")
        }
        for setting in SETTINGS
    }
    report: dict[str, Any] = {
        "scenario": "go-sdk",
        "host": host_info(),
        "params": {"rounds": rounds, "concurrent": n, "pool": max(n, 10), "settings": SETTINGS},
        "rounds": results,
        "over_rounds": over,
    }
    report["markdown"] = _markdown(report)
    return report


def _markdown(report: dict[str, Any]) -> str:
    n = report["params"]["concurrent"]
    lines = [
        f"Go SDK: time to first instruction (ms) of {n} concurrent `CreateSandbox` + `Run` from one process, warm"
        " pool, through the router; settings interleaved round by round.",
        "",
        "| Kubernetes client limit | p50 over rounds (min / median / max) | p99 over rounds (min / median / max) |",
        "|---|---|---|",
    ]
    for setting, (qps, burst) in report["params"]["settings"].items():
        s = report["over_rounds"][setting]
        cells = [" / ".join(f"{s[q][k]:.0f}" for k in ("min", "median", "max")) for q in ("p50", "p99")]
        limit = "none" if not qps else f"QPS {qps:g}, burst {burst}"
        lines.append(f"| {setting} ({limit}) | {cells[0]} | {cells[1]} |")
    lines += ["", "Per round: ttfi p50/p99/max (ms), batch wall, CPU ms per component, load average", ""]
    for i, r in enumerate(report["rounds"], 1):
        for setting in report["params"]["settings"]:
            b = r[setting]
            t = b["ttfi"]
            cpu = ", ".join(f"{name} {ms}" for name, ms in b["cpu_ms"].items())
            lines.append(
                f"- round {i} {setting}: {t['p50']:.0f}/{t['p99']:.0f}/{t['max']:.0f}, batch {b['batch_wall_ms']} ms;"
                f" CPU: {cpu}; load {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=20)
    args = parser.parse_args()
    report = run(args.rounds, args.concurrent)
    path = write_result_with_markdown("go-sdk", report)
    print(report["markdown"])
    print(f"\nwritten {path}")


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
