"""Claim status and expiry arithmetic (controllers spec §4.9, §4.10)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import find_condition
from agent_sandbox.controllers.claim.errors import (
    AdoptionConflict,
    InvalidMetadata,
    ReconcilerError,
    SandboxCreatePending,
    SandboxNotOwned,
    TemplateNotFound,
    WarmPoolNotFound,
)
from agent_sandbox.controllers.claim.status import compute_status, expiry, ready_condition, status_equal
from tests.unit.controllers.claim.builders import T0, claim, member, ready_cond, ts

pytestmark = pytest.mark.unit


def _finished(at: datetime = T0) -> dict[str, Any]:
    return {
        "type": "Finished",
        "status": "True",
        "reason": "PodSucceeded",
        "message": "",
        "lastTransitionTime": ts(at),
    }


EXPIRY = [
    ("no lifecycle", {}, None, (False, None)),
    ("shutdown in future", {"shutdownTime": ts(T0 + timedelta(seconds=30))}, None, (False, 30.0)),
    ("shutdown passed", {"shutdownTime": ts(T0 - timedelta(seconds=1))}, None, (True, -1.0)),
    ("ttl without Finished", {"ttlSecondsAfterFinished": 10}, None, (False, None)),
    (
        "ttl after Finished",
        {"ttlSecondsAfterFinished": 10},
        _finished(T0 - timedelta(seconds=4)),
        (False, 6.0),
    ),
    ("ttl 0 expires at once", {"ttlSecondsAfterFinished": 0}, _finished(T0), (True, 0.0)),
    (
        "earliest wins",
        {"ttlSecondsAfterFinished": 100, "shutdownTime": ts(T0 + timedelta(seconds=5))},
        _finished(T0),
        (False, 5.0),
    ),
    (
        "Finished False ignored",
        {"ttlSecondsAfterFinished": 0},
        {**_finished(), "status": "False"},
        (False, None),
    ),
]


@pytest.mark.parametrize(("case", "lifecycle", "finished", "want"), EXPIRY, ids=[e[0] for e in EXPIRY])
def test_expiry(
    case: str, lifecycle: dict[str, Any], finished: dict[str, Any] | None, want: tuple[bool, float | None]
) -> None:
    kw: dict[str, Any] = {"lifecycle": lifecycle} if lifecycle else {}
    cl = claim(status={"conditions": [finished]} if finished else None, **kw)
    got = expiry(cl, T0)
    assert (got.expired, got.time_left) == want


SB_READY = member("s")
SB_EXPIRED = member("s")
SB_EXPIRED["status"]["conditions"] = [ready_cond("False", c.REASON_SANDBOX_EXPIRED)]
SB_NO_READY = member("s")
SB_NO_READY["status"]["conditions"] = []

READY_ROWS = [
    (
        "template missing",
        None,
        TemplateNotFound("t"),
        False,
        ("False", "TemplateNotFound", 'SandboxTemplate "t" not found'),
    ),
    (
        "pool missing",
        None,
        WarmPoolNotFound("p"),
        False,
        ("False", "WarmPoolNotFound", 'SandboxWarmPool "p" not found'),
    ),
    (
        "adoption conflict",
        SB_READY,
        AdoptionConflict("x"),
        False,
        ("False", "AdoptionConflict", "x; the next pass retries from a converged view"),
    ),
    (
        "create pending",
        None,
        SandboxCreatePending(),
        False,
        ("False", "SandboxCreatePending", "Sandbox already created; waiting for cache to converge"),
    ),
    ("invalid metadata", None, InvalidMetadata("bad"), False, ("False", "InvalidMetadata", "bad")),
    (
        "not owned",
        None,
        SandboxNotOwned("nope"),
        True,
        ("False", "ClaimExpired", "Claim expired. nope; deletion skipped."),
    ),
    ("other error", None, ReconcilerError("boom"), False, ("False", "ReconcilerError", "Error seen: boom")),
    ("expired", SB_READY, None, True, ("False", "ClaimExpired", "Claim expired. Sandbox cleanup initiated.")),
    ("no sandbox", None, None, False, ("False", "SandboxMissing", "Sandbox does not exist")),
    (
        "sandbox expired",
        SB_EXPIRED,
        None,
        False,
        ("False", "SandboxExpired", "Underlying Sandbox resource has expired independently of the Claim."),
    ),
    ("mirrors sandbox", SB_READY, None, False, ("True", "DependenciesReady", "m")),
    ("sandbox without Ready", SB_NO_READY, None, False, ("False", "SandboxNotReady", "Sandbox is not ready")),
]


@pytest.mark.parametrize(
    ("case", "sandbox", "error", "expired", "want"), READY_ROWS, ids=[r[0] for r in READY_ROWS]
)
def test_ready_table(case: str, sandbox: Any, error: Any, expired: bool, want: tuple[str, str, str]) -> None:
    cl = claim()
    cl["metadata"]["generation"] = 7
    cond = ready_condition(cl, sandbox, error, expired=expired)
    assert (cond["status"], cond["reason"], cond["message"]) == want
    assert cond["observedGeneration"] == 7  # always the claim's generation


def test_compute_status_binds_mirrors_finished_and_forwards_transition_time() -> None:
    sb = member("s", ips=("10.0.0.7",))
    sb["status"]["conditions"].append(_finished(T0 + timedelta(seconds=1)))
    new = compute_status(claim(), sb, None, expired=False, now=T0 + timedelta(hours=1))
    assert new is not None
    assert new["sandbox"] == {"name": "s", "podIPs": ["10.0.0.7"]}
    ready = find_condition(new["conditions"], "Ready")
    assert ready is not None
    assert ready["lastTransitionTime"] == sb["status"]["conditions"][0]["lastTransitionTime"]
    assert find_condition(new["conditions"], "Finished") == _finished(T0 + timedelta(seconds=1))


def test_compute_status_keeps_binding_on_transient_errors_clears_on_not_owned() -> None:
    bound = claim(status={"sandbox": {"name": "s", "podIPs": ["1.2.3.4"]}, "conditions": [ready_cond()]})
    kept = compute_status(bound, None, ReconcilerError("api down"), expired=False, now=T0)
    assert kept is not None
    assert kept["sandbox"] == {"name": "s", "podIPs": ["1.2.3.4"]}
    cleared = compute_status(bound, None, SandboxNotOwned("x"), expired=True, now=T0)
    assert cleared is not None
    assert "sandbox" not in cleared
    missing = compute_status(bound, None, None, expired=False, now=T0)
    assert missing is not None
    assert "sandbox" not in missing


def test_compute_status_skipped_on_cache_lag_with_binding() -> None:
    bound = claim(status={"sandbox": {"name": "c1"}})
    assert compute_status(bound, None, SandboxCreatePending(), expired=False, now=T0) is None
    assert compute_status(claim(), None, SandboxCreatePending(), expired=False, now=T0) is not None


def test_compute_status_keeps_finished_after_expired_sandbox_is_gone() -> None:
    cl = claim(status={"conditions": [ready_cond(), _finished()]})
    gone = compute_status(cl, None, None, expired=True, now=T0)
    assert gone is not None
    assert find_condition(gone["conditions"], "Finished") is not None
    active = compute_status(cl, None, None, expired=False, now=T0)
    assert active is not None
    assert find_condition(active["conditions"], "Finished") is None


def test_a_claim_marked_expired_keeps_its_finished_whatever_its_sandbox_shows() -> None:
    """§4.9 step 5 over §4.10 step 2 (docs/lifecycle.md): the Sandbox being torn down may have lost its
    Finished (its Pod gone) or show another one; the claim's own Finished - the TTL's start - stays."""
    lifecycle = {"ttlSecondsAfterFinished": 0}
    mine = _finished(T0 - timedelta(seconds=5))
    expired = claim(
        status={"sandbox": {"name": "s"}, "conditions": [ready_cond("False", c.REASON_CLAIM_EXPIRED), mine]},
        lifecycle=lifecycle,
    )
    terminating = member("s", ready=False, ips=())
    later = member("s")
    later["status"]["conditions"].append(_finished(T0 + timedelta(seconds=5)))
    for sb in (terminating, later):
        new = compute_status(expired, sb, None, expired=True, now=T0)
        assert new is not None
        assert find_condition(new["conditions"], "Finished") == mine
        assert expiry(claim(status=new, lifecycle=lifecycle), T0).expired
    # A claim not marked expired still follows its Sandbox (§4.10 step 2).
    active = claim(status={"sandbox": {"name": "s"}, "conditions": [ready_cond(), mine]}, lifecycle=lifecycle)
    new = compute_status(active, terminating, None, expired=False, now=T0)
    assert new is not None
    assert find_condition(new["conditions"], "Finished") is None


def test_status_equality_ignores_condition_order() -> None:
    a = {"conditions": [ready_cond(), _finished()], "sandbox": {"name": "s"}}
    b = {"conditions": [_finished(), ready_cond()], "sandbox": {"name": "s"}}
    assert status_equal(a, b)
    assert not status_equal(a, {**b, "sandbox": {"name": "t"}})
