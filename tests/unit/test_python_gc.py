"""Full garbage collections on a timer (agent_sandbox.python_gc; docs/design/python-gc.md)."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_sandbox import python_gc


@pytest.fixture(autouse=True)
def _restore_thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_tune_takes_only_the_automatic_full_collection_away() -> None:
    gc.set_threshold(700, 10, 10)
    assert not python_gc.tuned()
    assert python_gc.tune({})
    young, middle, full = gc.get_threshold()
    assert (young, middle) == (700, 10)
    assert full > 10**9
    assert python_gc.tuned()


def test_the_opt_out_keeps_cpythons_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    assert not python_gc.tune({python_gc.OPT_OUT: "off"})
    assert gc.get_threshold() == (700, 10, 10)
    assert not python_gc.tuned()


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_a_timed_collection_reclaims_cycles_that_reached_the_old_generation() -> None:
    python_gc.tune({})
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    gc.collect(1)  # survives the young generations: promoted to the old one
    del a, b
    for _ in range(3):
        gc.collect(1)  # young collections do not look at the old generation
    assert alive() is not None
    assert python_gc.FullCollections().collect() >= 2
    assert alive() is None


async def test_the_collection_waits_for_calm_then_runs_each_interval() -> None:
    waits: list[float] = []
    runs = asyncio.Event()

    async def wait_calm(within: float) -> None:
        waits.append(within)

    full = python_gc.FullCollections(0.01, wait_calm=wait_calm)
    real_collect = full.collect

    def collect() -> int:
        found = real_collect()
        if full.collections == 2:
            runs.set()
        return found

    full.collect = collect  # type: ignore[method-assign]
    task = asyncio.create_task(full.start())
    await asyncio.wait_for(runs.wait(), 5)
    task.cancel()
    assert waits[:2] == [0.01, 0.01]
    assert full.collections == 2


@pytest.mark.parametrize(("opt_out", "tuned"), [(None, True), ("off", False)])
def test_the_controller_process_tunes_its_collector_at_start(opt_out: str | None, tuned: bool) -> None:
    """The real entry point (it stops at the missing kubeconfig, after tuning)."""
    env = {k: v for k, v in os.environ.items() if k != python_gc.OPT_OUT}
    if opt_out is not None:
        env[python_gc.OPT_OUT] = opt_out
    exe = Path(sys.executable).with_name("agent-sandbox-controller")
    proc = subprocess.run(
        [str(exe), "--kubeconfig=/nonexistent/kubeconfig", "--leader-elect=false"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert "unable to start manager" in proc.stderr
    assert ("full garbage collections every 300 s" in proc.stderr) is tuned
