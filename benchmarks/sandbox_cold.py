"""Cold-start benchmark of the Sandbox controller: N Sandboxes created at once -> all Ready.

    .venv/bin/python -m benchmarks.sandbox_cold [--count 1000] [--nodes 20] [--workers 100] [--keep]

Brings up a dedicated dev cluster (`bench-sandbox-cold`, N kwok nodes, raised kube-apiserver in-flight
limits), installs the CRDs, starts the real `agent-sandbox-controller` process (Sandbox controller only,
default flags otherwise), then creates `--count` minimal Sandboxes concurrently and watches them until every
one reports Ready=True. Reported:

* wall time from the first create request to the last Ready (and to the first Ready), p50/p90/p99 of the
  per-Sandbox latency (client create sent -> Ready seen on the watch);
* controller CPU seconds (utime+stime from /proc, during the run only) and peak RSS (VmHWM);
* API requests the controller made during the run, by verb (its `rest_client_requests_total`);
* a per-stage breakdown from server timestamps (controller vs. scheduler vs. kwok), and the host's load
  average, because on a small shared machine the API server, not the controller, is usually the limit.

Writes `benchmarks/results/sandbox_cold-<UTC time>.json` and `.md`, and prints the markdown table. Not part of `make test`:
it takes about a minute and its numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.kube import NAMESPACE, POD, SANDBOX, ApiClient, Object

from .interrupt import stop_cleanly_on_sigterm

RESULTS = Path(__file__).resolve().parent / "results"
_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _requests_by_verb(metrics_port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("rest_client_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            method = labels.split('method="', 1)[1].split('"', 1)[0]
            code = labels.split('code="', 1)[1].split('"', 1)[0]
            # Failed requests (timeouts: code "<error>", or non-2xx answers) are counted apart.
            key = method if code.startswith("2") else f"{method} failed ({code})"
            out[key] = out.get(key, 0.0) + float(value)
    return out


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def _transition(obj: Object, type_: str) -> float:
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == type_:
            return _ts(c["lastTransitionTime"])
    raise KeyError(type_)


async def _stages(kube: ApiClient, namespace: str) -> dict[str, dict[str, float]]:
    """Where the time went, from server timestamps (1 s resolution): controller vs. scheduler/kwok.

    * `sandbox_to_pod`: Sandbox created -> its Pod created (controller: queueing + create);
    * `pod_to_scheduled`: scheduler; `scheduled_to_pod_ready`: kwok (the fake kubelet);
    * `pod_ready_to_sandbox_ready`: controller (watch event -> status write).
    """
    sandboxes = {s["metadata"]["name"]: s for s in await kube.list(SANDBOX, namespace=namespace)}
    pods = {p["metadata"]["name"]: p for p in await kube.list(POD, namespace=namespace)}
    spans: dict[str, list[float]] = {
        k: []
        for k in (
            "sandbox_to_pod",
            "pod_to_scheduled",
            "scheduled_to_pod_ready",
            "pod_ready_to_sandbox_ready",
        )
    }
    for name, sb in sandboxes.items():
        pod = pods[name]
        created, pod_created = (
            _ts(sb["metadata"]["creationTimestamp"]),
            _ts(pod["metadata"]["creationTimestamp"]),
        )
        scheduled, pod_ready = _transition(pod, "PodScheduled"), _transition(pod, "Ready")
        spans["sandbox_to_pod"].append(pod_created - created)
        spans["pod_to_scheduled"].append(scheduled - pod_created)
        spans["scheduled_to_pod_ready"].append(pod_ready - scheduled)
        spans["pod_ready_to_sandbox_ready"].append(_transition(sb, "Ready") - pod_ready)
    out = {}
    for key, values in spans.items():
        values.sort()
        out[key] = {"p50": values[len(values) // 2], "p90": values[int(len(values) * 0.9)], "max": values[-1]}
    return out


def _manifest(name: str) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
    }


def _ready(obj: Object) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


async def _run(
    cluster: DevCluster, pid: int, metrics_port: int, count: int, namespace: str
) -> dict[str, Any]:
    kube = await ApiClient.from_kubeconfig(str(cluster.kubeconfig), connections=4)
    async with kube:
        await kube.create(
            NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        page = await kube.list_page(SANDBOX, namespace=namespace)
        names = [f"sb-{i:05d}" for i in range(count)]
        sent: dict[str, float] = {}
        ready_at: dict[str, float] = {}
        all_ready = asyncio.Event()

        async def watch() -> None:
            rv = page.resource_version
            while not all_ready.is_set():
                async for event in kube.watch(
                    SANDBOX, namespace=namespace, resource_version=rv, timeout_seconds=300
                ):
                    rv = event.object.get("metadata", {}).get("resourceVersion") or rv
                    name = event.object.get("metadata", {}).get("name")
                    if event.type != "BOOKMARK" and name and name not in ready_at and _ready(event.object):
                        ready_at[name] = time.perf_counter()
                        if len(ready_at) == count:
                            all_ready.set()
                            return

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)  # let the watch open before the burst
        cpu0, req0 = _cpu_seconds(pid), _requests_by_verb(metrics_port)
        rss0 = _status_kb(pid, "VmRSS")
        sem = asyncio.Semaphore(200)

        async def create(name: str) -> None:
            async with sem:
                sent[name] = time.perf_counter()
                await kube.create(SANDBOX, _manifest(name), namespace=namespace)

        t0 = time.perf_counter()
        await asyncio.gather(*(create(n) for n in names))
        created = time.perf_counter() - t0
        await asyncio.wait_for(all_ready.wait(), timeout=600)
        total = time.perf_counter() - t0
        await asyncio.sleep(2.0)  # let trailing reconciles (status echoes) finish before reading CPU
        cpu = _cpu_seconds(pid) - cpu0
        req1 = _requests_by_verb(metrics_port)
        watcher.cancel()
        stages = await _stages(kube, namespace)
        latencies = sorted(ready_at[n] - sent[n] for n in names)
        q = statistics.quantiles(latencies, n=100)
        return {
            "count": count,
            "create_requests_s": round(created, 3),
            "all_ready_s": round(total, 3),
            "first_ready_s": round(min(ready_at.values()) - t0, 3),
            "latency_p50_s": round(q[49], 3),
            "latency_p90_s": round(q[89], 3),
            "latency_p99_s": round(q[98], 3),
            "controller_cpu_s": round(cpu, 2),
            "controller_rss_before_mib": round(rss0 / 1024, 1),
            "controller_peak_rss_mib": round(_status_kb(pid, "VmHWM") / 1024, 1),
            "controller_requests": {k: req1.get(k, 0.0) - req0.get(k, 0.0) for k in sorted(req1)},
            "stages_s": stages,
        }


def _markdown(result: dict[str, Any]) -> str:
    cfg, r = result["config"], result["result"]
    reqs = ", ".join(f"{k} {int(v)}" for k, v in r["controller_requests"].items() if v)
    rows = [
        ("Sandboxes", f"{r['count']} (on {cfg['nodes']} kwok nodes, {cfg['workers']} workers)"),
        ("create requests sent in", f"{r['create_requests_s']} s"),
        ("first Ready after", f"{r['first_ready_s']} s"),
        ("all Ready after", f"**{r['all_ready_s']} s**"),
        (
            "per-Sandbox latency p50 / p90 / p99",
            f"{r['latency_p50_s']} / {r['latency_p90_s']} / {r['latency_p99_s']} s",
        ),
        ("controller CPU during the run", f"{r['controller_cpu_s']} s"),
        (
            "controller RSS before / peak",
            f"{r['controller_rss_before_mib']} / {r['controller_peak_rss_mib']} MiB",
        ),
        ("controller API requests", reqs),
        *(
            (f"stage `{k}` p50 / p90 / max", f"{v['p50']:.0f} / {v['p90']:.0f} / {v['max']:.0f} s")
            for k, v in r["stages_s"].items()
        ),
        (
            "host load average (1 min) before / after",
            f"{result['load'][0]} / {result['load'][1]} on {result['host']['cpus']} CPUs",
        ),
    ]
    lines = ["| metric | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--name", default="bench-sandbox-cold")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    # Instant pod start (kwok's pod-ready without delay), as in upstream's KWOK gate: the controller is measured.
    config = ClusterConfig(
        name=args.name,
        nodes=args.nodes,
        max_requests_inflight=3000,
        max_mutating_requests_inflight=1500,
        pod_start_delay_ms=0,
        pod_start_jitter_ms=0,
    )
    cluster = DevCluster.up(config)
    try:
        started = start_controller(
            cluster,
            extensions=False,
            extra=(f"--sandbox-concurrent-workers={args.workers}", "--enable-webhook=false"),
        )
        metrics_port = cluster.state.extra_ports["controller_metrics"]
        result = asyncio.run(_run(cluster, started.pid, metrics_port, args.count, "bench"))
    finally:
        if not args.keep:
            cluster.down(quiet=True)
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    report: dict[str, Any] = {
        "benchmark": "sandbox_cold",
        "when": when,
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "config": {
            "nodes": args.nodes,
            "workers": args.workers,
            "max_requests_inflight": config.max_requests_inflight,
            "max_mutating_requests_inflight": config.max_mutating_requests_inflight,
        },
        "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "result": result,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"sandbox_cold-{when.replace(':', '')}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    table = _markdown(report)
    path.with_suffix(".md").write_text(f"# sandbox_cold {when}\n\n{table}\n")
    print(table)
    print(f"\n(written to {path})")


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
