"""A bench whose terminal hung up: every write to stderr fails with EIO, and the teardown must still run.

The progress lines (`log`, the cluster start's own lines, `DevCluster.down`'s "logs kept") raised the
OSError, which replaced the interruption being handled: an interrupted start left its cluster running, and a
failed run's cluster directory stayed behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import benchmarks.cluster as bench_cluster
import pytest
from benchmarks.log import log
from benchmarks.tuning import Tuning

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.config import ClusterConfig
from agent_sandbox.devcluster.processes import is_ours
from tests.unit.benchmarks.recorded_cluster import recorded_cluster

pytestmark = pytest.mark.unit

NAME = "bench-hangup"


class _HungUp:
    """stderr after a hangup: every write fails as a write to the vanished terminal does."""

    def write(self, _: str) -> int:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def flush(self) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))


def _hang_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, stderr is a terminal that hung up. (Set in the test itself: pytest's output capture
    puts its own stderr back between a fixture's setup and the test.)"""
    monkeypatch.setattr(sys, "stderr", _HungUp())


def test_a_log_line_to_a_terminal_that_hung_up_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    _hang_up(monkeypatch)
    log("still running")


def test_a_log_line_to_a_pty_whose_terminal_closed_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    import pty

    master, slave = pty.openpty()
    os.close(master)  # the terminal emulator is gone
    tty = open(slave, "w", encoding="utf-8")  # noqa: SIM115 - its close fails too (the unwritten line)
    try:
        monkeypatch.setattr(sys, "stderr", tty)
        with pytest.raises(OSError, match=os.strerror(errno.EIO)):  # what a plain print meets
            print("x", file=tty, flush=True)
        log("still running")
    finally:
        with contextlib.suppress(OSError):
            tty.close()


def test_an_interrupted_start_is_stopped_although_the_terminal_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interruption lands after `DevCluster.up`'s last step: only `_start_cluster` can stop the cluster,
    and its first log line used to raise before it did."""
    monkeypatch.setenv("AGENT_SANDBOX_CACHE", str(tmp_path))
    finished = threading.Event()
    release = threading.Event()
    stopped: list[bool] = []

    class Started:
        def down(self, *, quiet: bool = False, keep_logs: bool = False) -> None:
            stopped.append(quiet)

    class FakeDevCluster:
        @classmethod
        def up(cls, config: ClusterConfig, *, log: Any) -> Started:
            try:
                log("starting etcd")
                log(f"cluster {config.name!r} ready")
            finally:  # also when a progress line failed the start
                finished.set()
            release.wait(60)
            return Started()

        @classmethod
        def load(cls, name: str) -> None:
            return None

    monkeypatch.setattr(bench_cluster, "DevCluster", FakeDevCluster)
    _hang_up(monkeypatch)

    async def interrupted() -> None:
        task = asyncio.ensure_future(bench_cluster._start_cluster(ClusterConfig(name=NAME)))
        await asyncio.to_thread(finished.wait, 60)
        task.cancel()
        release.set()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(interrupted())
    assert stopped == [True]


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, int]]:
    """A cluster `bench-hangup` under `<tmp>/bench` whose one process (a `sleep`) runs."""
    with recorded_cluster(tmp_path, monkeypatch, NAME) as (directory, proc):
        yield directory, proc.pid


def test_a_failed_run_is_torn_down_although_the_terminal_is_gone(
    recorded: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`down(quiet=False)` printed "logs kept in ..." between stopping the processes and removing the
    directory: the EIO left the directory, and the run's own error was replaced by the OSError."""
    directory, pid = recorded

    async def started(config: ClusterConfig) -> DevCluster:
        cluster = DevCluster.load(config.name)
        assert cluster is not None
        return cluster

    def controller_fails(*_: object, **__: object) -> object:
        raise RuntimeError("the controller did not start")

    monkeypatch.setattr(bench_cluster, "_start_cluster", started)
    monkeypatch.setattr(bench_cluster, "start_controller", controller_fails)
    _hang_up(monkeypatch)

    async def run() -> None:
        async with bench_cluster.Bench.up(NAME, Tuning(nodes=1)):
            pytest.fail("the controller start fails")

    with pytest.raises(RuntimeError, match="the controller did not start"):
        asyncio.run(run())
    assert not is_ours(pid, "sleep")
    assert not directory.exists()
    kept = list((directory.parent.parent / "failed").glob(f"{NAME}-*/etcd"))
    assert [p.read_text() for p in kept] == ["etcd's log\n"]
