"""Warm queue (controllers spec §4.2, §4.5.2; upstream simple_sandbox_queue_test.go and the strategy tests)."""

from __future__ import annotations

import asyncio
import random

import pytest

from agent_sandbox.api.meta import pool_key
from agent_sandbox.controllers.claim.adoption import Verdict
from agent_sandbox.controllers.claim.queue import WarmQueue

pytestmark = pytest.mark.unit

Q = pool_key("ns", "pool")


def adopt_all(_: str) -> Verdict:
    return Verdict.ADOPT


def test_fifo_and_dedupe_keeps_position_and_refreshes_node() -> None:
    q = WarmQueue()
    for name in ("a", "b", "c"):
        q.add(Q, name)
    q.add(Q, "a")  # duplicate: no second entry, place kept
    assert q.names(Q) == ["a", "b", "c"]
    q.add(Q, "b", "node-1")  # nodeName refresh in place; now the only scheduled key is picked first
    assert q.names(Q) == ["b", "a", "c"]
    assert q.size(Q) == 3


def test_take_is_fifo_and_removes_the_picked_key_only() -> None:
    q = WarmQueue()
    for name in ("a", "b", "c"):
        q.add(Q, name)
    assert q.take(Q, adopt_all).name == "a"
    assert q.names(Q) == ["b", "c"]
    assert q.take(Q, adopt_all).name == "b"


def test_remove_item_removes_ghosts_and_remove_queue_drops_everything() -> None:
    q = WarmQueue()
    q.add(Q, "a", "n1")
    q.add(Q, "b")
    q.remove(Q, "a")
    q.remove(Q, "missing")  # no-op
    assert q.names(Q) == ["b"]
    q.remove_queue(Q)
    assert q.names(Q) == []
    assert len(q) == 0
    assert q.take(Q, adopt_all).name is None


def test_queue_names_are_namespaced() -> None:
    q = WarmQueue()
    q.add(pool_key("ns-a", "pool"), "x")
    assert q.take("pool", adopt_all).name is None  # a bare pool name matches nothing
    assert q.take(pool_key("ns-b", "pool"), adopt_all).name is None
    assert q.take(pool_key("ns-a", "pool"), adopt_all).name == "x"


def test_node_spread_picks_the_node_with_most_remaining_candidates() -> None:
    q = WarmQueue()
    q.add(Q, "a1", "node-a")
    q.add(Q, "b1", "node-b")
    q.add(Q, "b2", "node-b")
    q.add(Q, "u1")  # unscheduled keys come after all scheduled ones
    assert q.names(Q) == ["b1", "a1", "b2", "u1"]  # b has 2 -> b1; then tie 1/1 -> first in queue order
    assert q.take(Q, adopt_all).name == "b1"


def test_node_move_restores_queue_order_within_the_new_node() -> None:
    q = WarmQueue()
    q.add(Q, "old", "")
    q.add(Q, "new", "n1")
    q.add(Q, "old", "n1")  # scheduled later, but queued earlier: it stays first on n1
    assert q.names(Q) == ["old", "new"]


def test_take_prefers_ready_skips_pending_and_discards_dead_keys() -> None:
    q = WarmQueue()
    for name in ("gone", "noip", "unready", "ready", "ready2"):
        q.add(Q, name)
    verdicts = {
        "gone": Verdict.DISCARD,
        "noip": Verdict.PENDING,
        "unready": Verdict.FALLBACK,
        "ready": Verdict.ADOPT,
        "ready2": Verdict.ADOPT,
    }
    took = q.take(Q, verdicts.__getitem__)
    assert took.name == "ready"  # a younger Ready member beats an older unready one
    assert q.names(Q) == ["noip", "unready", "ready2"]  # the dead key is gone, the rest keep their places


def test_take_falls_back_to_first_networked_unready_and_reports_pending() -> None:
    q = WarmQueue()
    for name in ("p1", "u1", "u2", "p2"):
        q.add(Q, name)
    verdicts = {"p1": Verdict.PENDING, "u1": Verdict.FALLBACK, "u2": Verdict.FALLBACK, "p2": Verdict.PENDING}
    took = q.take(Q, verdicts.__getitem__)
    assert (took.name, took.pending) == ("u1", 2)
    took = q.take(Q, {"p1": Verdict.PENDING, "u2": Verdict.KEEP, "p2": Verdict.PENDING}.__getitem__)
    assert (took.name, took.pending) == (None, 2)
    assert q.names(Q) == ["p1", "u2", "p2"]


def test_reserved_keys_are_invisible_until_released() -> None:
    q = WarmQueue()
    for name in ("a", "b"):
        q.add(Q, name)
    assert q.take(Q, adopt_all).name == "a"
    q.add(Q, "a", "n9")  # an informer update while in flight must not hand it out again
    assert q.names(Q) == ["b"]
    q.release(Q, "a", requeue=True)  # lost nothing: back in its old place, with the refreshed node
    assert q.names(Q) == ["a", "b"]
    assert q.take(Q, adopt_all).name == "a"
    q.remove(Q, "a")  # deleted while reserved: a later requeue must not resurrect it
    q.release(Q, "a", requeue=True)
    assert q.names(Q) == ["b"]


async def test_concurrent_takers_never_share_a_candidate() -> None:
    """200 claim workers race for 100 members (with informer refreshes interleaved): no double assignment."""
    q = WarmQueue()
    members = [f"m{i:03d}" for i in range(100)]
    for i, name in enumerate(members):
        q.add(Q, name, f"node-{i % 7}")
    got: list[str | None] = []
    rng = random.Random(7)

    async def worker(i: int) -> None:
        await asyncio.sleep(rng.random() / 1000)
        took = q.take(Q, adopt_all)
        if took.name is not None and i % 5 == 0:
            q.add(Q, took.name, "node-x")  # a status update lands while the takeover is in flight
            await asyncio.sleep(0)
            q.release(Q, took.name, requeue=False)
        elif took.name is not None:
            await asyncio.sleep(rng.random() / 1000)
            q.release(Q, took.name, requeue=False)
        got.append(took.name)

    await asyncio.gather(*(worker(i) for i in range(200)))
    taken = [n for n in got if n is not None]
    assert len(taken) == 100
    assert sorted(taken) == members  # every member exactly once
    assert got.count(None) == 100
    assert len(q) == 0
