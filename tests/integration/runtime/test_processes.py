"""The process supervisor itself (runtime/processes.py) with real commands: its limit and its output pumps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent_sandbox.runtime.process import Process
from agent_sandbox.runtime.processes import SpawnError, Supervisor, TooManyProcesses
from tests.integration.runtime.helpers import leaked_processes, zombie_children

pytestmark = pytest.mark.integration


@pytest.fixture
async def root(tmp_path: Path) -> AsyncIterator[str]:
    yield str(tmp_path)
    assert leaked_processes(str(tmp_path)) == [], "processes left running in the root"
    assert zombie_children() == [], "unreaped children of the test process"


def _pending_pumps() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "Process._pump"
    ]


async def _spawn_all(sup: Supervisor, argv: list[str], cwd: str, count: int) -> list[Process | BaseException]:
    return await asyncio.gather(*(sup.spawn(argv, cwd=cwd) for _ in range(count)), return_exceptions=True)


async def test_the_limit_holds_for_spawns_that_start_together(root: str) -> None:
    """`spawn` checked the limit and then awaited (the pipes' setup) before it counted the new process: 150
    commands that arrived together all ran with the default limit of 64 (until December 6)."""
    sup = Supervisor(max_processes=3, chunk_size=1024)
    results = await _spawn_all(sup, ["sleep", "30"], root, 10)
    started = [r for r in results if isinstance(r, Process)]
    refused = [r for r in results if isinstance(r, TooManyProcesses)]
    try:
        assert (len(started), len(refused)) == (3, 7), results
        assert sup.running == 3
        assert "limit 3" in str(refused[0])
    finally:
        for proc in started:
            proc.kill_group()
            await proc.wait()
            await proc.close()
    assert sup.running == 0
    # A spawn that fails gives its slot back: after ten that cannot start, three still can.
    failed = await _spawn_all(sup, ["no-such-program-xyz"], root, 10)
    assert all(isinstance(r, SpawnError) for r in failed), failed
    results = await _spawn_all(sup, ["true"], root, 3)
    assert all(isinstance(r, Process) for r in results), results
    for proc in results:
        assert isinstance(proc, Process)
        assert await proc.wait() == 0
        await proc.close()


async def test_a_command_given_up_on_leaves_no_pump_behind(root: str) -> None:
    """A pump cancelled while the output queue was full waited forever to put its end marker: one task per
    stream left pending ("Task was destroyed but it is pending!" when collected) for every timed-out or
    disconnected command with lots of output (until December 6)."""
    sup = Supervisor(max_processes=4, chunk_size=1024)
    proc = await sup.spawn(["yes"], cwd=root, stdin=False)
    events = proc.events()
    await anext(events)  # output flows; nobody reads on, so the queue fills up
    for _ in range(200):
        await asyncio.sleep(0.01)
    proc.kill_group()
    await proc.wait()
    await events.aclose()
    await proc.close()
    for _ in range(50):
        if not _pending_pumps():
            break
        await asyncio.sleep(0.01)
    assert _pending_pumps() == []
