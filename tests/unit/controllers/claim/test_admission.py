"""Cold-start admission: a bound on cold starts in flight, admitted in arrival order (pure bookkeeping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agent_sandbox.controllers.claim.admission import ColdStartAdmission, past_scheduling
from agent_sandbox.kube import Request

T0 = datetime(2026, 12, 2, tzinfo=UTC)


def arrival(i: int) -> tuple[datetime, str, str]:
    return (T0 + timedelta(milliseconds=i), "ns", f"c{i}")


def req(i: int) -> Request:
    return Request("ns", f"c{i}")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_no_limit_admits_everyone_and_tracks_nothing() -> None:
    gate = ColdStartAdmission(0)
    assert all(gate.admit(req(i), arrival(i)) for i in range(100))
    assert (gate.in_flight, gate.waiting) == (0, 0)
    assert gate.settle(req(3)) == []


def test_admits_up_to_the_limit_then_queues() -> None:
    gate = ColdStartAdmission(2)
    assert [gate.admit(req(i), arrival(i)) for i in range(4)] == [True, True, False, False]
    assert (gate.in_flight, gate.waiting) == (2, 2)
    assert gate.admit(req(0), arrival(0))  # a re-pass of an admitted claim keeps its slot


def test_a_freed_slot_goes_to_the_oldest_waiter_and_a_newer_claim_cannot_overtake_it() -> None:
    gate = ColdStartAdmission(1)
    assert gate.admit(req(0), arrival(0))
    assert not gate.admit(req(2), arrival(2))
    assert not gate.admit(req(1), arrival(1))  # seen later, arrived earlier
    assert gate.settle(req(0)) == [req(1)]
    assert not gate.admit(req(2), arrival(2))  # its pass ran first, but c1 is older
    assert not gate.admit(req(3), arrival(3))
    assert gate.admit(req(1), arrival(1))
    assert gate.settle(req(1)) == [req(2)]


def test_settle_wakes_as_many_waiters_as_there_are_free_slots() -> None:
    gate = ColdStartAdmission(3)
    for i in range(3):
        assert gate.admit(req(i), arrival(i))
    for i in range(3, 8):
        assert not gate.admit(req(i), arrival(i))
    assert gate.settle(req(1)) == [req(3)]
    assert gate.settle(req(0)) == [req(3), req(4)]  # c3 has not taken its slot yet: still first
    assert gate.admit(req(3), arrival(3))
    assert gate.admit(req(4), arrival(4))
    assert gate.next_up() == []


def test_a_waiter_that_settles_otherwise_leaves_the_queue() -> None:
    gate = ColdStartAdmission(1)
    assert gate.admit(req(0), arrival(0))
    assert not gate.admit(req(1), arrival(1))
    assert not gate.admit(req(2), arrival(2))
    assert gate.settle(req(1)) == []  # took a warm member: no slot freed
    assert gate.settle(req(0)) == [req(2)]
    assert gate.waiting == 1
    assert gate.settle(req(9)) == []  # never seen


def test_a_slot_held_past_max_hold_is_freed() -> None:
    clock = Clock()
    gate = ColdStartAdmission(1, max_hold=30.0, clock=clock)
    assert gate.admit(req(0), arrival(0))  # its Pod never schedules
    assert not gate.admit(req(1), arrival(1))
    clock.now = 29.9
    assert gate.next_up() == []
    clock.now = 30.0
    assert gate.next_up() == [req(1)]
    assert gate.admit(req(1), arrival(1))
    assert gate.in_flight == 1


def test_the_first_arrival_recorded_is_kept() -> None:
    gate = ColdStartAdmission(1)
    assert gate.admit(req(0), arrival(0))
    assert not gate.admit(req(5), arrival(1))
    assert not gate.admit(req(6), arrival(2))
    assert not gate.admit(req(5), arrival(9))  # a later pass with a later "first observed": ignored
    assert gate.settle(req(0)) == [req(5)]


def condition(kind: str, status: str) -> dict[str, object]:
    return {"status": {"conditions": [{"type": kind, "status": status}]}}


def test_past_scheduling() -> None:
    assert not past_scheduling({})
    assert not past_scheduling(condition("PodScheduled", "False"))
    assert not past_scheduling(condition("Ready", "False"))
    assert past_scheduling(condition("PodScheduled", "True"))
    assert past_scheduling(condition("Ready", "True"))
