"""A bench cluster left running: the command the refusal names works, and a dead bench's cluster is cleared.

No control plane: the "cluster" is a recorded `sleep` process under a temporary cache root, which is all
`DevCluster.up`'s refusal and `clear_stale_cluster` look at.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import benchmarks.cluster as bench_cluster
import pytest
from benchmarks.cluster import (
    _OWNER_FILE,
    _process_start,
    _record_owner,
    clear_stale_cluster,
    isolate_clusters,
)

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.processes import is_ours
from agent_sandbox.devcluster.state import ClusterError
from agent_sandbox.invocation import cli_command
from tests.unit.benchmarks.recorded_cluster import recorded_cluster

pytestmark = pytest.mark.unit


NAME = "bench-unit"


@pytest.fixture
def recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A cluster `bench-unit` under `<tmp>/bench`, its one process running; the cache root is that root."""
    with recorded_cluster(tmp_path, monkeypatch, NAME) as found:
        yield found


def test_the_refusal_names_a_command_that_finds_the_cluster(
    recorded: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    """Until December 6 it said `agent-sandbox dev down --name bench-burst`, which looked in the default root
    and answered "no dev cluster named 'bench-burst'" while the cluster kept running."""
    directory, proc = recorded
    with pytest.raises(ClusterError) as refused:
        DevCluster.up(ClusterConfig(name=NAME))
    command = str(refused.value).split("run `", 1)[1].split("`", 1)[0]
    root = os.environ["AGENT_SANDBOX_CACHE"]
    assert command == f"AGENT_SANDBOX_CACHE={shlex.quote(root)} {cli_command(f'dev down --name {NAME}')}"
    # Run it as printed, from a shell that does not have the bench's cache root in its environment.
    env = {k: v for k, v in os.environ.items() if k != "AGENT_SANDBOX_CACHE"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"cluster {NAME!r} stopped and removed" in done.stderr
    proc.wait(timeout=30)
    assert not directory.exists()


def test_without_a_cache_override_the_command_is_the_plain_one(
    recorded: tuple[Path, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_sandbox.devcluster.cluster import down_command

    monkeypatch.delenv("AGENT_SANDBOX_CACHE")
    assert down_command("bench-burst") == cli_command("dev down --name bench-burst")


def _owner(pid: int, start: int | None, **changes: object) -> dict[str, object]:
    """The owner note `_record_owner` writes for process `pid` of this host and PID namespace."""
    return {
        "pid": pid,
        "start": start,
        "pidns": os.readlink("/proc/self/ns/pid"),
        "host": socket.gethostname(),
        **changes,
    }


def _dead_pid() -> int:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(gone.stdout)


def test_a_cluster_whose_bench_process_is_gone_is_stopped(
    recorded: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    directory, proc = recorded
    _record_owner(NAME)  # the note a bench writes, its process then gone (another under its PID later)
    note = json.loads((directory / _OWNER_FILE).read_text())
    assert note == _owner(os.getpid(), _process_start(os.getpid()))
    (directory / _OWNER_FILE).write_text(json.dumps({**note, "pid": _dead_pid()}))
    assert clear_stale_cluster(NAME)
    proc.wait(timeout=30)
    assert not is_ours(proc.pid, "sleep")
    assert not directory.exists()


@pytest.mark.parametrize(
    "owner",
    [
        "alive",
        "unknown",
        "no-start",
        "other-pid-namespace",
        "other-host",
        "written-before-namespaces",
        "hidden",
    ],
)
def test_a_cluster_of_a_running_or_unknown_owner_is_left_alone(
    recorded: tuple[Path, subprocess.Popen[bytes]], owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parallel bench of the same scenario, or a cluster some other tool started under the bench root.

    A bench in another container sharing the cache directory (another PID namespace, another host name) has
    a PID that means nothing here: its live cluster looked stale and was stopped under it. So did an owner
    whose start time could not be read, and one that /proc hides (`hidepid`) while it runs."""
    directory, proc = recorded
    dead = _dead_pid()
    notes: dict[str, dict[str, object]] = {
        "alive": _owner(os.getpid(), _process_start(os.getpid())),
        "no-start": _owner(dead, None),
        "other-pid-namespace": _owner(dead, 1, pidns="pid:[1]"),
        "other-host": _owner(dead, 1, host="elsewhere.invalid"),
        "written-before-namespaces": {"pid": dead, "start": 1},
        "hidden": _owner(os.getpid(), 1),
    }
    if owner == "hidden":  # running, but its /proc entry is not visible to this user
        monkeypatch.setattr(bench_cluster, "_process_start", lambda pid: None)
    if owner in notes:
        (directory / _OWNER_FILE).write_text(json.dumps(notes[owner]))
    assert not clear_stale_cluster(NAME)
    assert is_ours(proc.pid, "sleep")
    assert directory.is_dir()


def test_bench_root_override_keeps_the_shared_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`AGENT_SANDBOX_BENCH_ROOT`: a test's own cluster root, the control-plane binaries still from the cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(cache))
    monkeypatch.setenv("AGENT_SANDBOX_BENCH_ROOT", str(tmp_path / "mine"))
    monkeypatch.delenv("AGENT_SANDBOX_BENCH_ISOLATE", raising=False)
    root = isolate_clusters()
    assert root == tmp_path / "mine"
    assert os.environ["AGENT_SANDBOX_CACHE"] == str(root)
    assert (root / "bin").resolve() == (cache / "bin").resolve()
    assert isolate_clusters() == root  # a second Bench in the same process
