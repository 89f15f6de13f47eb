"""Expectations (controllers spec §3.6): the over-creation guard."""

from __future__ import annotations

import pytest

from agent_sandbox.kube import Expectations
from agent_sandbox.kube.testing import FakeClock

pytestmark = pytest.mark.unit


def _exp() -> tuple[Expectations, FakeClock]:
    clock = FakeClock()
    return Expectations(ttl=300.0, clock=clock), clock


def test_no_record_is_satisfied() -> None:
    exp, _ = _exp()
    assert exp.satisfied("pool")
    assert exp.pending("pool") == (0, frozenset())


def test_try_expect_creations_is_exclusive_until_observed() -> None:
    exp, _ = _exp()
    assert not exp.try_expect_creations("pool", 0)
    assert exp.try_expect_creations("pool", 3)
    assert not exp.satisfied("pool")
    assert not exp.try_expect_creations("pool", 1)  # an overlapping pass loses
    exp.creation_observed("pool")
    exp.lower_creations("pool", 1)
    assert not exp.satisfied("pool")
    exp.creation_observed("pool")
    assert exp.satisfied("pool")
    assert exp.try_expect_creations("pool", 1)


def test_lower_creations_floors_at_zero_and_ignores_unknown_keys() -> None:
    exp, _ = _exp()
    exp.lower_creations("nobody", 5)
    assert exp.try_expect_creations("pool", 2)
    exp.lower_creations("pool", 10)
    assert exp.satisfied("pool")
    assert exp.pending("pool") == (0, frozenset())


def test_deletions_by_uid() -> None:
    exp, _ = _exp()
    exp.expect_deletion("pool", "")  # ignored
    assert exp.satisfied("pool")
    exp.expect_deletion("pool", "u1")
    exp.expect_deletion("pool", "u2")
    assert exp.is_pending_deletion("pool", "u1")
    assert not exp.is_pending_deletion("pool", "")
    assert not exp.is_pending_deletion("pool", "u3")
    assert not exp.satisfied("pool")
    exp.deletion_observed("pool", "u1")
    assert not exp.satisfied("pool")
    exp.deletion_observed("pool", "u2")  # e.g. rollback after a failed delete
    assert exp.satisfied("pool")


def test_records_expire_after_ttl_and_the_cache_is_trusted_again() -> None:
    exp, clock = _exp()
    assert exp.try_expect_creations("pool", 5)
    exp.expect_deletion("pool", "u1")
    clock.advance(299)
    assert not exp.satisfied("pool")
    assert exp.is_pending_deletion("pool", "u1")
    clock.advance(2)
    assert not exp.is_pending_deletion("pool", "u1")
    assert exp.satisfied("pool")  # dropped
    assert exp.pending("pool") == (0, frozenset())


def test_expect_deletion_refreshes_raised_at() -> None:
    exp, clock = _exp()
    exp.expect_deletion("pool", "u1")
    clock.advance(200)
    exp.expect_deletion("pool", "u2")
    clock.advance(200)
    assert not exp.satisfied("pool")


def test_forget_drops_the_record() -> None:
    exp, _ = _exp()
    assert exp.try_expect_creations("pool", 5)
    exp.forget("pool")
    assert exp.satisfied("pool")
