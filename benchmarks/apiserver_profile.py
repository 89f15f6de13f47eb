"""CPU profile of kube-apiserver during a measurement (`--set apiserver_profile=true`).

The API server is where three quarters of a claim's CPU goes on the local control plane, so knowing what it
spends it on (decoding, managed fields, validation, watch fan-out, conversion) decides what the controller
should stop asking of it. The cluster must run with `ClusterConfig.apiserver_profiling`; the profile is Go's
pprof format and is summarised with `go tool pprof -top` (the toolchain that built the control plane).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

from agent_sandbox.devcluster.cluster import DevCluster

__all__ = ["capture", "summarize"]


def _fetch(cluster: DevCluster, seconds: int, out: Path) -> None:
    path = f"/debug/pprof/profile?seconds={seconds}"
    out.write_bytes(cluster.admin().get_bytes(path, timeout=seconds + 30))


async def capture(cluster: DevCluster, seconds: float, out: Path) -> Path | None:
    """Profile the API server for `seconds`; the pprof file, or None when the server did not serve one."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        await asyncio.to_thread(_fetch, cluster, max(1, round(seconds)), out)
    except OSError:
        return None
    return out


def summarize(path: Path | None, *, nodes: int = 40) -> dict[str, Any] | None:
    """`go tool pprof -top` (flat and cumulative) of a captured profile, as text lines."""
    go = shutil.which("go")
    if path is None or go is None or not path.exists():
        return None
    out: dict[str, Any] = {"file": path.name}
    for key, extra in (("flat", []), ("cum", ["-cum"])):
        proc = subprocess.run(
            [go, "tool", "pprof", "-top", f"-nodecount={nodes}", *extra, str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        out[key] = proc.stdout.splitlines() if proc.returncode == 0 else [proc.stderr.strip()]
    return out
