"""Controller worker loop: the four-arm outcome switch, concurrency, drain, builder wiring, predicates."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent_sandbox.kube import (
    CONFIG_MAP,
    GENERATION_CHANGED,
    POD,
    SANDBOX,
    Builder,
    Cache,
    Controller,
    ItemExponentialFailureRateLimiter,
    NotFound,
    Object,
    ReconcilerFunc,
    Request,
    Result,
    RetryLater,
    TerminalError,
    Waiting,
    has_label,
    requests_for_owner,
)
from agent_sandbox.kube.metrics import REGISTRY
from agent_sandbox.kube.testing import FakeClient, FakeClock

pytestmark = pytest.mark.unit

REQ = Request("ns", "a")


def _ctrl(fn: ReconcilerFunc, clock: FakeClock, name: str = "t", workers: int = 1) -> Controller:
    return Controller(
        name,
        fn,
        workers=workers,
        rate_limiter=ItemExponentialFailureRateLimiter(0.005, 1000.0),
        clock=clock,
        metrics=name != "t",
    )


async def test_success_forgets_backoff() -> None:
    clock = FakeClock()

    async def ok(_: Request) -> Result:
        return Result()

    c = _ctrl(ReconcilerFunc(ok), clock)
    c.queue.add_rate_limited(REQ)  # pretend an earlier failure
    await c.process(REQ)
    assert c.queue.num_requeues(REQ) == 0
    assert clock.pending == 1  # only the pre-existing delayed add, nothing new


async def test_error_requeues_with_backoff_and_ignores_result() -> None:
    clock = FakeClock()

    async def fail(_: Request) -> Result:
        raise NotFound(404, "NotFound", "x")

    c = _ctrl(ReconcilerFunc(fail), clock)
    await c.process(REQ)
    await c.process(REQ)
    assert c.queue.num_requeues(REQ) == 2
    assert clock.next_deadline() == pytest.approx(clock.now() + 0.005)  # first (earliest) retry wins
    clock.advance(0.005)
    assert len(c.queue) == 1


async def test_terminal_error_is_not_retried() -> None:
    clock = FakeClock()

    async def terminal(_: Request) -> Result:
        raise TerminalError("bad spec")

    c = _ctrl(ReconcilerFunc(terminal), clock, name="terminal-test")
    await c.process(REQ)
    assert clock.pending == 0
    assert c.queue.num_requeues(REQ) == 0
    labels = {"controller": "terminal-test"}
    assert REGISTRY.get_sample_value("controller_runtime_terminal_reconcile_errors_total", labels) == 1
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_total", {**labels, "result": "error"}) == 1


async def test_waiting_retries_with_backoff_logged_at_info_not_counted_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()

    async def wait(_: Request) -> Result:
        raise Waiting("pod x is still terminating")

    c = _ctrl(ReconcilerFunc(wait), clock, name="waiting-test")
    with caplog.at_level("INFO"):
        await c.process(REQ)
    assert c.queue.num_requeues(REQ) == 1
    assert clock.next_deadline() == pytest.approx(clock.now() + 0.005)
    labels = {"controller": "waiting-test"}
    assert (
        REGISTRY.get_sample_value("controller_runtime_reconcile_total", {**labels, "result": "requeue"}) == 1
    )
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_total", {**labels, "result": "error"}) == 0
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total", labels) == 0
    waits = [r for r in caplog.records if "still terminating" in r.getMessage()]
    assert [r.levelname for r in waits] == ["INFO"]


async def test_requeue_after_forgets_and_delays() -> None:
    clock = FakeClock()

    async def later(_: Request) -> Result:
        return Result(requeue_after=30.0)

    c = _ctrl(ReconcilerFunc(later), clock, name="requeue-test")
    c.queue.add_rate_limited(REQ)
    clock.advance(1)
    await c.queue.get()
    await c.process(REQ)
    c.queue.done(REQ)
    assert c.queue.num_requeues(REQ) == 0
    clock.advance(29.9)
    assert len(c.queue) == 0
    clock.advance(0.1)
    assert len(c.queue) == 1
    labels = {"controller": "requeue-test", "result": "requeue_after"}
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_total", labels) == 1


async def test_programming_errors_count_as_panics_and_retry() -> None:
    clock = FakeClock()

    async def bug(_: Request) -> Result:
        return {}["missing"]  # type: ignore[no-any-return]

    c = _ctrl(ReconcilerFunc(bug), clock, name="panic-test")
    await c.process(REQ)
    assert (
        REGISTRY.get_sample_value("controller_runtime_reconcile_panics_total", {"controller": "panic-test"})
        == 1
    )
    assert c.queue.num_requeues(REQ) == 1


async def test_retry_later_is_an_error_but_not_a_panic() -> None:
    clock = FakeClock()

    class NotYet(RetryLater):
        pass

    async def later(_: Request) -> Result:
        raise NotYet("template not there yet")

    c = _ctrl(ReconcilerFunc(later), clock, name="retry-later-test")
    await c.process(REQ)
    labels = {"controller": "retry-later-test"}
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_panics_total", labels) == 0
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total", labels) == 1
    assert c.queue.num_requeues(REQ) == 1


async def test_workers_run_keys_concurrently_but_never_the_same_key_twice() -> None:
    fake = FakeClient(*[(CONFIG_MAP, {"metadata": {"name": f"c{i}", "namespace": "ns"}}) for i in range(10)])
    cache = Cache(fake)
    active: set[Request] = set()
    peak = 0
    overlap = 0
    done: list[Request] = []

    async def slow(req: Request) -> Result:
        nonlocal peak, overlap
        overlap += req in active
        active.add(req)
        peak = max(peak, len(active))
        await asyncio.sleep(0.01)
        active.discard(req)
        done.append(req)
        return Result()

    c = Controller("conc", ReconcilerFunc(slow), workers=4, metrics=False)
    c.watch(cache.informer(CONFIG_MAP), lambda o: [Request("ns", o["metadata"]["name"])])
    cache_task = asyncio.create_task(cache.start())
    ctrl_task = asyncio.create_task(c.start())
    async with asyncio.timeout(5):
        while len(done) < 10:
            for i in range(10):  # hammer the same keys while they are being processed
                c.queue.add(Request("ns", f"c{i}"))
            await asyncio.sleep(0.002)
    ctrl_task.cancel()
    cache_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await ctrl_task
    with contextlib.suppress(asyncio.CancelledError):
        await cache_task
    assert overlap == 0
    assert peak == 4


async def test_cancellation_drains_in_flight_reconciles() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    finished: list[Request] = []

    async def blocking(req: Request) -> Result:
        started.set()
        await release.wait()
        finished.append(req)
        return Result()

    c = Controller("drain", ReconcilerFunc(blocking), workers=2, metrics=False, drain_timeout=5)
    task = asyncio.create_task(c.start())
    c.queue.add(REQ)
    c.queue.add(Request("ns", "queued-but-not-started"))
    c.queue.add(Request("ns", "third"))
    await asyncio.wait_for(started.wait(), 1)
    task.cancel()
    await asyncio.sleep(0.01)
    assert not task.done()  # waiting for the in-flight reconciles
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert REQ in finished
    assert len(finished) == 2  # the two in flight; the queued key was dropped


async def test_builder_wires_for_owns_watches_with_predicates() -> None:
    owner_ref = {
        "apiVersion": "agents.x-k8s.io/v1alpha1",
        "kind": "Sandbox",
        "name": "sb",
        "controller": True,
    }
    fake = FakeClient(
        (SANDBOX, {"metadata": {"name": "sb", "namespace": "ns"}}),
        (
            POD,
            {
                "metadata": {
                    "name": "p1",
                    "namespace": "ns",
                    "labels": {"t": "1"},
                    "ownerReferences": [owner_ref],
                }
            },
        ),
        (POD, {"metadata": {"name": "p2", "namespace": "ns", "ownerReferences": [owner_ref]}}),  # no label
        (CONFIG_MAP, {"metadata": {"name": "cm", "namespace": "ns"}}),
    )
    cache = Cache(fake)
    added: list[object] = []

    class Mgr:
        def __init__(self) -> None:
            self.cache = cache

        def add(self, r: object) -> None:
            added.append(r)

    seen: list[Request] = []

    async def rec(req: Request) -> Result:
        seen.append(req)
        return Result()

    ctrl = (
        Builder(Mgr())
        .for_(SANDBOX)
        .owns(POD, has_label("t"))
        .watches(CONFIG_MAP, lambda o: [Request("ns", "from-cm")])
        .with_options(workers=2)
        .complete(ReconcilerFunc(rec))
    )
    assert added == [ctrl]
    assert ctrl.name == "sandbox"
    assert ctrl.workers == 2
    cache_task = asyncio.create_task(cache.start())
    await asyncio.wait_for(cache.wait_for_sync(), 5)
    ctrl_task = asyncio.create_task(ctrl.start())
    async with asyncio.timeout(5):
        while True:
            if len(set(seen)) >= 2:
                break
            await asyncio.sleep(0.001)
    ctrl_task.cancel()
    cache_task.cancel()
    await asyncio.gather(ctrl_task, cache_task, return_exceptions=True)
    # p1 maps to its owner (version-agnostic); p2 is filtered out by has_label; cm maps by function.
    assert set(seen) == {Request("ns", "sb"), Request("ns", "from-cm")}


def test_requests_for_owner_matches_group_and_kind_not_version() -> None:
    mapper = requests_for_owner(SANDBOX)
    ref = {"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox", "name": "sb", "controller": True}
    obj: Object = {"metadata": {"name": "p", "namespace": "ns", "ownerReferences": [ref]}}
    assert list(mapper(obj)) == [Request("ns", "sb")]
    other_group = {**ref, "apiVersion": "other.io/v1beta1"}
    not_controller = {**ref, "controller": False}
    for bad in (other_group, not_controller):
        assert list(mapper({"metadata": {"name": "p", "namespace": "ns", "ownerReferences": [bad]}})) == []


def test_generation_changed_predicate() -> None:
    old: Object = {"metadata": {"generation": 1, "resourceVersion": "1"}}
    status_only: Object = {"metadata": {"generation": 1, "resourceVersion": "2"}}
    spec_change: Object = {"metadata": {"generation": 2, "resourceVersion": "3"}}
    assert not GENERATION_CHANGED.update(old, status_only)
    assert GENERATION_CHANGED.update(old, spec_change)
    assert GENERATION_CHANGED.create(old)
