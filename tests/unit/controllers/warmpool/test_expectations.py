"""The over-creation guard as the warm pool uses it (controllers spec §3.6; upstream warmpool_expectations_test)."""

from __future__ import annotations

import asyncio
import random

import pytest

from agent_sandbox.kube import Expectations
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit

K = "ns/pool"


def test_create_lifecycle_and_non_positive_rejected() -> None:
    exp = Expectations(clock=FakeClock())
    assert exp.satisfied(K)
    assert not exp.try_expect_creations(K, 0)
    assert not exp.try_expect_creations(K, -1)
    assert exp.try_expect_creations(K, 2)
    assert not exp.satisfied(K)
    assert not exp.try_expect_creations(K, 1)  # earlier creates not yet observed
    exp.creation_observed(K)
    assert not exp.satisfied(K)
    exp.creation_observed(K)
    assert exp.satisfied(K)
    exp.creation_observed(K)  # floor at zero, no record resurrected
    assert exp.satisfied(K)


def test_failed_creates_are_lowered() -> None:
    exp = Expectations(clock=FakeClock())
    assert exp.try_expect_creations(K, 5)
    exp.lower_creations(K, 3)
    exp.creation_observed(K)
    exp.creation_observed(K)
    assert exp.satisfied(K)


def test_delete_lifecycle_by_uid_and_empty_uid_ignored() -> None:
    exp = Expectations(clock=FakeClock())
    exp.expect_deletion(K, "")
    assert exp.satisfied(K)
    assert not exp.is_pending_deletion(K, "")
    exp.expect_deletion(K, "a")
    exp.expect_deletion(K, "b")
    assert exp.is_pending_deletion(K, "a")
    assert not exp.satisfied(K)
    exp.deletion_observed(K, "a")
    exp.deletion_observed(K, "zzz")
    assert not exp.is_pending_deletion(K, "a")
    assert not exp.satisfied(K)
    exp.deletion_observed(K, "b")
    assert exp.satisfied(K)


def test_records_expire_after_five_minutes_and_raises_refresh_them() -> None:
    clock = FakeClock()
    exp = Expectations(clock=clock)
    assert exp.try_expect_creations(K, 1)
    clock.advance(200)
    exp.expect_deletion(K, "u")  # a new raise refreshes the timer
    clock.advance(200)
    assert not exp.satisfied(K)
    assert exp.is_pending_deletion(K, "u")
    clock.advance(101)
    assert not exp.is_pending_deletion(K, "u")
    assert exp.satisfied(K)  # trust the cache again


def test_forget() -> None:
    exp = Expectations(clock=FakeClock())
    exp.try_expect_creations(K, 3)
    exp.expect_deletion(K, "u")
    exp.forget(K)
    assert exp.satisfied(K)
    assert not exp.is_pending_deletion(K, "u")


async def test_concurrent_try_expect_has_exactly_one_winner() -> None:
    exp = Expectations(clock=FakeClock())

    async def contender() -> bool:
        await asyncio.sleep(random.random() / 1000)
        return exp.try_expect_creations(K, 3)

    results = await asyncio.gather(*(contender() for _ in range(50)))
    assert sum(results) == 1


async def test_mixed_concurrent_operations_settle() -> None:
    exp = Expectations(clock=FakeClock())
    assert exp.try_expect_creations(K, 20)

    async def observe(i: int) -> None:
        await asyncio.sleep(random.random() / 1000)
        exp.expect_deletion(K, f"u{i}")
        exp.creation_observed(K)
        await asyncio.sleep(random.random() / 1000)
        exp.deletion_observed(K, f"u{i}")

    await asyncio.gather(*(observe(i) for i in range(20)))
    assert exp.satisfied(K)
