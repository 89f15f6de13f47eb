"""Issue 20's inventory: every API write one claim cycle causes, what each changed, and the CPU it costs.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.cycle_writes [--bodies] [--windows 3]
        [--unserve] [--flag=--disable-claim-events ...] [--profile] [--profile-controller] [--tag T]

Same cluster and controller as the burst benchmark (`Tuning()` = the KWOK gate settings) with kube-apiserver's
audit log on. One pool of `--pool` members; per window, 10 s of idle baseline, then `--claims` claims at `--rate`/s
(default 1), each deleted 5 s after it is Ready (as the sustained scenario does), by default far below the knee so
nothing queues, then until the pool is whole again and the writes stop. Per window: writes per claim cycle by
client and verb/resource (counted from the audit log), reads per cycle by verb/resource (kube-apiserver's
request counter: every client, the audit policy skips reads) and CPU per cycle by process net of the idle
baseline. `--profile` takes kube-apiserver's pprof and `--profile-controller` a py-spy of the controller over
the first window. `--bodies` logs every write's body and prints the first window's patch shapes (which fields
each write set) and the time-ordered writes of one cycle: the claim, the member it took, that member's Pod and the member that refilled the pool (the body logging
costs API server CPU, so compare CPU only between runs with the same setting). The controller's identity follows
`AGENT_SANDBOX_CONTROLLER_IDENTITY` (admin certificate, or the install's ServiceAccount token under RBAC).
Writes `benchmarks/results/cycle[-TAG]-<UTC>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster.audit import AuditEvent, AuditLog
from agent_sandbox.devcluster.config import POD_DELETION_GRACEFUL, POD_DELETION_INSTANT
from agent_sandbox.devcluster.identity import IDENTITY_ENV
from agent_sandbox.kube import SANDBOX_CLAIM, NotFound

from . import apiserver_profile, controller_profile, promtext
from .cluster import Bench
from .fill_tail import AuditedTuning
from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .objects import is_ready
from .result_files import write_result

NAMESPACE, POOL = "bench-cycle", "warmpool-0"


@dataclasses.dataclass(frozen=True)
class BodiesTuning(AuditedTuning):
    """The gate's settings, audit log with every write's body."""

    def cluster_config(self, name: str) -> Any:
        return dataclasses.replace(super().cluster_config(name), audit_bodies=True)


def _client(e: AuditEvent) -> str:
    return e.user_agent.split("/")[0] or e.user


def _what(e: AuditEvent) -> str:
    return e.resource + (f"/{e.subresource}" if e.subresource else "")


def _paths(body: Any, prefix: str = "", depth: int = 3) -> list[str]:
    """Leaf-ish paths a merge patch sets (to `depth`), or op+path of a JSON patch."""
    if isinstance(body, list) and not prefix:
        return sorted({f"{op.get('op')} {op.get('path')}" for op in body if isinstance(op, dict)})
    if not isinstance(body, dict) or depth == 0:
        return [prefix or "."]
    out: list[str] = []
    for key, value in body.items():
        if key in ("apiVersion", "kind") or (prefix == "metadata" and key in ("resourceVersion", "name")):
            continue
        out.extend(_paths(value, f"{prefix}.{key}" if prefix else key, depth - 1))
    return sorted(out)


def _shape(e: AuditEvent) -> str:
    if e.verb in ("patch", "update"):
        return f"{_client(e)} {e.verb} {_what(e)}: " + ", ".join(_paths(e.request))
    return f"{_client(e)} {e.verb} {_what(e)}"


async def _claim(bench: Bench, i: int, at: float, names: dict[str, str]) -> None:
    await asyncio.sleep(max(0.0, at - time.time()))
    name = f"cycle-{i:03d}"
    body = {
        "apiVersion": f"{c.EXTENSIONS_GROUP}/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"warmPoolRef": {"name": POOL}},
    }
    await bench.api.create(SANDBOX_CLAIM, body)
    while True:
        obj = await bench.api.get(SANDBOX_CLAIM, name, namespace=NAMESPACE)
        if is_ready(obj):
            names[name] = str(((obj.get("status") or {}).get("sandbox") or {}).get("name") or "")
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(5.0)
    await bench.api.delete(SANDBOX_CLAIM, name, namespace=NAMESPACE)
    while True:
        try:
            await bench.api.get(SANDBOX_CLAIM, name, namespace=NAMESPACE)
        except NotFound:
            return
        await asyncio.sleep(0.2)


def _report(events: list[AuditEvent], claims: int, names: dict[str, str]) -> None:
    writes = [e for e in events if e.is_write and e.namespace in (NAMESPACE, "")]
    by_kind = collections.Counter(f"{_client(e)} {e.verb} {_what(e)}" for e in writes)
    print(f"\n{len(writes)} writes for {claims} claim cycles = {len(writes) / claims:.2f} per cycle\n")
    for key, n in by_kind.most_common():
        print(f"  {n / claims:6.2f}  {key}")
    print("\npatch/update shapes (count per cycle):")
    for key, n in collections.Counter(
        _shape(e) for e in writes if e.verb in ("patch", "update")
    ).most_common():
        print(f"  {n / claims:6.2f}  {key}")
    claim, member = next(iter(names.items()))
    created = [e for e in writes if e.verb == "create" and e.resource == "sandboxes" and not e.subresource]
    first_claim = min(e.received for e in writes if e.resource == "sandboxclaims" and e.name == claim)
    refill = next((e.created_name() for e in created if e.received >= first_claim), "")
    print(f"\none cycle: claim {claim}, member {member}, refill member {refill}")
    t0 = first_claim
    for e in sorted(writes, key=lambda e: e.received):
        if e.name in (claim, member, refill) or (e.verb == "create" and e.created_name() == refill):
            shape = _shape(e).split(": ", 1)
            print(f"  {e.received - t0:+7.3f}s {e.resource[:14]:14} {e.name[:22]:22} {shape[0]}"
                  + (f"\n{'':50}{shape[1]}" if len(shape) > 1 else ""))  # fmt: skip
            if e.verb in ("patch", "update") and e.subresource == "status":
                print(f"{'':50}{json.dumps(e.request, sort_keys=True)[:600]}")


async def _settle(bench: Bench, log: AuditLog, quiet: float = 5.0, within: float = 120.0) -> None:
    """Until the audit log gains no write in the bench namespace for `quiet` seconds."""
    deadline, offset, last = time.monotonic() + within, log.mark(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last < quiet:
        await asyncio.sleep(1.0)
        if any(e.is_write and e.namespace == NAMESPACE for e in log.since(offset)):
            last = time.monotonic()
        offset = log.mark()


async def _watchers(bench: Bench) -> str:
    counts = collections.Counter(
        f"{s.labels.get('resource')}" for s in await bench.scrape_apiserver()
        if s.name == "apiserver_longrunning_requests" and s.labels.get("verb") == "WATCH" and s.value
        for _ in range(int(s.value))
    )  # fmt: skip
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items()) if "sandbox" in k or k == "pods")


async def _requests(bench: Bench) -> collections.Counter[str]:
    """kube-apiserver's request count by verb and resource, every client (the audit log skips reads)."""
    counts = promtext.apiserver_requests(await bench.scrape_apiserver(), ("GET", "LIST"))
    return collections.Counter({key: int(n) for key, n in counts.items()})


