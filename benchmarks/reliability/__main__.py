"""`python -m benchmarks.reliability crash|soak|churn|streams [...]`: the long fault trials and the load runs.

* `crash`: brings up its own cluster (audit log on; torn down afterwards), runs `--trials` crash trials
  (benchmarks/reliability/crash.py), each in a fresh namespace with a fresh seed;
* `soak`: its own cluster, the controller as its ServiceAccount, standing Sandboxes plus a claim stream
  (benchmarks/reliability/soak.py);
* `churn`: its own cluster, the controller with tracemalloc and a heap probe, thousands of claim
  create -> Ready -> delete cycles; heap and map sizes compared between checkpoints (a leak hunt,
  benchmarks/reliability/churn.py; also writes `.md`);
* `streams`: the router process under concurrent long-lived streams (benchmarks/reliability/router_streams.py).

Each writes `benchmarks/results/reliability-<what>-<UTC timestamp>.json` (the numbers docs/reliability.md
reports). Run them under `flock /tmp/agent-sandbox-bench.lock`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from typing import Any

from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.config import KWOK_POD_PARALLELISM, POD_DELETION_INSTANT
from agent_sandbox.devcluster.processes import stop
from agent_sandbox.kube import ApiClient

from .. import apiserver_profile
from ..client_watch import ClientWatchProcess
from ..cluster import await_conversion_webhook, unserve_v1alpha1
from ..host import host_info
from ..interrupt import stop_cleanly_on_sigterm
from ..log import log
from ..result_files import RESULTS, write_result, write_result_with_markdown
from . import controllers
from .churn import churn, markdown, probe_env
from .crash import crash_trial
from .router_streams import run_streams
from .soak import soak


def _namespace(cluster: DevCluster) -> str:
    name = f"crash-{uuid.uuid4().hex[:8]}"
    status, body = cluster.admin().request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    if status != 201:
        raise RuntimeError(f"create namespace {name}: {status} {body}")
    return name


async def crash(args: argparse.Namespace) -> dict[str, Any]:
    name = f"rel-crash-{os.getpid()}"
    cluster = DevCluster.up(ClusterConfig(name=name, nodes=args.nodes, audit_log=True), log=log)
    trials: list[dict[str, Any]] = []
    try:
        with controllers.as_serviceaccount():
            controller = controllers.start(cluster)
        api = await ApiClient.from_kubeconfig(str(cluster.kubeconfig))
        try:
            for index in range(args.trials):
                seed = random.randrange(1 << 30)
                ns = _namespace(cluster)
                trial, controller = await crash_trial(
                    cluster, api, ns, controller,
                    claims=args.claims, replicas=args.replicas, kills=args.kills, window_s=args.window,
                    rng=random.Random(seed),
                )  # fmt: skip
                row = {"trial": index, "seed": seed, **trial.as_dict()}
                trials.append(row)
                log(f"trial {index}: kills {[(k.at_s, k.ready_claims) for k in trial.kills]}, "
                    f"settled {trial.settle_s:.1f}s, ok={trial.check.ok} {trial.check.violations[:3]}")  # fmt: skip
                cluster.admin().request("DELETE", f"/api/v1/namespaces/{ns}")
        finally:
            await api.close()
            stop(controller)
    finally:
        cluster.down(quiet=True)
    totals = {
        "trials": len(trials),
        "kills": sum(len(t["kills"]) for t in trials),
        "claims": sum(t["claims"] for t in trials),
        "ready": sum(t["check"]["ready"] for t in trials),
        "trials_ok": sum(t["check"]["ok"] for t in trials),
        "violations": sum(len(t["check"]["violations"]) for t in trials),
        "unplanned_exits": sum(t["unplanned_exits"] for t in trials),
        "sandbox_creates": sum(t["check"]["pool_creates"] + t["check"]["cold_creates"] for t in trials),
        "expected_creates": sum(t["check"]["expected_creates"] for t in trials),
        "settle_s": sorted(t["settle_s"] for t in trials),
    }
    return {"params": vars(args), "host": host_info(), "totals": totals, "trials": trials}


PROFILE_SECONDS = 60


async def soak_run(args: argparse.Namespace) -> dict[str, Any]:
    live = args.sandboxes + args.replicas + int(args.per_minute)  # claims live for 30 s: < one minute's worth
    # Room for twice the live Pods: Terminating Pods keep their node's capacity until kwok deletes them, and an
    # overloaded API server delays that (a pool-sized soak left 3,300 refill Pods unschedulable on 900/node).
    config = ClusterConfig(name=f"rel-soak-{os.getpid()}")
    nodes = max(2, -(-2 * live // config.node_pods))
    config = dataclasses.replace(config, nodes=nodes, kwok_pod_parallelism=args.kwok_pod_parallelism)
    if args.gate_pods:  # kwok's fast stages, as upstream's KWOK gate and the claim benchmarks run them
        config = dataclasses.replace(
            config, pod_start_delay_ms=0, pod_start_jitter_ms=0, pod_deletion=POD_DELETION_INSTANT
        )
    profile_at = tuple(float(at) for at in args.apiserver_profile.split(",") if at)
    config = dataclasses.replace(
        config, apiserver_profiling=bool(profile_at), apiserver_extra_args=tuple(args.apiserver_arg)
    )
    cluster = DevCluster.up(config, log=log)
    profiles: dict[str, Any] = {}

    async def profiler(at_s: float) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        out = RESULTS / "profiles" / f"soak-{stamp}-at{at_s:.0f}s-apiserver.pprof"
        path = await apiserver_profile.capture(cluster, PROFILE_SECONDS, out)
        profiles[f"{at_s:.0f}"] = await asyncio.to_thread(apiserver_profile.summarize, path)

    try:
        with controllers.as_serviceaccount():
            controller = controllers.start(cluster)
        argv = controllers.recorded_argv(cluster, controller)
        metrics = int(next(a.rsplit(":", 1)[1] for a in argv if a.startswith("--metrics-bind-address=")))
        api = await ApiClient.from_kubeconfig(str(cluster.kubeconfig))
        try:
            if args.unserve_v1alpha1:
                await await_conversion_webhook(api)  # the controller's CRD patch first, then ours
                await unserve_v1alpha1(api)
            watcher = ClientWatchProcess(str(cluster.kubeconfig), cluster.directory / "client-watch")
            try:
                run = await soak(
                    api, controller, metrics, sandboxes=args.sandboxes, per_minute=args.per_minute,
                    minutes=args.minutes, replicas=args.replicas,
                    namespaces=(_namespace(cluster), _namespace(cluster)), client_watch=watcher,
                    pids={started.name: started.pid for started in cluster.state.started},
                    profile_at=profile_at, profiler=profiler, pause_s=args.pause,
                )  # fmt: skip
            finally:
                await watcher.stop()
        finally:
            await api.close()
            stop(controller)
    finally:
        cluster.down(quiet=True)
    return {
        "host": host_info(),
        "nodes": nodes,
        "gate_pods": args.gate_pods,
        "kwok_pod_parallelism": args.kwok_pod_parallelism,
        "serve_v1alpha1": not args.unserve_v1alpha1,
        # A run with extra kube-apiserver flags measures that cluster, not the default one: say so in the result.
        "apiserver_extra_args": list(config.apiserver_extra_args),
        **run.as_dict(),
        **({"apiserver_profiles": profiles} if profiles else {}),
    }


async def churn_run(args: argparse.Namespace) -> dict[str, Any]:
    cluster = DevCluster.up(ClusterConfig(name=f"rel-churn-{os.getpid()}", nodes=1), log=log)
    try:
        dump_dir = cluster.directory / "heap-probe"
        dump_dir.mkdir(exist_ok=True)
        with (
            controllers.as_serviceaccount(),
            probe_env(dump_dir, frames=args.frames, extra=dict(kv.split("=", 1) for kv in args.env)),
        ):
            controller = controllers.start(cluster, extra=("--enable-pprof", "--enable-pprof-debug"))
        argv = controllers.recorded_argv(cluster, controller)
        metrics = int(next(a.rsplit(":", 1)[1] for a in argv if a.startswith("--metrics-bind-address=")))
        api = await ApiClient.from_kubeconfig(str(cluster.kubeconfig))
        try:
            run = await churn(
                api, controller, metrics, dump_dir, namespace=_namespace(cluster), cycles=args.cycles,
                marks=tuple(int(m) for m in args.checkpoints.split(",")), rate=args.rate, workers=args.workers,
                replicas=args.replicas, expire_s=args.expire,
            )  # fmt: skip
            # The product's own view (--enable-pprof-debug): tracemalloc's top allocation sites.
            heap = await asyncio.to_thread(_get_text, f"http://127.0.0.1:{metrics}/debug/pprof/heap")
        finally:
            await api.close()
            stop(controller)
    finally:
        cluster.down(quiet=True)
    data = {"host": host_info(), "controller_env": args.env, **run.as_dict(),
            "pprof_heap_top": heap.splitlines()[:15]}  # fmt: skip
    data["markdown"] = markdown(data)
    return data


def _get_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return str(resp.read().decode())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reliability", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("crash", help="SIGKILL the controller at random moments during claim bursts")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--claims", type=int, default=500)
    p.add_argument("--replicas", type=int, default=100, help="warm pool size")
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs per trial")
    p.add_argument(
        "--window", type=float, default=60.0, help="kills land within this many seconds of the start"
    )
    p.add_argument("--nodes", type=int, default=2)
    p = sub.add_parser("soak", help="standing Sandboxes plus a claim stream: RSS, queue depth, errors, P99")
    p.add_argument("--sandboxes", type=int, default=5000)
    p.add_argument("--per-minute", type=float, default=1000.0)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--replicas", type=int, default=100, help="warm pool size")
    p.add_argument(
        "--gate-pods",
        action="store_true",
        help="pods start and are deleted at once (the KWOK gate's kwok) instead of the dev cluster's ~1 s / graceful",
    )
    p.add_argument(
        "--kwok-pod-parallelism",
        type=int,
        default=KWOK_POD_PARALLELISM,
        help="pod stage plays kwok runs at once (kwok's default 4: one queue for every simulated kubelet)",
    )
    p.add_argument(
        "--unserve-v1alpha1",
        action="store_true",
        help="mark v1alpha1 `served: false` on the CRDs (the k8s/v1beta1-only install): no conversion per write",
    )
    p.add_argument(
        "--apiserver-arg",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra kube-apiserver flag (repeatable; an experiment, e.g. --feature-gates=ListFromCacheSnapshot=false)",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="seconds between the fill (pool settled) and the claim stream",
    )
    p.add_argument(
        "--apiserver-profile",
        default="",
        metavar="S,S,...",
        help=f"kube-apiserver CPU profiles of {PROFILE_SECONDS} s starting S s into the stream (results/profiles/)",
    )
    p = sub.add_parser("churn", help="claim create/Ready/delete cycles: controller heap growth by site")
    p.add_argument("--cycles", type=int, default=3000)
    p.add_argument(
        "--checkpoints",
        default="500,1500,3000",
        help="cycle counts after which the heap is probed (first = baseline)",
    )
    p.add_argument("--rate", type=float, default=8.0, help="cycle starts per second (at most)")
    p.add_argument("--workers", type=int, default=8, help="cycles in flight (at most)")
    p.add_argument("--replicas", type=int, default=20, help="warm pool size")
    p.add_argument(
        "--expire", type=float, default=0.0, help="claims expire (controller deletes) after S s; 0: we delete"
    )
    p.add_argument("--frames", type=int, default=1, help="tracemalloc frames per allocation (0: off)")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for the controller (repeatable)")
    p = sub.add_parser("streams", help="the router under concurrent long-lived streams: RSS and fds")
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--hold", type=float, default=20.0, help="seconds each stream lasts")
    p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.what == "crash":
        data = asyncio.run(crash(args))
        ok = data["totals"]["trials_ok"] == data["totals"]["trials"]
        summary: Any = data["totals"]
    elif args.what == "soak":
        data = asyncio.run(soak_run(args))
        ok = data["error_lines"] == 0 and data["drained_s"] is not None
        summary = {
            k: v for k, v in data.items() if k not in ("minutes", "host", "timeline", "client_process")
        }
        summary["client_latency_ms"] = (data["client_process"] or {}).get("latency_ms")
    elif args.what == "churn":
        data = asyncio.run(churn_run(args))
        ok = data["cycles_failed"] == 0
        summary = {k: v for k, v in data.items() if k in ("cycles_done", "cycles_failed", "checkpoints")}
        path = write_result_with_markdown(f"reliability-{args.what}", data)
        log(f"{summary} -> {path}")
        return 0 if ok else 1
    else:
        run = asyncio.run(run_streams(streams=args.streams, hold_s=args.hold, rounds=args.rounds))
        data = {"host": host_info(), **run.as_dict()}
        ok = all(r.failed == 0 for r in run.rounds)
        summary = {k: v for k, v in data.items() if k != "host"}
    path = write_result(f"reliability-{args.what}", data)
    log(f"{summary} -> {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    sys.exit(main())
