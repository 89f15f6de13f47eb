"""`kill` (SIGTERM) and a hangup (SIGHUP) stop a benchmark with its `finally` blocks run, as Ctrl-C does."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def _start(tmp_path: Path, *, handled: bool) -> subprocess.Popen[str]:
    script = textwrap.dedent(f"""
        import asyncio
        from benchmarks.interrupt import stop_cleanly_on_sigterm
        if {handled}:
            stop_cleanly_on_sigterm()

        async def run() -> None:
            try:
                print("running", flush=True)
                await asyncio.sleep(60)
            finally:
                open({str(tmp_path / "torn-down")!r}, "w").write("yes")

        asyncio.run(run())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"
    return proc


def test_sigterm_runs_the_finally_blocks_of_an_asyncio_benchmark(tmp_path: Path) -> None:
    proc = _start(tmp_path, handled=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert (tmp_path / "torn-down").read_text() == "yes"
    assert "KeyboardInterrupt: stopped by signal 15" in err
    assert proc.returncode != 0


def test_without_it_sigterm_skips_them(tmp_path: Path) -> None:
    proc = _start(tmp_path, handled=False)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert not (tmp_path / "torn-down").exists()


def _start_slow_teardown(
    tmp_path: Path, preexec: Callable[[], object] | None = None
) -> subprocess.Popen[str]:
    """A benchmark whose teardown takes a moment and says when it begins."""
    script = textwrap.dedent(f"""
        import asyncio
        from benchmarks.interrupt import stop_cleanly_on_sigterm
        stop_cleanly_on_sigterm()

        async def run() -> None:
            try:
                print("running", flush=True)
                await asyncio.sleep(60)
            finally:
                print("tearing down", flush=True)
                await asyncio.sleep(1)
                open({str(tmp_path / "torn-down")!r}, "w").write("yes")

        asyncio.run(run())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"
    return proc


def test_sighup_runs_the_finally_blocks_and_a_second_one_does_not_cut_them_short(tmp_path: Path) -> None:
    """A closed terminal or dropped SSH session: until December 6 it left the bench cluster running."""
    proc = _start_slow_teardown(tmp_path, lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    proc.send_signal(signal.SIGHUP)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "tearing down"
    proc.send_signal(signal.SIGHUP)  # the shell's own hangup after the kernel's
    _, err = proc.communicate(timeout=30)
    assert (tmp_path / "torn-down").read_text() == "yes"
    assert "KeyboardInterrupt: stopped by signal 1" in err


def test_an_inherited_ignored_sighup_stays_ignored(tmp_path: Path) -> None:
    """`nohup python -m benchmarks ...`: the hangup it was started to survive must not stop it."""
    proc = _start_slow_teardown(tmp_path, lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc.send_signal(signal.SIGHUP)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert "KeyboardInterrupt: stopped by signal 15" in err
    assert "stopped by signal 1\n" not in err
    assert (tmp_path / "torn-down").read_text() == "yes"


def test_a_signal_between_two_steps_of_the_loop_does_not_wedge_it(tmp_path: Path) -> None:
    """CPython bpo-39622, made deterministic: the signal arrives right after the loop took a task's wake-up off
    its ready queue. Raised there, the wake-up was lost and `asyncio.run`'s clean-up waited for the task forever
    (CI, December 6: the benchmark never exited and its `finally` never ran)."""
    script = textwrap.dedent(f"""
        import asyncio, collections, os, signal
        from benchmarks.interrupt import stop_cleanly_on_sigterm
        stop_cleanly_on_sigterm()

        class ReadyQueue(collections.deque):
            armed = False

            def popleft(self):
                handle = super().popleft()
                if ReadyQueue.armed and repr(handle).startswith("<Handle Task.task_wakeup("):
                    ReadyQueue.armed = False
                    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before this method returns
                return handle

        async def run() -> None:
            loop = asyncio.get_running_loop()
            loop._ready = ReadyQueue(loop._ready)
            try:
                ReadyQueue.armed = True
                await asyncio.sleep(0.05)
                await asyncio.sleep(60)
            finally:
                open({str(tmp_path / "torn-down")!r}, "w").write("yes")

        asyncio.run(run())
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (tmp_path / "torn-down").read_text() == "yes"
    assert "KeyboardInterrupt: stopped by signal 15" in err
