"""WorkQueue semantics (client-go workqueue): dedup, one worker per key, delays, backoff, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.kube import ItemExponentialFailureRateLimiter, WorkQueue
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit


def _queue(clock: FakeClock | None = None) -> WorkQueue[str]:
    return WorkQueue(
        "test",
        rate_limiter=ItemExponentialFailureRateLimiter(0.005, 1000.0),
        clock=clock or FakeClock(),
        metrics=False,
    )


async def test_duplicate_adds_collapse_and_order_is_fifo() -> None:
    q = _queue()
    for key in ("a", "b", "a", "c", "b"):
        q.add(key)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_key_is_never_handed_to_two_workers_at_once() -> None:
    q = _queue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")  # re-added while in flight: parked, not queued
    assert len(q) == 0
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.done("a")  # now it is queued again and handed out
    assert await asyncio.wait_for(getter, 1) == "a"
    q.done("a")
    assert len(q) == 0


async def test_many_workers_never_overlap_on_a_key() -> None:
    q = _queue()
    active: set[str] = set()
    overlaps = 0
    processed = 0

    async def worker() -> None:
        nonlocal overlaps, processed
        while (key := await q.get()) is not None:
            if key in active:
                overlaps += 1
            active.add(key)
            await asyncio.sleep(0)
            if processed < 200:
                q.add(key)  # re-add during processing, as watch events do
            await asyncio.sleep(0)
            active.discard(key)
            processed += 1
            q.done(key)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for i in range(20):
        q.add(f"k{i % 4}")
    while True:
        if processed >= 200:
            break
        await asyncio.sleep(0)
    q.shutdown()
    await asyncio.gather(*workers)
    assert overlaps == 0


async def test_waiting_getter_is_woken_by_add() -> None:
    q = _queue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"


async def test_add_after_waits_for_the_clock_and_earliest_deadline_wins() -> None:
    clock = FakeClock()
    q = _queue(clock)
    q.add_after("a", 10.0)
    q.add_after("a", 5.0)  # earlier: replaces
    q.add_after("a", 7.0)  # later: ignored
    assert q.delayed == 1
    clock.advance(4.9)
    assert len(q) == 0
    clock.advance(0.1)
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    clock.advance(100)
    assert len(q) == 0  # the replaced timers do not fire again


async def test_add_after_zero_adds_now() -> None:
    q = _queue()
    q.add_after("a", 0)
    assert len(q) == 1


async def test_rate_limited_backoff_doubles_and_forget_resets() -> None:
    clock = FakeClock()
    q = _queue(clock)
    delays = []
    for _ in range(4):
        start = clock.now()
        q.add_rate_limited("a")
        deadline = clock.next_deadline()
        assert deadline is not None
        delays.append(round(deadline - start, 6))
        clock.advance(deadline - start)
        assert await q.get() == "a"
        q.done("a")
    assert delays == [0.005, 0.01, 0.02, 0.04]
    assert q.num_requeues("a") == 4
    q.forget("a")
    assert q.num_requeues("a") == 0
    q.add_rate_limited("a")
    assert clock.next_deadline() == pytest.approx(clock.now() + 0.005)


async def test_shutdown_wakes_getters_drops_waiting_and_refuses_adds() -> None:
    clock = FakeClock()
    q = _queue(clock)
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.add_after("later", 1.0)
    q.shutdown()
    assert await asyncio.gather(*getters) == [None, None, None]
    q.add("x")
    clock.advance(5)
    assert len(q) == 0
    assert await q.get() is None


async def test_shutdown_drops_queued_keys_and_drains_in_flight() -> None:
    q = _queue()
    q.add("a")
    q.add("b")
    assert await q.get() == "a"
    q.shutdown()
    assert len(q) == 0
    drained = asyncio.create_task(q.wait_drained())
    await asyncio.sleep(0)
    assert not drained.done()
    q.add("a")  # refused: no re-queue after done
    q.done("a")
    await asyncio.wait_for(drained, 1)
    assert len(q) == 0


async def test_cancelled_getter_does_not_strand_a_key() -> None:
    q = _queue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("a")  # wakes `first`...
    first.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, 1) == "a"


async def test_metrics_are_published_per_queue_name() -> None:
    from agent_sandbox.kube.metrics import REGISTRY

    q: WorkQueue[str] = WorkQueue("metrics-test", clock=FakeClock())
    q.add("a")
    q.add("a")
    assert (
        REGISTRY.get_sample_value(
            "workqueue_adds_total", {"name": "metrics-test", "controller": "metrics-test"}
        )
        == 1
    )
    assert (
        REGISTRY.get_sample_value("workqueue_depth", {"name": "metrics-test", "controller": "metrics-test"})
        == 1
    )
    await q.get()
    assert (
        REGISTRY.get_sample_value("workqueue_depth", {"name": "metrics-test", "controller": "metrics-test"})
        == 0
    )
    q.add_rate_limited("a")
    assert (
        REGISTRY.get_sample_value(
            "workqueue_retries_total", {"name": "metrics-test", "controller": "metrics-test"}
        )
        == 1
    )
