"""Lifecycle beyond upstream (docs/lifecycle.md): resume on request, warm claims with env, archive and
activity costs.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.lifecycle [--part all|resume,warm-env,...] [--rounds 3]

One fresh dev cluster (`bench-lifecycle`, 2 kwok nodes, the local runner, the controller with
`--sandbox-lifecycle`, an in-process router with `--sandbox-lifecycle`), then the parts:

- `resume`: PVC-backed runtime Sandboxes with `auto-resume`; each round suspends them all (pods gone), then
  sends one request per Sandbox through the router, first one at a time, then all at once. Latency is the
  client's: request sent -> response received (the held request includes the resume). Baseline: the same
  request to a running Sandbox.
- `warm-env`: claims with env on a template that projects the claim env (warm: adopts a pool member) and the
  same claims on a template without it (upstream's forced cold start). Latency: claim created -> Ready ->
  the first command (through the pod IP) prints the claim's variable.
- `archive`: `--archives` SandboxArchives of a typical claimed, PVC-backed Sandbox, then as many ConfigMaps
  holding the same JSON (the alternative we did not take). etcd's `etcd_mvcc_db_total_size_in_use_in_bytes`
  and the API server's and controller's RSS, before and after.
- `activity`: the cost of the routers' `last-activity` writes: Running Sandboxes with an idle timeout get
  the annotation patched at a fixed rate; CPU of every component during the writes minus an idle baseline of
  the same length, per write.

Writes `benchmarks/results/lifecycle-<UTC>.json` and `.md` (rendered by `lifecycle_report.py`); every
latency is reported as p50/p90/p99 with min/max over all samples, plus the per-round medians (spread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
import urllib.request
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import EXTENSIONS_GROUP
from agent_sandbox.api.meta import format_rfc3339nano
from agent_sandbox.kube import (
    CONFIG_MAP,
    POD,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    NotFound,
    Object,
)
from agent_sandbox.router import Router, load_router_config

from .cluster import Bench
from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .lifecycle_report import markdown, percentiles
from .log import log
from .objects import is_ready
from .result_files import RESULTS, write_result_with_markdown
from .tuning import Tuning

NS = "lifecycle-bench"
IMAGE = "ghcr.io/agent-sandbox/agent-sandbox-runtime:bench"
EXT = f"{EXTENSIONS_GROUP}/v1beta1"
VCT = [
    {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
]
CLAIM_ENV_VOLUME = {
    "name": "claim-env",
    "downwardAPI": {"items": [{"path": "claim-env", "fieldRef": {"fieldPath": lc.CLAIM_ENV_FIELD_PATH}}]},
}


PARTS = ("resume", "warm-env", "archive", "activity")


async def _get(api: ApiClient, kind: Any, name: str) -> Object | None:
    try:
        return await api.get(kind, name, namespace=NS)
    except NotFound:
        return None


async def _until(probe: Any, what: str, within: float = 180.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------- resume on request


def _pvc_sandbox(name: str) -> Object:
    container = {
        "name": "runtime",
        "image": IMAGE,
        "volumeMounts": [{"name": "data", "mountPath": "/workspace"}],
    }
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": {lc.ANNOTATION_AUTO_RESUME: "true"}},
        "spec": {"podTemplate": {"spec": {"containers": [container]}}, "volumeClaimTemplates": VCT},
    }


async def _through(http: aiohttp.ClientSession, router: Router, name: str) -> float:
    headers = {"X-Sandbox-ID": name, "X-Sandbox-Namespace": NS}
    t0 = time.monotonic()
    async with http.post(
        f"http://127.0.0.1:{router.http_port}/execute", data=b'{"command": "true"}', headers=headers
    ) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{name}: {resp.status} {body[:300]!r}")
    return time.monotonic() - t0


async def _suspend_all(api: ApiClient, names: list[str]) -> None:
    await asyncio.gather(
        *(api.patch(SANDBOX, n, {"spec": {"operatingMode": "Suspended"}}, namespace=NS) for n in names)
    )

    async def all_gone() -> bool:
        pods = {p["metadata"]["name"] for p in await api.list(POD, namespace=NS)}
        return not pods & set(names)

    await _until(all_gone, "suspended pods gone", interval=0.2)
    await asyncio.sleep(1.0)  # let the router's Pod cache and state see the pods go


async def part_resume(api: ApiClient, router: Router, sandboxes: int, rounds: int) -> dict[str, Any]:
    names = [f"pvc-{i}" for i in range(sandboxes)]
    for n in names:
        await api.create(SANDBOX, _pvc_sandbox(n), namespace=NS)

    async def all_ready() -> bool:
        return all(is_ready(sb) for sb in [await _get(api, SANDBOX, n) or {} for n in names])

    await _until(all_ready, "PVC-backed sandboxes Ready", interval=0.5)
    await asyncio.sleep(2.0)
    out: dict[str, list[float]] = {"running": [], "sequential": [], "concurrent": []}
    per_round: dict[str, list[float]] = {"sequential": [], "concurrent": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as http:
        for n in names:
            out["running"].append(await _through(http, router, n))
        for r in range(rounds):
            await _suspend_all(api, names)
            seq = [await _through(http, router, n) for n in names]
            await _suspend_all(api, names)
            conc = list(await asyncio.gather(*(_through(http, router, n) for n in names)))
            out["sequential"] += seq
            out["concurrent"] += conc
            per_round["sequential"].append(statistics.median(seq))
            per_round["concurrent"].append(statistics.median(conc))
            log(
                f"resume round {r + 1}/{rounds}: sequential median {statistics.median(seq):.2f}s, concurrent {statistics.median(conc):.2f}s"
            )
    return {
        "sandboxes": sandboxes,
        "rounds": rounds,
        "latency_s": {k: percentiles(v) for k, v in out.items()},
        "round_medians_s": per_round,
        "samples_s": out,
    }


# --------------------------------------------------------------------------- warm claims with env


def _template(name: str, claim_env: bool) -> Object:
    container: dict[str, Any] = {"name": "runtime", "image": IMAGE}
    spec: dict[str, Any] = {"containers": [container]}
    if claim_env:
        container["volumeMounts"] = [{"name": "claim-env", "mountPath": "/var/run/agent-sandbox"}]
        spec["volumes"] = [CLAIM_ENV_VOLUME]
    return {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": spec}, "envVarsInjectionPolicy": "Allowed"},
    }


def _pool(name: str, template: str, replicas: int) -> Object:
    return {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }


async def _pool_ready(api: ApiClient, pool: str, replicas: int) -> None:
    async def ready() -> bool:
        obj = await _get(api, SANDBOX_WARM_POOL, pool)
        return int(((obj or {}).get("status") or {}).get("readyReplicas") or 0) >= replicas

    await _until(ready, f"pool {pool} Ready", interval=0.5)


async def _claim_latency(
    api: ApiClient, http: aiohttp.ClientSession, name: str, pool: str
) -> tuple[float, float, str]:
    """(create -> claim Ready, Ready -> first command sees the env, launch type)."""
    body = {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": pool}, "env": [{"name": "API_KEY", "value": f"key-{name}"}]},
    }
    t0 = time.monotonic()
    await api.create(SANDBOX_CLAIM, body, namespace=NS)

    async def bound() -> str | None:
        cl = await _get(api, SANDBOX_CLAIM, name)
        sb = (((cl or {}).get("status") or {}).get("sandbox") or {}).get("name")
        return str(sb) if cl is not None and is_ready(cl) and sb else None

    sandbox = await _until(bound, f"claim {name} Ready", interval=0.02)
    t1 = time.monotonic()
    sb = await api.get(SANDBOX, sandbox, namespace=NS)
    ip = sb["status"]["podIPs"][0]
    async with http.post(
        f"http://{ip}:8888/execute", data=orjson.dumps({"command": "sh -c 'echo $API_KEY'"})
    ) as resp:
        out = (await resp.json())["stdout"]
    if out != f"key-{name}\n":
        raise RuntimeError(f"claim {name}: the first command printed {out!r}")
    t2 = time.monotonic()
    return t1 - t0, t2 - t1, str(sb["metadata"]["labels"].get("agents.x-k8s.io/launch-type"))


async def part_warm_env(api: ApiClient, claims: int, rounds: int) -> dict[str, Any]:
    await api.create(SANDBOX_TEMPLATE, _template("env-on", True), namespace=NS)
    await api.create(SANDBOX_TEMPLATE, _template("env-off", False), namespace=NS)
    await api.create(SANDBOX_WARM_POOL, _pool("warm-env", "env-on", claims), namespace=NS)
    await api.create(SANDBOX_WARM_POOL, _pool("forced-cold", "env-off", claims), namespace=NS)
    results: dict[str, dict[str, list[float]]] = {
        kind: {"ready": [], "first_command": [], "total": []} for kind in ("warm", "cold")
    }
    per_round: dict[str, list[float]] = {"warm": [], "cold": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for r in range(rounds):
            for kind, pool in (("warm", "warm-env"), ("cold", "forced-cold")):
                await _pool_ready(api, pool, claims)
                await asyncio.sleep(1.0)
                totals = []
                for i in range(claims):
                    ready, first, launch = await _claim_latency(api, http, f"{kind}-{r}-{i}", pool)
                    if launch != kind:
                        raise RuntimeError(f"{kind} claim launched {launch}")
                    results[kind]["ready"].append(ready)
                    results[kind]["first_command"].append(first)
                    results[kind]["total"].append(ready + first)
                    totals.append(ready + first)
                per_round[kind].append(statistics.median(totals))
                for i in range(claims):
                    await api.delete(SANDBOX_CLAIM, f"{kind}-{r}-{i}", namespace=NS)
            log(
                f"warm-env round {r + 1}/{rounds}: warm {per_round['warm'][-1]:.2f}s, cold {per_round['cold'][-1]:.2f}s"
            )
    return {
        "claims_per_round": claims,
        "rounds": rounds,
        "latency_s": {k: {m: percentiles(v) for m, v in d.items()} for k, d in results.items()},
        "round_medians_total_s": per_round,
    }


# --------------------------------------------------------------------------- archive cost on etcd


def _etcd_in_use(bench: Bench) -> int:
    port = bench.cluster.state.ports["etcd_client"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith("etcd_mvcc_db_total_size_in_use_in_bytes "):
            return int(float(line.split()[1]))
    raise RuntimeError("etcd_mvcc_db_total_size_in_use_in_bytes not found")


def _typical_archive(i: int) -> Object:
    claim_ref = {
        "apiVersion": EXT,
        "kind": "SandboxClaim",
        "name": f"claim-{i:05d}",
        "uid": f"00000000-0000-4000-8000-{i:012d}",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    sandbox = {
        "metadata": {
            "name": f"hib-{i:05d}",
            "namespace": NS,
            "uid": f"10000000-0000-4000-8000-{i:012d}",
            "labels": {
                "agents.x-k8s.io/sandbox-template-ref-hash": "69155462",
                "agents.x-k8s.io/launch-type": "warm",
                "agents.x-k8s.io/claim-uid": claim_ref["uid"],
            },
            "annotations": {
                "agents.x-k8s.io/sandbox-template-ref": "python-runtime",
                lc.ANNOTATION_SUSPEND_REASON: "Idle",
                lc.ANNOTATION_SUSPENDED_AT: "2026-12-01T10:00:00.123456Z",
                lc.ANNOTATION_LAST_ACTIVITY: "2026-12-01T09:45:00.5Z",
            },
            "ownerReferences": [claim_ref],
        },
        "spec": {
            "operatingMode": "Suspended",
            "podTemplate": {
                "metadata": {
                    "labels": {"agents.x-k8s.io/claim-uid": claim_ref["uid"], "app": "agent"},
                    "annotations": {lc.ANNOTATION_CLAIM_ENV: '{"API_KEY":"k","MODE":"fast"}'},
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "dnsPolicy": "None",
                    "dnsConfig": {"nameservers": ["8.8.8.8", "1.1.1.1"]},
                    "containers": [
                        {
                            "name": "runtime",
                            "image": "registry.k8s.io/agent-sandbox/agent-sandbox-runtime:v0.1.0",
                            "ports": [
                                {"containerPort": 8888},
                                {"containerPort": 8080},
                                {"containerPort": 9090},
                            ],
                            "resources": {
                                "requests": {"cpu": "250m", "memory": "512Mi"},
                                "limits": {"memory": "1Gi"},
                            },
                            "volumeMounts": [
                                {"name": "data", "mountPath": "/workspace"},
                                {"name": "claim-env", "mountPath": "/var/run/agent-sandbox"},
                            ],
                        }
                    ],
                    "volumes": [CLAIM_ENV_VOLUME],
                },
            },
            "volumeClaimTemplates": VCT,
        },
    }
    return lc.archive_body(
        sandbox,
        cause=lc.Cause.AFTER,
        now=datetime(2026, 12, 2, tzinfo=UTC),
        children=[{"kind": "PersistentVolumeClaim", "name": f"data-hib-{i:05d}"}],
    )


async def _create_many(api: ApiClient, kind: Any, bodies: list[Object]) -> float:
    sem = asyncio.Semaphore(50)

    async def one(body: Object) -> None:
        async with sem:
            await api.create(kind, body, namespace=NS)

    t0 = time.monotonic()
    await asyncio.gather(*(one(b) for b in bodies))
    return time.monotonic() - t0


def _rss_mib(bench: Bench, name: str) -> float:
    row = bench.sampler.sample()
    return round(float(row["rss"].get(name, 0)) / 2**20, 1)


async def part_archive(bench: Bench, count: int) -> dict[str, Any]:
    api = bench.api
    sample = _typical_archive(0)
    # Nothing may own our synthetic archives (GC would delete them: the claim does not exist).
    for_store = [
        {**a, "metadata": {k: v for k, v in a["metadata"].items() if k != "ownerReferences"}}
        for a in (_typical_archive(i) for i in range(count))
    ]
    await asyncio.sleep(5)
    before = _etcd_in_use(bench)
    rss0 = {n: _rss_mib(bench, n) for n in ("kube-apiserver", "agent-sandbox-controller", "etcd")}
    seconds = await _create_many(api, lc.ARCHIVE, for_store)
    await asyncio.sleep(10)
    after = _etcd_in_use(bench)
    rss1 = {n: _rss_mib(bench, n) for n in rss0}
    stored = await api.get(lc.ARCHIVE, for_store[0]["metadata"]["name"], namespace=NS)
    configmaps = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-hib-{i:05d}", "labels": a["metadata"].get("labels") or {}},
            "data": {"archive.json": json.dumps(a["spec"], separators=(",", ":"))},
        }
        for i, a in enumerate(for_store)
    ]
    cm_seconds = await _create_many(api, CONFIG_MAP, configmaps)
    await asyncio.sleep(10)
    after_cm = _etcd_in_use(bench)
    return {
        "archives": count,
        "archive_json_bytes": len(orjson.dumps(sample)),
        "stored_object_json_bytes": len(orjson.dumps(stored)),
        "etcd_in_use_bytes": {"before": before, "after_archives": after, "after_configmaps": after_cm},
        "etcd_bytes_per_archive": round((after - before) / count),
        "etcd_bytes_per_configmap": round((after_cm - after) / count),
        "create_seconds": {"archives": round(seconds, 1), "configmaps": round(cm_seconds, 1)},
        "rss_mib_before": rss0,
        "rss_mib_after_archives": rss1,
    }


# --------------------------------------------------------------------------- activity write cost


async def part_activity(bench: Bench, sandboxes: int, rate: float, seconds: float) -> dict[str, Any]:
    api = bench.api
    names = [f"act-{i:03d}" for i in range(sandboxes)]
    for n in names:
        body = {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": n, "annotations": {lc.ANNOTATION_IDLE_TIMEOUT: "24h"}},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}}},
        }
        await api.create(SANDBOX, body, namespace=NS)

    async def all_ready() -> bool:
        sbs = await api.list(SANDBOX, namespace=NS)
        return sum(1 for sb in sbs if sb["metadata"]["name"].startswith("act-") and is_ready(sb)) >= sandboxes

    await _until(all_ready, "activity sandboxes Ready", interval=1.0)
    await asyncio.sleep(10)
    t0 = time.time()
    await asyncio.sleep(seconds)
    t1 = time.time()
    idle = bench.sampler.between(t0, t1)
    writes = int(rate * seconds)
    start = time.monotonic()
    for i in range(writes):
        stamp = format_rfc3339nano(datetime.now(UTC))
        await api.patch(
            SANDBOX,
            names[i % sandboxes],
            {"metadata": {"annotations": {lc.ANNOTATION_LAST_ACTIVITY: stamp}}},
            namespace=NS,
        )
        lag = start + (i + 1) / rate - time.monotonic()
        if lag > 0:
            await asyncio.sleep(lag)
    await asyncio.sleep(2)  # reconciles triggered by the last writes
    t3 = time.time()
    busy = bench.sampler.between(t1, t3)
    span_idle = idle.get("seconds") or seconds
    span_busy = busy.get("seconds") or (t3 - t1)
    per_write: dict[str, float] = {}
    for name, cpu in (busy.get("cpu_seconds") or {}).items():
        base = (idle.get("cpu_seconds") or {}).get(name, 0.0) / span_idle * span_busy
        per_write[name] = round(max(cpu - base, 0.0) * 1000 / writes, 3)
    return {
        "sandboxes": sandboxes,
        "writes": writes,
        "rate_per_s": rate,
        "cpu_ms_per_write_net": per_write,
        "cpu_ms_per_write_net_total": round(sum(v for k, v in per_write.items() if k != "bench-harness"), 3),
        "idle": idle,
        "busy": busy,
    }


# --------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> dict[str, Any]:
    load_before = [round(x, 2) for x in os.getloadavg()]
    parts = set(PARTS) if args.part == "all" else set(args.part.split(","))
    tuning = Tuning(nodes=2, extra_flags=("--sandbox-lifecycle",))
    report: dict[str, Any] = {"scenario": "lifecycle", "parts": {}}
    async with Bench.up("bench-lifecycle", tuning) as bench:
        await bench.ensure_namespace(NS)
        await asyncio.sleep(2)
        config, _ = load_router_config(
            [
                "--http-bind-address=127.0.0.1:0",
                "--metrics-bind-address=127.0.0.1:0",
                "--health-probe-bind-address=127.0.0.1:0",
                "--allow-loopback-pod-ip",
                "--cache-enabled",
                f"--kubeconfig={bench.cluster.kubeconfig}",
                "--sandbox-lifecycle",
                "--access-log=false",
            ],
            {},
        )
        router = Router(config)
        await router.start()
        try:
            if "resume" in parts:
                report["parts"]["resume"] = await part_resume(bench.api, router, args.sandboxes, args.rounds)
            if "warm-env" in parts:
                report["parts"]["warm_env"] = await part_warm_env(bench.api, args.claims, args.rounds)
            if "activity" in parts:
                report["parts"]["activity"] = await part_activity(
                    bench, args.activity_sandboxes, args.rate, args.seconds
                )
            if "archive" in parts:
                report["parts"]["archive"] = await part_archive(bench, args.archives)
        finally:
            await router.shutdown()
        report["cluster"] = bench.describe()
    report["meta"] = {
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "args": vars(args),
    }
    report["host"] = host_info()
    report["markdown"] = markdown(report)
    return report


def main() -> None:
    # The router runs in this process: keep its lifecycle log (slow holds, failures) next to the result.
    log_file = RESULTS / "tmp" / "lifecycle-router.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=log_file,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
    )
    logging.getLogger("agent_sandbox.router.proxy").setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", default="all", help=f"all, or a comma-separated list of: {', '.join(PARTS)} (one cluster)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=8, help="PVC-backed Sandboxes resumed per round")
    parser.add_argument("--claims", type=int, default=8, help="claims per kind per round (warm-env)")
    parser.add_argument("--archives", type=int, default=10000)
    parser.add_argument("--activity-sandboxes", type=int, default=100)
    parser.add_argument("--rate", type=float, default=50.0, help="activity writes per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="activity measurement window")
    args = parser.parse_args()
    unknown = set(args.part.split(",")) - {"all", *PARTS}
    if unknown:
        parser.error(f"--part: unknown {', '.join(sorted(unknown))} (known: all, {', '.join(PARTS)})")
    report = asyncio.run(run(args))
    path = write_result_with_markdown("lifecycle", report)
    print(report["markdown"])
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
