"""Read-your-writes overlay: one resourceVersion rule (integers per KEP-5504; not comparable -> cache)."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, OwnWrites

pytestmark = pytest.mark.unit


def obj(rv: str, name: str = "sb", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, **extra}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_our_answer_stands_in_while_the_cache_is_older() -> None:
    ow = OwnWrites()
    assert ow.view(SANDBOX, "ns", "sb", obj("1")) == obj("1")  # nothing remembered: the cache
    ow.remember(SANDBOX, obj("3", a=2))
    assert ow.view(SANDBOX, "ns", "sb", obj("1")) == obj("3", a=2)
    # An older version we never saw (someone else's write before ours) is older all the same: our
    # answer already contains it.
    assert ow.view(SANDBOX, "ns", "sb", obj("2")) == obj("3", a=2)
    assert ow.view(SANDBOX, "ns", "sb", obj("3")) == obj("3")  # caught up: entry dropped
    assert len(ow) == 0


def test_a_newer_cache_wins_and_drops_the_entry() -> None:
    ow = OwnWrites()
    ow.remember(SANDBOX, obj("2"))
    assert ow.view(SANDBOX, "ns", "sb", obj("9")) == obj("9")
    assert ow.view(SANDBOX, "ns", "sb", obj("1")) == obj("1")


def test_versions_compare_as_integers_not_strings() -> None:
    ow = OwnWrites()
    ow.remember(SANDBOX, obj("10"))
    assert ow.view(SANDBOX, "ns", "sb", obj("9")) == obj("10")  # "9" > "10" as strings


def test_incomparable_versions_trust_the_cache() -> None:
    ow = OwnWrites()
    ow.remember(SANDBOX, obj("opaque-b"))
    assert ow.view(SANDBOX, "ns", "sb", obj("opaque-a")) == obj("opaque-a")
    assert len(ow) == 0


def test_absent_from_cache_is_served_until_the_ttl() -> None:
    clock = Clock()
    ow = OwnWrites(ttl=30.0, clock=clock)
    ow.remember(SANDBOX_CLAIM, obj("5", name="c"))
    assert ow.view(SANDBOX_CLAIM, "ns", "c", None) == obj("5", name="c")
    assert ow.view(SANDBOX, "ns", "c", None) is None  # kinds are separate
    clock.t += 31
    assert ow.view(SANDBOX_CLAIM, "ns", "c", None) is None
    assert len(ow) == 0


def test_an_older_answer_never_replaces_a_newer_one_and_forget_drops() -> None:
    ow = OwnWrites()
    ow.remember(SANDBOX, obj("7", a="new"))
    ow.remember(SANDBOX, obj("6", a="late echo"))
    assert ow.view(SANDBOX, "ns", "sb", obj("1")) == obj("7", a="new")
    ow.forget(SANDBOX, "ns", "sb")
    assert ow.view(SANDBOX, "ns", "sb", obj("1")) == obj("1")


def test_sweep_bounds_memory() -> None:
    clock = Clock()
    ow = OwnWrites(ttl=1.0, clock=clock, max_entries=2)
    ow.remember(SANDBOX, obj("1", name="a"))
    ow.remember(SANDBOX, obj("1", name="b"))
    clock.t += 2
    ow.remember(SANDBOX, obj("1", name="c"))  # over the bound: expired entries go
    assert len(ow) == 1


def test_answers_never_read_again_expire_without_reaching_the_bound() -> None:
    # A write's answer can arrive after the object's delete event (other connection): nothing reads or
    # forgets it again. Such answers must go once expired, not pile up until max_entries (whole objects).
    clock = Clock()
    ow = OwnWrites(ttl=30.0, clock=clock)
    for i in range(1000):
        ow.remember(SANDBOX_CLAIM, obj("5", name=f"deleted-{i}"))
        clock.t += 0.01
    assert len(ow) == 1000  # all younger than the ttl: kept
    clock.t += 31
    ow.remember(SANDBOX_CLAIM, obj("5", name="live"))
    assert len(ow) == 1
    assert ow.view(SANDBOX_CLAIM, "ns", "live", None) == obj("5", name="live")
