"""Probes behind issue 20's "what makes run B slow": the API server's work around a warm-pool fill and a burst.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.fill_tail writes   # audit log, 30 s after
    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.fill_tail metrics  # apiserver /metrics diffs
    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.fill_tail profile  # 8 s pprof of apiserver
    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.fill_tail burst    # writes/s through a burst

Same cluster and controller as the burst benchmark (`Tuning()` = the KWOK gate settings), one pool of `--pool`
members (1050). `writes`: kube-apiserver's audit log on, writes per second by client and verb/resource from 12 s
before to 30 s after the pool reports Ready, with the API server's CPU per second. `metrics`: kube-apiserver's
request, watch-cache and GC counters diffed over 2 s windows after pool-Ready, with every component's CPU.
`profile`: kube-apiserver's CPU profile for 8 s from pool-Ready (`go tool pprof -top`). `burst`: audit log on,
the gate burst (75/s for 10 s, 3 s after pool-Ready), writes per second by client and verb/resource.
`--unserve` marks v1alpha1 `served: false` first. Prints a text report (docs/performance.md quotes them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster import ClusterConfig
from agent_sandbox.devcluster.audit import AuditEvent, AuditLog
from agent_sandbox.kube import SANDBOX_CLAIM

from . import apiserver_profile, promtext
from .cluster import Bench
from .interrupt import stop_cleanly_on_sigterm
from .proc_sampling import process_cpu_seconds
from .tuning import Tuning

NAMESPACE, POOL = "bench-burst", "warmpool-0"
# kube-apiserver counters the `metrics` probe diffs (everything else in /metrics is left out).
COUNTERS = (
    "apiserver_request_total",
    "apiserver_watch_events_total",
    "apiserver_watch_cache_events_received_total",
    "apiserver_watch_cache_events_dispatched_total",
    "apiserver_crd_conversion_webhook_duration_seconds_count",
    "apiserver_crd_conversion_webhook_duration_seconds_sum",  # reported in ms: sum / count = mean latency
    "go_gc_duration_seconds_count",
)


@dataclasses.dataclass(frozen=True)
class AuditedTuning(Tuning):
    """The gate's settings plus kube-apiserver's audit log."""

    def cluster_config(self, name: str) -> ClusterConfig:
        return dataclasses.replace(super().cluster_config(name), audit_log=True)


def _second(t: float, origin: float) -> int:
    return int((t - origin) // 1)


def _write_bins(events: Sequence[AuditEvent], origin: float) -> dict[int, collections.Counter[str]]:
    bins: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for e in events:
        if e.is_write:
            client = e.user_agent.split("/")[0]
            what = e.resource + (f"/{e.subresource}" if e.subresource else "")
            bins[_second(e.received, origin)][f"{client} {e.verb} {what}"] += 1
    return bins


def _print_bins(bins: dict[int, collections.Counter[str]], seconds: range, cores: dict[int, float]) -> None:
    for sec in seconds:
        top = ", ".join(f"{k} {n}" for k, n in bins[sec].most_common(6))
        api = f"{cores[sec]:5.2f}" if sec in cores else "    -"
        print(f"{sec:+4d}s apiserver {api} cores, writes {sum(bins[sec].values()):4d}: {top}")


async def _fill(bench: Bench, pool: int) -> float:
    await bench.ensure_namespace(NAMESPACE)
    await bench.create_template(NAMESPACE)
    await bench.create_pool(NAMESPACE, POOL, pool)
    fill = await bench.wait_pools_ready([(NAMESPACE, POOL)], 900)
    print(f"pool of {pool} Ready in {fill:.1f}s", flush=True)
    return time.time()


def _pid(bench: Bench, name: str) -> int:
    return next(s.pid for s in bench.cluster.state.started if s.name == name)


async def probe_writes(bench: Bench, pool: int) -> None:
    api_pid = _pid(bench, "kube-apiserver")
    samples: list[tuple[float, float]] = []

    async def sample() -> None:
        while True:
            if (cpu := process_cpu_seconds(api_pid)) is not None:
                samples.append((time.time(), cpu))
            await asyncio.sleep(1.0)

    sampler = asyncio.create_task(sample())
    ready = await _fill(bench, pool)
    await asyncio.sleep(30.0)
    sampler.cancel()
    cores = {_second(t0, ready): (c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in itertools.pairwise(samples)}
    bins = _write_bins(AuditLog(bench.cluster.audit_log).since(0), ready)
    _print_bins(bins, range(-12, 30), cores)
    total = sum(bins.values(), collections.Counter[str]())
    print("TOTAL writes of the fill and the 30 s after, per pool member:")
    for key, n in total.most_common(16):
        print(f"   {n / pool:6.2f}  {key}")


def _counter_key(s: promtext.Sample) -> str:
    lab = s.labels
    if s.name == "apiserver_request_total":
        sub = f"/{lab['subresource']}" if lab.get("subresource") else ""
        return f"requests {lab.get('verb')} {lab.get('resource')}{sub} {lab.get('code')}"
    keep = ("resource", "group", "crd_name", "from_version", "to_version")
    return s.name + "{" + ",".join(f"{k}={lab[k]}" for k in keep if lab.get(k)) + "}"


async def _counters(bench: Bench) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    for s in await bench.scrape_apiserver():
        if s.name not in COUNTERS:
            continue
        if s.name.endswith("_seconds_sum"):  # latency sums read in ms, so sum / count is the mean in ms
            out[_counter_key(s).replace("_seconds_sum", "_ms_sum")] += int(s.value * 1000)
        else:
            out[_counter_key(s)] += int(s.value)
    return out


def _conversions(counters: collections.Counter[str]) -> int:
    return sum(
        n
        for k, n in counters.items()
        if k.startswith("apiserver_crd_conversion_webhook_duration_seconds_count")
    )


async def probe_metrics(bench: Bench, pool: int) -> None:
    cpu = bench.cpu_seconds
    start_counters, start_cpu = await _counters(bench), cpu()
    ready = await _fill(bench, pool)
    prev, prev_cpu, prev_t = await _counters(bench), cpu(), time.time()
    filled_counters, filled_cpu = prev, prev_cpu
    quiet_at: float | None = None  # end of the first window in which kube-apiserver used < 0.15 cores
    for _ in range(8):
        await asyncio.sleep(2.0)
        now, now_cpu, t = await _counters(bench), cpu(), time.time()
        busy = {n: (now_cpu[n] - prev_cpu.get(n, 0.0)) / (t - prev_t) for n in now_cpu}
        print(f"--- +{prev_t - ready:.1f}..{t - ready:.1f}s cores: "
              + ", ".join(f"{n} {v:.2f}" for n, v in busy.items() if v > 0.02))  # fmt: skip
        for key, n in (now - prev).most_common(12):
            print(f"   {n:8d}  {key}")
        if quiet_at is None and busy.get("kube-apiserver", 0.0) < 0.15:
            quiet_at = t - ready
        prev, prev_cpu, prev_t = now, now_cpu, t
    api = "kube-apiserver"
    quiet = (
        f"apiserver quiet by +{quiet_at:.0f} s" if quiet_at is not None else "apiserver busy through +16 s"
    )
    print(
        f"SUMMARY fill: apiserver {filled_cpu[api] - start_cpu.get(api, 0.0):.1f} cpu-s, "
        f"{_conversions(filled_counters - start_counters)} conversions; "
        f"after Ready (+0..+16 s): apiserver {prev_cpu[api] - filled_cpu[api]:.1f} cpu-s, "
        f"{_conversions(prev - filled_counters)} conversions; {quiet}",
        flush=True,
    )


async def probe_profile(bench: Bench, pool: int) -> None:
    await _fill(bench, pool)
    path = await apiserver_profile.capture(bench.cluster, 8, Path("benchmarks/results/tmp/fill-tail.pprof"))
    summary = apiserver_profile.summarize(path, nodes=60)
    if summary is None:
        raise SystemExit("no profile (is `go` on PATH?)")
    print("\n".join(summary["flat"]), "\n".join(summary["cum"]), sep="\n")


async def probe_burst(bench: Bench, pool: int, rate: float = 75.0, seconds: float = 10.0) -> None:
    ready = await _fill(bench, pool)
    await asyncio.sleep(3.0)
    start, count = time.time(), int(rate * seconds)

    async def claim(i: int) -> None:
        await asyncio.sleep(max(0.0, start + i / rate - time.time()))
        body = {
            "apiVersion": f"{c.EXTENSIONS_GROUP}/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": f"burst-{i:04d}", "namespace": NAMESPACE},
            "spec": {"warmPoolRef": {"name": POOL}},
        }
        await bench.api.create(SANDBOX_CLAIM, body)

    await asyncio.gather(*(claim(i) for i in range(count)))
    await asyncio.sleep(20.0)
    print(f"pool Ready at {ready - start:+.1f}s; {count} claims from +0s")
    _print_bins(_write_bins(AuditLog(bench.cluster.audit_log).since(0), start), range(-6, 30), {})


PROBES: dict[str, tuple[Callable[[Bench, int], Awaitable[None]], bool]] = {
    "writes": (probe_writes, True),
    "metrics": (probe_metrics, False),
    "profile": (probe_profile, False),
    "burst": (probe_burst, True),
}


async def _run(probe: str, pool: int, unserve: bool) -> None:
    run, audited = PROBES[probe]
    tuning = (AuditedTuning if audited else Tuning)(
        serve_v1alpha1=not unserve, apiserver_profiling=probe == "profile"
    )
    async with Bench.up("bench-burst", tuning) as bench:
        await run(bench, pool)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fill_tail", description=__doc__.split("\n")[0]
    )
    parser.add_argument("probe", choices=sorted(PROBES))
    parser.add_argument("--pool", type=int, default=1050)
    parser.add_argument("--unserve", action="store_true", help="v1alpha1 served: false on the four CRDs")
    args = parser.parse_args(argv)
    asyncio.run(_run(args.probe, args.pool, args.unserve))


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