async def _window(
    bench: Bench,
    log: AuditLog,
    claims: int,
    rate: float,
    *,
    profile: bool,
    detail: bool,
    profile_controller: bool = False,
) -> dict[str, Any]:
    """One measured window: idle baseline, `claims` cycles at `rate`/s, settle; writes and CPU per cycle."""
    await _settle(bench, log)
    idle0, t_idle = bench.cpu_seconds(), time.monotonic()
    await asyncio.sleep(10.0)
    idle1, t0 = bench.cpu_seconds(), time.monotonic()
    idle = {n: (idle1[n] - idle0.get(n, 0.0)) / (t0 - t_idle) for n in idle1}
    mark, load0, reads0 = log.mark(), os.getloadavg()[0], await _requests(bench)
    names: dict[str, str] = {}
    start = time.time() + 0.5
    prof = None
    if profile:
        out = Path(f"benchmarks/results/tmp/cycle-writes-{int(start)}.pprof")
        prof = asyncio.create_task(apiserver_profile.capture(bench.cluster, claims / rate + 5, out))
    spy_out = controller_profile.profile_path_for("cycle", "controller") if profile_controller else None
    spy = bench.profiler(claims / rate + 5, spy_out) if spy_out is not None else None
    await asyncio.gather(*(_claim(bench, i, start + i / rate, names) for i in range(claims)))
    await bench.wait_pools_ready([(NAMESPACE, POOL)], 300)
    await _settle(bench, log)
    end, t1 = bench.cpu_seconds(), time.monotonic()
    events = log.since(mark)
    reads = await _requests(bench) - reads0
    if detail:
        _report(events, claims, dict(sorted(names.items())))
    net = {n: ((end[n] - idle1.get(n, 0.0)) - idle.get(n, 0.0) * (t1 - t0)) * 1000 / claims for n in end}
    writes = [e for e in events if e.is_write and e.namespace in (NAMESPACE, "")]
    by_kind = collections.Counter(f"{_client(e)} {e.verb} {_what(e)}" for e in writes)
    reads_per_cycle = {k: round(n / claims, 2) for k, n in reads.most_common() if n >= claims / 20}
    window: dict[str, Any] = {
        "claims": claims,
        "rate": rate,
        "seconds": round(t1 - t0, 1),
        "load1": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "writes_per_cycle": round(len(writes) / claims, 2),
        "writes_by_kind": {k: round(n / claims, 2) for k, n in by_kind.most_common()},
        "reads_by_kind": reads_per_cycle,
        "cpu_ms_per_cycle": round(sum(net.values()), 1),
        "cpu_ms_by_process": {n: round(v, 1) for n, v in sorted(net.items(), key=lambda kv: -kv[1])},
    }
    print(
        f"window: {window['writes_per_cycle']} writes/cycle; CPU per cycle (minus idle, {t1 - t0:.0f} s): "
        f"{window['cpu_ms_per_cycle']} ms - "
        + ", ".join(f"{n} {v:.1f}" for n, v in sorted(net.items(), key=lambda kv: -kv[1]) if v > 0.05),
        flush=True,
    )
    print("reads per cycle (all clients): " + ", ".join(f"{k} {v}" for k, v in reads_per_cycle.items()))
    if spy is not None:
        await controller_profile.finish_profiler(spy)
        window["controller_profile"] = controller_profile.profile_summary_for(spy_out)
        print(f"controller profile: {spy_out}")
    if prof is not None:
        summary = apiserver_profile.summarize(await prof, nodes=45)
        if summary is not None:
            print(summary["file"], *summary["flat"], *summary["cum"], sep="\n")
    return window


