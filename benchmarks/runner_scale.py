"""Local runner at scale: memory per idle runtime pod, and time until N runtime pods are Ready.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.runner_scale [--pods 1000] [--rounds 2]

Per round, on a fresh dev cluster (`bench-runner-scale`, runner on, so each round starts from a runner that
never held a runtime pod): creates `--pods` bare pods opted in with `devcluster.agents.x-k8s.io/runtime:
"true"` (no controller: the runner's cost alone), waits until every one is Ready (Ready means its runtime
answered its health check on the pod IP), lets the runner settle and reads its RSS (VmRSS). Reported per
round: (RSS with N pods - RSS before any) / N, the runner's total RSS, time from the first create to the last
Ready, runner CPU seconds, and a command run through one random pod IP (proof the runtimes are live); then
the pods are deleted and the runner's RSS afterwards is recorded (Python keeps freed memory for reuse).
Writes `benchmarks/results/runner_scale-<UTC>.json` and `.md`; spread over rounds is min/median/max.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.runtime_pods import RUNTIME_ANNOTATION
from agent_sandbox.kube import NAMESPACE, POD, ApiClient

from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .result_files import write_result_with_markdown

_TICKS = os.sysconf("SC_CLK_TCK")
NS = "runner-scale"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"rt-{i:04d}", "annotations": {RUNTIME_ANNOTATION: "true"}},
        "spec": {"containers": [{"name": "runtime", "image": "busybox"}], "terminationGracePeriodSeconds": 0},
    }


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or ()
    )


async def _ready_count(kube: ApiClient) -> tuple[int, list[str]]:
    pods = await kube.list(POD, namespace=NS)
    ready = [p for p in pods if _ready(p)]
    return len(ready), [p["status"]["podIP"] for p in ready]


async def _settle(pid: int, seconds: float = 5.0) -> float:
    await asyncio.sleep(seconds)
    return _rss_mib(pid)


async def one_round(cluster: DevCluster, kube: ApiClient, pods: int, runner_pid: int) -> dict[str, Any]:
    baseline = await _settle(runner_pid)
    cpu0 = _cpu_s(runner_pid)
    sem = asyncio.Semaphore(50)

    async def create(i: int) -> None:
        async with sem:
            await kube.create(POD, _pod(i), namespace=NS)

    t0 = time.monotonic()
    await asyncio.gather(*(create(i) for i in range(pods)))
    created = time.monotonic() - t0
    while True:
        count, ips = await _ready_count(kube)
        if count >= pods:
            break
        if time.monotonic() - t0 > 900:
            raise RuntimeError(f"only {count}/{pods} runtime pods Ready after 900 s")
        await asyncio.sleep(1)
    all_ready = time.monotonic() - t0
    loaded = await _settle(runner_pid, 10.0)
    ip = random.choice(ips)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{ip}:8888/execute", json={"command": "echo live"}) as r,
    ):
        live = (await r.json())["stdout"] == "live\n"
    cpu = _cpu_s(runner_pid) - cpu0
    runtimes = len(cluster.runtimes())

    async def delete(name: str) -> None:
        async with sem:
            await kube.delete(POD, name, namespace=NS, grace_period_seconds=0)

    await asyncio.gather(*(delete(p["metadata"]["name"]) for p in await kube.list(POD, namespace=NS)))
    for _ in range(900):  # bounded: pods gone and every runtime retired
        if not (await kube.list(POD, namespace=NS)) and not cluster.runtimes():
            break
        await asyncio.sleep(1)
    after = await _settle(runner_pid)
    return {
        "pods": pods,
        "runtimes_reported": runtimes,
        "runner_rss_baseline_mib": round(baseline, 1),
        "runner_rss_loaded_mib": round(loaded, 1),
        "runner_rss_after_delete_mib": round(after, 1),
        "kib_per_idle_runtime_pod": round((loaded - baseline) * 1024 / pods, 1),
        "create_s": round(created, 1),
        "all_ready_s": round(all_ready, 1),
        "runner_cpu_s": round(cpu, 1),
        "command_through_random_pod_ip": live,
    }


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):g} ({min(values):g}-{max(values):g})"


async def _fresh_round(pods: int) -> dict[str, Any]:
    """One round on a fresh cluster, so every round starts from a runner that never held a runtime pod."""
    config = ClusterConfig(name="bench-runner-scale", nodes=1, node_pods=max(1100, pods + 100))
    cluster = DevCluster.up(config)
    try:
        runner_pid = next(s.pid for s in cluster.state.started if s.name == "runner")
        kube = await ApiClient.from_kubeconfig(str(cluster.kubeconfig), qps=-1.0, burst=200)
        try:
            await kube.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            await asyncio.sleep(2)  # the namespace's default ServiceAccount
            return await one_round(cluster, kube, pods, runner_pid)
        finally:
            await kube.close()
    finally:
        cluster.down(quiet=True)


async def run(pods: int, rounds: int) -> dict[str, Any]:
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = []
    for i in range(rounds):
        results.append(await _fresh_round(pods))
        print(f"round {i + 1}/{rounds}: {results[-1]}", file=sys.stderr, flush=True)
    meta = {
        "pods": pods,
        "rounds": rounds,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    keys = (
        "kib_per_idle_runtime_pod",
        "runner_rss_baseline_mib",
        "runner_rss_loaded_mib",
        "runner_rss_after_delete_mib",
        "all_ready_s",
        "runner_cpu_s",
    )
    summary = {
        k: {
            "min": min(r[k] for r in results),
            "median": statistics.median(r[k] for r in results),
            "max": max(r[k] for r in results),
        }
        for k in keys
    }
    md = [
        f"Local runner with {pods} idle runtime pods, {rounds} rounds, median (min-max); load {meta['load_before']} -> {meta['load_after']}.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    md += [f"| {k} | {_spread([r[k] for r in results])} |" for k in keys]
    md.append(
        f"| command through a random pod IP | {all(r['command_through_random_pod_ip'] for r in results)} |"
    )
    return {
        "scenario": "runner_scale",
        "meta": meta,
        "host": host_info(),
        "summary": summary,
        "rounds": results,
        "markdown": "\n".join(md),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    report = asyncio.run(run(args.pods, args.rounds))
    path = write_result_with_markdown("runner_scale", report)
    print(report["markdown"])
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
