"""Slow-start batching (controllers spec §3.6)."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.controllers.warmpool.batch import slow_start_batch

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self, fail_at: set[int] | None = None) -> None:
        self.calls: list[int] = []
        self.in_flight = 0
        self.batches: list[int] = []
        self.fail_at = fail_at or set()

    async def __call__(self, i: int) -> None:
        self.calls.append(i)
        self.in_flight += 1
        await asyncio.sleep(0)
        if self.in_flight:
            self.batches.append(self.in_flight)
        self.in_flight = 0
        if i in self.fail_at:
            raise RuntimeError(f"fail {i}")


async def test_batches_double_and_are_trimmed_to_the_remainder() -> None:
    rec = Recorder()
    assert await slow_start_batch(10, rec) == (10, None)
    assert sorted(rec.calls) == list(range(10))
    assert [b for b in rec.batches] == [1, 2, 4, 3]


async def test_zero_count_does_nothing() -> None:
    rec = Recorder()
    assert await slow_start_batch(0, rec) == (0, None)
    assert rec.calls == []


async def test_stops_after_the_first_failing_batch() -> None:
    rec = Recorder(fail_at={4})
    successes, err = await slow_start_batch(20, rec)
    # Batches: [0], [1, 2], [3, 4, 5, 6] (4 fails) -> stop; 6 successes.
    assert successes == 6
    assert isinstance(err, RuntimeError)
    assert sorted(rec.calls) == list(range(7))


async def test_cancellation_propagates() -> None:
    started = asyncio.Event()

    async def slow(_: int) -> None:
        started.set()
        await asyncio.sleep(10)

    task = asyncio.create_task(slow_start_batch(5, slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