async def run(args: argparse.Namespace) -> None:
    tuning = (BodiesTuning if args.bodies else AuditedTuning)(
        apiserver_profiling=args.profile,
        serve_v1alpha1=not args.unserve,
        extra_flags=tuple(args.flag),
        pod_deletion=args.pod_deletion,
        controller_binary=args.controller_binary,
    )
    async with Bench.up("bench-cycle", tuning) as bench:
        await bench.ensure_namespace(NAMESPACE)
        await bench.create_template(NAMESPACE)
        await bench.create_pool(NAMESPACE, POOL, args.pool)
        await bench.wait_pools_ready([(NAMESPACE, POOL)], 300)
        log = AuditLog(bench.cluster.audit_log)
        windows = [
            await _window(
                bench,
                log,
                args.claims,
                args.rate,
                profile=args.profile and i == 0,
                detail=args.bodies and i == 0,
                profile_controller=args.profile_controller and i == 0,
            )
            for i in range(args.windows)
        ]
        print(f"watches: {await _watchers(bench)}")
        report = {
            "scenario": "cycle_writes",
            "tag": args.tag,
            "identity": os.environ.get(IDENTITY_ENV) or "admin",
            "host": host_info(),
            "bench": bench.describe(),
            "windows": windows,
        }
    cpu = sorted(w["cpu_ms_per_cycle"] for w in windows)
    api = sorted(w["cpu_ms_by_process"].get("kube-apiserver", 0.0) for w in windows)
    print(f"CPU ms per cycle min/median/max {cpu[0]} / {cpu[len(cpu) // 2]} / {cpu[-1]}; "
          f"kube-apiserver {api[0]} / {api[len(api) // 2]} / {api[-1]}")  # fmt: skip
    print(write_result(f"cycle-{args.tag}" if args.tag else "cycle", report))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cycle_writes", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--claims", type=int, default=30)
    parser.add_argument("--pool", type=int, default=20)
    parser.add_argument("--rate", type=float, default=1.0, help="claims per second (evenly spaced)")
    parser.add_argument("--windows", type=int, default=3, help="measured windows on the one cluster")
    parser.add_argument("--profile", action="store_true", help="kube-apiserver's pprof over the first window")
    parser.add_argument(
        "--profile-controller", action="store_true", help="py-spy of the controller over the first window"
    )
    parser.add_argument(
        "--bodies", action="store_true", help="log write bodies; print the first window's detail"
    )
    parser.add_argument("--unserve", action="store_true", help="v1alpha1 served: false on the four CRDs")
    parser.add_argument(
        "--pod-deletion",
        choices=(POD_DELETION_GRACEFUL, POD_DELETION_INSTANT),
        default=POD_DELETION_INSTANT,  # as Tuning and the scenarios
        help="how kwok ends a deleted pod (default: the other benchmarks' choice)",
    )
    parser.add_argument(
        "--controller-binary",
        default="",
        help="another controller build in place of ours (upstream's Go binary)",
    )
    parser.add_argument("--flag", action="append", default=[], help="extra controller flag (repeatable)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    asyncio.run(run(args))


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
