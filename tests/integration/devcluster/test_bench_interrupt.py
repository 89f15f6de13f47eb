"""A benchmark stopped while its cluster starts (Ctrl-C, `kill`, a hangup) leaves nothing running.

Until December 6 the cluster's start ran in a thread outside the `try` that tears it down: an interruption
during the start exited 130 with etcd, kube-apiserver and the rest still running (3 of 3 tries), and SIGHUP at
any time skipped the teardown. The next run of the scenario then refused to start.

Each case runs `python -m benchmarks burst --smoke` in a subprocess with its clusters under the test's own
directory (`AGENT_SANDBOX_BENCH_ROOT`; the control-plane binaries still come from the shared cache), signals
it at a given line of its progress log, and then looks for any process whose command line mentions that
directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import is_ours
from tests.helpers import signals_as_from_a_shell, wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
NAME = "bench-burst"


def _processes_under(root: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(str(root).encode() in arg for arg in argv):
            found.append(f"{entry.name}: {b' '.join(argv)[:200]!r}")
    return found


def _recorded(root: Path) -> list[dict[str, object]]:
    try:
        processes: list[dict[str, object]] = json.loads(
            (root / "clusters" / NAME / "state.json").read_text()
        )["processes"]
    except (OSError, ValueError):
        return []
    return processes


@pytest.mark.parametrize(
    ("sig", "at"),
    [
        (signal.SIGINT, "starting kube-apiserver"),
        (signal.SIGTERM, "starting kube-apiserver"),
        (signal.SIGHUP, "starting etcd"),
        (signal.SIGHUP, f"cluster '{NAME}' ready"),  # the controller is starting
    ],
    ids=["sigint-mid-start", "sigterm-mid-start", "sighup-mid-start", "sighup-controller-start"],
)
def test_interrupted_bench_leaves_no_cluster_running(
    sig: signal.Signals, at: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "bench-root"
    proc = _bench(root)
    seen: list[str] = []
    try:
        _read_until(proc, at, seen)
        # The line comes just before its component is spawned: signal once something runs.
        recorded = wait_for(lambda: _recorded(root), timeout=60, what="a component recorded")
        proc.send_signal(sig)
        assert proc.stderr is not None
        rest = proc.stderr.read()
        proc.wait(timeout=180)
        log = "".join(seen) + rest
        assert proc.returncode == 128 + sig, log  # as a shell reports a program its signal stopped
        assert "run 1/1 interrupted" in log
        assert "Traceback" not in log, log
        assert f"cluster {NAME}: down" in log
        assert not [p for p in recorded if is_ours(int(str(p["pid"])), str(p["exe"]))], log
        assert _processes_under(root) == [], log
        assert not (root / "clusters" / NAME).exists()
    finally:
        _clean_up(proc, root, monkeypatch)


def test_the_cluster_of_a_killed_bench_is_stopped_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL leaves the cluster running (nothing can prevent that); until December 6 the next run refused
    to start, naming a `dev down` command that did not find the cluster."""
    root = tmp_path / "bench-root"
    first = _bench(root)
    second: subprocess.Popen[str] | None = None
    seen: list[str] = []
    try:
        _read_until(first, f"cluster '{NAME}' ready", seen)
        first.kill()
        first.wait(timeout=30)
        assert _processes_under(root), "the killed bench's cluster should still be running"
        second = _bench(root)
        _read_until(second, f"cluster {NAME}: left running by bench process {first.pid}, which is gone", seen)
        _read_until(second, "starting etcd", seen)  # its own cluster, the stale one stopped first
        second.send_signal(signal.SIGTERM)
        assert second.stderr is not None
        rest = second.stderr.read()
        second.wait(timeout=180)
        assert _processes_under(root) == [], "".join(seen) + rest
    finally:
        _clean_up(first, root, monkeypatch)
        if second is not None:
            _clean_up(second, root, monkeypatch)


def _bench(root: Path) -> subprocess.Popen[str]:
    """`python -m benchmarks burst --smoke` with its clusters under `root`, progress log on a pipe."""
    env = {**os.environ, "AGENT_SANDBOX_BENCH_ROOT": str(root)}
    env.pop("AGENT_SANDBOX_BENCH_ISOLATE", None)
    argv = [sys.executable, "-m", "benchmarks", "burst", "--smoke", "--runs", "1", "--no-report"]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=signals_as_from_a_shell,
    )


def _read_until(proc: subprocess.Popen[str], text: str, seen: list[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return
    pytest.fail(f"the bench ended before {text!r}:\n{''.join(seen)}")


def _clean_up(proc: subprocess.Popen[str], root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever happened, leave no process of this test's bench running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(root))
    leftover = DevCluster.load(NAME)
    if leftover is not None:  # the fix failed: do not leave the cluster running for the next test
        leftover.down(quiet=True)
    for found in _processes_under(root):  # started by this test's bench, whatever its state file says
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(found.split(":", 1)[0]), signal.SIGKILL)
