"""A dev-cluster record whose one "process" is a `sleep`: what the bench's cluster handling sees of a cluster
left running, without building or starting a control plane."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from agent_sandbox.devcluster import cluster as cluster_module
from agent_sandbox.devcluster.processes import is_ours
from agent_sandbox.devcluster.state import ClusterState
from tests.helpers import wait_for

__all__ = ["recorded_cluster"]


def _no_build() -> None:
    raise AssertionError("the test must not get as far as building the control plane")


@contextlib.contextmanager
def recorded_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """Cluster `name` under `<tmp>/bench` (the cache root for the test), its etcd a running `sleep` with a log."""
    root = tmp_path / "bench"
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(root))
    monkeypatch.delenv("AGENT_SANDBOX_BENCH_ROOT", raising=False)
    monkeypatch.delenv("AGENT_SANDBOX_BENCH_ISOLATE", raising=False)
    directory = root / "clusters" / name
    (directory / "logs").mkdir(parents=True)
    (directory / "logs" / "etcd").write_text("etcd's log\n")
    proc = subprocess.Popen(["sleep", "60"])
    # Popen returns before the kernel shows the new command line; until then the PID is not "ours".
    wait_for(lambda: is_ours(proc.pid, "sleep"), timeout=10, what="sleep to exec")
    # Never build or start a real control plane here, whatever goes wrong.
    monkeypatch.setattr(cluster_module, "ensure_binaries", _no_build)
    state = ClusterState(
        name=name,
        directory=str(directory),
        binaries=str(tmp_path / "bin"),
        ports={"apiserver": 1},
        pod_cidr="127.10.0.0/16",
        kubeconfig=str(directory / "kubeconfig"),
        server="https://127.0.0.1:1",
        nodes=[],
        processes=[
            {"name": "etcd", "pid": proc.pid, "exe": "sleep", "log": str(directory / "logs" / "etcd")}
        ],
    )
    (directory / "state.json").write_text(json.dumps(asdict(state)))
    try:
        yield directory, proc
    finally:
        proc.kill()
        proc.wait()
