"""SDK benchmark: time to first instruction from a warm pool through the router.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.sdk [--rounds 3] [--sequential 100] [--concurrent 20]

Brings up its own dev cluster (controller, router, local runner; torn down afterwards) with a warm pool of
runtime sandboxes, and measures what a user of the Python SDK sees:

* **time to first instruction** = `create_sandbox(pool)` called -> the first command's output received
  (`commands.run("echo ready")` through the router), split into `create` (claim POST -> bound and Ready,
  watched) and `first command`;
* `--sequential` creates one after the other (sync `SandboxClient`), then `--concurrent` creates at once
  (`AsyncSandboxClient`, one client, `asyncio.gather`) — `--rounds` times each, the pool refilled and
  Ready before each batch, claims deleted after.

Reported per round (p50/p99/max) and over rounds (min/median/max of the per-round p50 and p99), with the
machine's load average before and after each round. Writes `benchmarks/results/sdk-<UTC time>.json` and `.md`.
Target (issue 15): p50 <= 100 ms, p99 <= 250 ms.

Where a concurrent create's time goes (per claim, from the claim's own wall-clock stamps, all on this host):
`to_post` = `create_sandbox` called -> the SDK stamps `client-first-requested-at` just before its POST;
`to_observed` -> the controller's `controller-first-observed-at`; `to_ready` -> its `claim-first-ready-at`
(when it decided the claim Ready); `to_sdk` -> `create_sandbox` returned (the Ready event delivered by the
API server's watch and parsed); then `first_command`. And the CPU each component used during the batch
(`/proc`, this process = the SDK): on 2 shared cores the concurrent batch is CPU-bound, so this says who
spends it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import agent_sandbox_sdk
from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.router import router_url, start_router
from agent_sandbox.kube import ApiClient
from agent_sandbox_sdk import AsyncSandboxClient, SandboxClient, SandboxDirectConnectionConfig

from .cluster import unserve_v1alpha1
from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .log import log
from .objects import parse_rfc3339
from .proc_sampling import process_cpu_seconds
from .result_files import write_result_with_markdown
from .stats import summarize

EXT = "extensions.agents.x-k8s.io/v1beta1"
REQUESTED = "agents.x-k8s.io/client-first-requested-at"
OBSERVED = "agents.x-k8s.io/controller-first-observed-at"
FIRST_READY = "agents.x-k8s.io/claim-first-ready-at"
PHASES = ("to_post", "to_observed", "to_ready", "to_sdk", "first_command")
RUNTIME_IMAGE = "ghcr.io/agent-sandbox/agent-sandbox-runtime:dev"
NAMESPACE = "bench"


def _apply_pool(cluster: DevCluster, replicas: int) -> None:
    admin = cluster.admin()
    admin.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "rt"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}}},
    }
    pool = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "pool"},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": "rt"}},
    }
    for plural, body in (("sandboxtemplates", template), ("sandboxwarmpools", pool)):
        deadline = time.monotonic() + 60
        while True:
            status, out = admin.request("POST", f"/apis/{EXT}/namespaces/{NAMESPACE}/{plural}", body)
            if status in (201, 409):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"creating {plural}: HTTP {status}: {out}")
            time.sleep(0.5)


def _wait_pool_ready(cluster: DevCluster, replicas: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    path = f"/apis/{EXT}/namespaces/{NAMESPACE}/sandboxwarmpools/pool"
    while True:
        status, body = cluster.admin().request("GET", path)
        ready = int(((body or {}).get("status") or {}).get("readyReplicas") or 0) if status == 200 else 0
        if ready >= replicas:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm pool not Ready: {ready}/{replicas} after {timeout:.0f} s")
        time.sleep(0.5)


def sequential(cluster: DevCluster, router: str, n: int) -> list[dict[str, float]]:
    """`n` creates one after the other; per sandbox: create, first command, total (ms)."""
    samples = []
    with SandboxClient(
        SandboxDirectConnectionConfig(api_url=router), kubeconfig=cluster.kubeconfig
    ) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            sandbox = client.create_sandbox("pool", NAMESPACE, sandbox_ready_timeout=120)
            t1 = time.perf_counter()
            assert sandbox.commands is not None
            out = sandbox.commands.run("echo ready")
            t2 = time.perf_counter()
            if out.stdout != "ready\n":
                raise RuntimeError(f"unexpected output {out!r}")
            samples.append(
                {"create": (t1 - t0) * 1000, "first_command": (t2 - t1) * 1000, "ttfi": (t2 - t0) * 1000}
            )
            sandbox.terminate()
    return samples


def _cpu_by_component(cluster: DevCluster) -> dict[str, float]:
    pids = {started.name: started.pid for started in cluster.state.started}
    pids["sdk (this process)"] = os.getpid()
    return {name: cpu for name, pid in pids.items() if (cpu := process_cpu_seconds(pid)) is not None}


def _claim_stamps(cluster: DevCluster, claim: str) -> dict[str, float | None]:
    status, body = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{NAMESPACE}/sandboxclaims/{claim}")
    ann = ((body or {}).get("metadata") or {}).get("annotations") or {} if status == 200 else {}
    return {key: parse_rfc3339(ann.get(key)) for key in (REQUESTED, OBSERVED, FIRST_READY)}


def _wait_first_ready(
    cluster: DevCluster, claims: list[str], timeout: float = 10.0
) -> dict[str, dict[str, float | None]]:
    deadline = time.monotonic() + timeout
    stamps = {claim: _claim_stamps(cluster, claim) for claim in claims}
    while time.monotonic() < deadline and (late := [c for c, s in stamps.items() if s[FIRST_READY] is None]):
        time.sleep(0.2)
        stamps.update({claim: _claim_stamps(cluster, claim) for claim in late})
    return stamps


def _phases(t0: float, t1: float, stamps: dict[str, float | None]) -> dict[str, float] | None:
    """Consecutive phases of one create (ms), or None when a stamp is missing."""
    points = [t0, stamps[REQUESTED], stamps[OBSERVED], stamps[FIRST_READY], t1]
    if any(p is None for p in points):
        return None
    times = [p for p in points if p is not None]
    return {name: (b - a) * 1000 for name, a, b in zip(PHASES, times, times[1:], strict=False)}


async def concurrent(
    cluster: DevCluster, router: str, n: int
) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """`n` creates at once from one async client; the samples, and where their time and CPU went."""
    config = SandboxDirectConnectionConfig(api_url=router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:

        async def one() -> tuple[dict[str, float], tuple[str, float, float]]:
            w0, t0 = time.time(), time.perf_counter()
            sandbox = await client.create_sandbox("pool", NAMESPACE, sandbox_ready_timeout=120)
            w1, t1 = time.time(), time.perf_counter()
            assert sandbox.commands is not None
            out = await sandbox.commands.run("echo ready")
            t2 = time.perf_counter()
            if out.stdout != "ready\n":
                raise RuntimeError(f"unexpected output {out!r}")
            sample = {"create": (t1 - t0) * 1000, "first_command": (t2 - t1) * 1000, "ttfi": (t2 - t0) * 1000}
            return sample, (sandbox.claim_name or "", w0, w1)

        cpu_before, started = _cpu_by_component(cluster), time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - started
        cpu_after = _cpu_by_component(cluster)
        samples = [sample for sample, _ in results]
        # `claim-first-ready-at` is bookkeeping held while claims arrive (docs/design/claim-priority.md):
        # read the stamps once it is there, before the client's exit deletes the claims.
        stamps = _wait_first_ready(cluster, [claim for _, (claim, _, _) in results])
        phases = [
            {**split, "first_command": sample["first_command"]}
            for (sample, (claim, w0, w1)) in results
            if (split := _phases(w0, w1, stamps[claim])) is not None
        ]
    cpu = {name: round((cpu_after[name] - cpu_before.get(name, 0.0)) * 1000) for name in cpu_after}
    detail = {
        "phases_ms": {name: summarize([p[name] for p in phases]) for name in PHASES},
        "phases_count": len(phases),
        "batch_wall_ms": round(wall * 1000),
        "cpu_ms": {name: ms for name, ms in sorted(cpu.items(), key=lambda kv: -kv[1]) if ms > 0},
    }
    return samples, detail


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    return {key: summarize([s[key] for s in samples]) for key in ("ttfi", "create", "first_command")}


def _over_rounds(rounds: list[dict[str, Any]], batch: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for q in ("p50", "p99"):
        values = [r[batch]["ttfi"][q] for r in rounds]
        out[q] = {"min": min(values), "median": statistics.median(values), "max": max(values)}
    return out


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "Time to first instruction (ms) = `create_sandbox` -> first command output, warm pool, through the router.",
        f"Machine: {report['host'].get('cpus')} CPUs; load average before/after each round in the JSON.",
        (
            "controller flags: " + " ".join(report["params"]["controller_args"]) + "; "
            if report["params"].get("controller_args")
            else ""
        )
        + "v1alpha1 "
        + (
            "served (default install)"
            if report["params"].get("serve_v1alpha1", True)
            else "unserved (v1beta1-only)"
        ),
        "",
        "| batch | p50 over rounds (min / median / max) | p99 over rounds (min / median / max) | target |",
        "|---|---|---|---|",
    ]
    for batch in ("sequential", "concurrent"):
        s = report["over_rounds"][batch]
        cell = " / ".join(f"{s[q][k]:.0f}" for q in ("p50",) for k in ("min", "median", "max"))
        cell99 = " / ".join(f"{s['p99'][k]:.0f}" for k in ("min", "median", "max"))
        lines.append(
            f"| {batch} ({report['params'][batch]} creates) | {cell} | {cell99} | p50 <= 100, p99 <= 250 |"
        )
    lines += [
        "",
        "Per round (ms): ttfi p50/p99/max, create p50, first command p50, load average before -> after",
        "",
    ]
    for i, r in enumerate(report["rounds"], 1):
        for batch in ("sequential", "concurrent"):
            t, c, f = r[batch]["ttfi"], r[batch]["create"], r[batch]["first_command"]
            lines.append(
                f"- round {i} {batch}: {t['p50']:.0f}/{t['p99']:.0f}/{t['max']:.0f}, create {c['p50']:.0f}, "
                f"first command {f['p50']:.0f}, load {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}"
            )
    lines += [
        "",
        "Concurrent creates, where the time goes (ms, p50 / max over the batch's claims): create_sandbox called"
        " -> POST sent (`to_post`) -> controller first observed (`to_observed`) -> controller decided Ready"
        " (`to_ready`) -> create_sandbox returned (`to_sdk`) -> `first_command`; CPU ms per component during"
        " the batch (2 cores = 2000 ms of CPU per second of wall time)",
        "",
    ]
    for i, r in enumerate(report["rounds"], 1):
        d = r["concurrent_detail"]
        split = ", ".join(
            f"{name} {d['phases_ms'][name]['p50']:.0f}/{d['phases_ms'][name]['max']:.0f}"
            for name in PHASES
            if d["phases_ms"][name]["count"]
        )
        cpu = ", ".join(f"{name} {ms}" for name, ms in d["cpu_ms"].items())
        lines.append(f"- round {i}: {split}; batch {d['batch_wall_ms']} ms wall, CPU: {cpu}")
    return "\n".join(lines)


async def _unserve(cluster: DevCluster) -> None:
    api = await ApiClient.from_kubeconfig(str(cluster.kubeconfig))
    try:
        await unserve_v1alpha1(api)
    finally:
        await api.close()


def run(
    rounds: int,
    n_seq: int,
    n_conc: int,
    *,
    serve_v1alpha1: bool = True,
    controller_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    name = f"bench-sdk-{os.getpid()}"
    cluster = DevCluster.up(ClusterConfig(name=name, nodes=2))
    try:
        start_controller(cluster, extra=controller_args)
        if not serve_v1alpha1:  # as `k8s/v1beta1-only`: no conversions for a v1alpha1 watch cache
            asyncio.run(_unserve(cluster))
        start_router(cluster)
        router = router_url(cluster)
        assert router is not None
        pool_size = max(n_conc, 10)
        _apply_pool(cluster, pool_size)
        results = []
        for i in range(rounds):
            log(f"round {i + 1}/{rounds}")
            load_before = os.getloadavg()
            _wait_pool_ready(cluster, pool_size)
            seq: list[dict[str, float]] = []
            while len(seq) < n_seq:  # in chunks the pool can serve warm
                seq += sequential(cluster, router, min(pool_size, n_seq - len(seq)))
                _wait_pool_ready(cluster, pool_size)
            conc, detail = asyncio.run(concurrent(cluster, router, n_conc))
            results.append(
                {
                    "sequential": _summary(seq),
                    "concurrent": _summary(conc),
                    "concurrent_detail": detail,
                    "load_before": load_before,
                    "load_after": os.getloadavg(),
                }
            )
    finally:
        cluster.down(quiet=True)
    report: dict[str, Any] = {
        "scenario": "sdk",
        "host": host_info(),
        "params": {
            "rounds": rounds,
            "sequential": n_seq,
            "concurrent": n_conc,
            "pool": pool_size,
            "serve_v1alpha1": serve_v1alpha1,
            "controller_args": list(controller_args),
        },
        "sdk_module": agent_sandbox_sdk.__file__,  # which SDK ran (an A/B may put another first on the path)
        "rounds": results,
        "over_rounds": {b: _over_rounds(results, b) for b in ("sequential", "concurrent")},
    }
    report["markdown"] = _markdown(report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument(
        "--unserve-v1alpha1", action="store_true", help="as the k8s/v1beta1-only install (default: served)"
    )
    parser.add_argument(
        "--controller-arg",
        action="append",
        default=[],
        help="an extra controller flag, e.g. --controller-arg=--sandbox-claim-concurrent-workers=4 (repeatable)",
    )
    args = parser.parse_args()
    report = run(
        args.rounds,
        args.sequential,
        args.concurrent,
        serve_v1alpha1=not args.unserve_v1alpha1,
        controller_args=tuple(args.controller_arg),
    )
    path = write_result_with_markdown("sdk", report)
    print(report["markdown"])
    print(f"\nwritten {path}")


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
