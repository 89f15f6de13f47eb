"""StopReport: a slow stop logs where every thread and task waits; a quick one logs nothing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent_sandbox.kube import Cache, Manager, ManagerOptions
from agent_sandbox.kube._stopreport import StopReport, task_await_chain
from agent_sandbox.kube.testing import FakeClient

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


class _SlowToStop:
    """A leader-gated runnable whose drain outlasts the report's bound (cancellation is not instant)."""

    name = "slow-drain"

    def __init__(self, drain: float) -> None:
        self.drain = drain
        self.started = asyncio.Event()

    async def start(self) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(self.drain)  # in-flight work finishing (the manager waits for it)


def _manager(after: float) -> Manager:
    fake = FakeClient()
    opts = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        stop_report_after=after,
        new_cache=lambda _api, o: Cache(fake, o),
    )
    return Manager(fake, opts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("drain", "reported"), [(0.4, True), (0.0, False)])
async def test_the_manager_reports_a_stop_that_outlasts_the_bound_and_only_such_a_stop(
    caplog: pytest.LogCaptureFixture, drain: float, reported: bool
) -> None:
    mgr = _manager(0.1)
    slow = _SlowToStop(drain)
    mgr.add(slow)
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="agent_sandbox.kube.manager"):
        task = asyncio.create_task(mgr.start(stop))
        await asyncio.wait_for(slow.started.wait(), 5)
        await asyncio.sleep(0.2)  # running longer than the bound is no stop: nothing reported
        assert not [r for r in caplog.records if "stop still running" in r.getMessage()]
        stop.set()
        await asyncio.wait_for(task, 10)
        await asyncio.sleep(0.2)  # a report armed and not cancelled would fire by now
    reports = [r for r in caplog.records if "stop still running" in r.getMessage()]
    if not reported:
        assert reports == []
        return
    assert any("task slow-drain:" in getattr(r, "stacks", "") for r in reports), reports
