"""StopReport: a slow stop logs where every thread and task waits; a quick one logs nothing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_sandbox.kube._stopreport import StopReport, task_await_chain

pytestmark = pytest.mark.unit


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


async def test_the_await_chain_names_each_coroutine_down_to_the_future() -> None:
    gate = asyncio.Event()
    task = asyncio.create_task(_outer(gate), name="waiter")
    await asyncio.sleep(0)
    chain = task_await_chain(task)
    gate.set()
    await task
    assert [line.rsplit(" in ", 1)[-1] for line in chain[:3]] == ["_outer", "_inner", "wait"]
    assert chain[-1].startswith("awaiting Future"), chain


async def test_a_stop_running_past_the_bound_logs_the_stacks_of_threads_and_tasks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = asyncio.Event()
    stuck = asyncio.create_task(_outer(gate), name="stuck-runnable")
    report = StopReport(0.05)
    with caplog.at_level(logging.WARNING, logger="agent_sandbox.kube.manager"):
        report.arm()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(caplog.records) >= 2:
                break
    report.cancel()
    gate.set()
    await stuck
    threads, tasks = caplog.records[:2]
    assert "thread stacks follow" in threads.getMessage()
    assert "thread MainThread" in threads.stacks  # type: ignore[attr-defined]
    assert "tasks pending" in tasks.getMessage()
    assert "task stuck-runnable:" in tasks.stacks  # type: ignore[attr-defined]
    assert "in _inner" in tasks.stacks  # type: ignore[attr-defined]


async def test_a_stop_that_finishes_in_time_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    report = StopReport(0.1)
    with caplog.at_level(logging.WARNING, logger="agent_sandbox.kube.manager"):
        report.arm()
        await asyncio.sleep(0.01)
        report.cancel()
        await asyncio.sleep(0.2)
    assert caplog.records == []


async def test_zero_disables_the_report(caplog: pytest.LogCaptureFixture) -> None:
    report = StopReport(0)
    with caplog.at_level(logging.WARNING, logger="agent_sandbox.kube.manager"):
        report.arm()
        await asyncio.sleep(0.05)
    assert caplog.records == []
