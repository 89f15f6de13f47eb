"""`agent-sandbox cp` of a directory tree: one file at a time against several in flight.

    flock /tmp/agent-sandbox-bench.lock .venv/bin/python -m benchmarks.cp_tree [--rounds 5] [--files 200] [--size 4096]

Brings up its own dev cluster (controller, router, local runner; torn down afterwards), claims one runtime
sandbox from a warm pool, and copies a local tree of `--files` files of `--size` bytes (in 10 directories)
into it and back with `cli.copy.copy` - the code `agent-sandbox cp` runs - through the router, with 1 file in
flight and with the default (`copy_transfers._PARALLEL`), interleaved round by round so both see the same
machine. Reported: seconds per upload and download, min / median / max over rounds, with the load average.
Writes `benchmarks/results/cp-<UTC time>.json` and `.md`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_sandbox.cli import copy as cp
from agent_sandbox.cli import copy_transfers
from agent_sandbox.devcluster import ClusterConfig, DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.router import router_url, start_router
from agent_sandbox_sdk import SandboxClient, SandboxDirectConnectionConfig

from .host import host_info
from .interrupt import stop_cleanly_on_sigterm
from .log import log
from .result_files import write_result_with_markdown
from .sdk import NAMESPACE, _apply_pool, _wait_pool_ready


def _tree(root: Path, files: int, size: int) -> None:
    for i in range(files):
        directory = root / f"d{i % 10}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{i}.bin").write_bytes(os.urandom(size))


def _timed_copy(client: SandboxClient, src: str, dst: str, parallel: int) -> float:
    saved = copy_transfers._PARALLEL
    copy_transfers._PARALLEL = parallel
    try:
        start = time.perf_counter()
        cp.copy(client, argparse.Namespace(src=src, dst=dst, namespace=NAMESPACE, timeout=300))
        return time.perf_counter() - start
    finally:
        copy_transfers._PARALLEL = saved


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def run(rounds: int, files: int, size: int) -> dict[str, Any]:
    cluster = DevCluster.up(ClusterConfig(name=f"bench-cp-{os.getpid()}", nodes=1))
    work = Path(tempfile.mkdtemp(prefix="bench-cp-"))
    settings = {"serial": 1, "parallel": copy_transfers._PARALLEL}
    samples: dict[str, dict[str, list[float]]] = {s: {"upload": [], "download": []} for s in settings}
    loads = []
    try:
        start_controller(cluster)
        start_router(cluster)
        router = router_url(cluster)
        assert router is not None
        _apply_pool(cluster, 1)
        _wait_pool_ready(cluster, 1)
        _tree(work / "tree", files, size)
        config = SandboxDirectConnectionConfig(api_url=router)
        with SandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
            sandbox = client.create_sandbox("pool", NAMESPACE, sandbox_ready_timeout=120, claim_name="cp")
            assert sandbox.commands is not None
            for i in range(rounds):
                loads.append(os.getloadavg())
                for setting, parallel in settings.items():
                    log(f"round {i + 1}/{rounds}: {setting}")
                    target = f"cp:r{i}-{setting}"
                    samples[setting]["upload"].append(
                        _timed_copy(client, str(work / "tree"), target, parallel)
                    )
                    down = work / f"down-{i}-{setting}"
                    samples[setting]["download"].append(_timed_copy(client, target, str(down), parallel))
                    got = sorted(p.relative_to(down) for p in down.rglob("*.bin"))
                    assert len(got) == files, f"downloaded {len(got)} of {files} files"
                    shutil.rmtree(down)
                    sandbox.commands.run(f"rm -rf r{i}-{setting}")
            sandbox.terminate()
    finally:
        cluster.down(quiet=True)
        shutil.rmtree(work, ignore_errors=True)
    report: dict[str, Any] = {
        "scenario": "cp",
        "host": host_info(),
        "params": {"rounds": rounds, "files": files, "size": size, "parallel": settings["parallel"]},
        "samples": samples,
        "load_before_rounds": loads,
        "spread": {s: {d: _spread(v) for d, v in by.items()} for s, by in samples.items()},
    }
    lines = [
        f"`agent-sandbox cp` of a tree of {files} files x {size} bytes (10 directories) through the router, "
        f"{rounds} rounds interleaved; seconds, min / median / max. Load average before each round: "
        + ", ".join(f"{load[0]:.1f}" for load in loads),
        "",
        "| files in flight | upload | download |",
        "|---|---|---|",
    ]
    for setting, parallel in settings.items():
        cells = [
            " / ".join(f"{report['spread'][setting][d][k]:.2f}" for k in ("min", "median", "max"))
            for d in ("upload", "download")
        ]
        lines.append(f"| {parallel} | {cells[0]} | {cells[1]} |")
    report["markdown"] = "\n".join(lines)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    report = run(args.rounds, args.files, args.size)
    path = write_result_with_markdown("cp", report)
    print(report["markdown"])
    print(f"\nwritten {path}")


if __name__ == "__main__":
    stop_cleanly_on_sigterm()
    main()
