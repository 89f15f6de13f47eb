"""Lifecycle decisions at the ends of datetime and of Go durations (controllers/lifecycle/decide.py).

Until December 6 `idle-timeout: "99999999h"` (past Go's longest duration), a huge `hibernate-after`, or a
`last-activity` in year 9999 raised OverflowError in every pass, with no Event. Now a duration beyond Go's is
an unusable setting (off, named in the InvalidLifecycleSettings Event: `Nothing.problems`), and a deadline past
year 9999 is never.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.controllers.lifecycle.decide import Nothing, decide
from tests.unit.controllers.lifecycle.test_decide import T0, sandbox, snap

pytestmark = pytest.mark.unit

LATER = T0 + timedelta(days=1)


@pytest.mark.parametrize(
    ("annotations", "mode"),
    [
        ({lc.ANNOTATION_IDLE_TIMEOUT: "99999999h"}, "Running"),
        ({lc.ANNOTATION_HIBERNATE_AFTER: "99999999h"}, "Suspended"),
    ],
)
def test_a_duration_beyond_gos_is_reported_and_off(annotations: dict[str, str], mode: str) -> None:
    sb = sandbox(annotations=annotations, mode=mode, ready_at=T0, suspended_at=T0)
    plan = decide(snap(sb, now=LATER))
    assert isinstance(plan, Nothing)
    assert plan.requeue_after is None
    assert len(plan.problems) == 1
    assert "99999999h" in plan.problems[0]


def test_a_last_activity_in_year_9999_is_never_idle() -> None:
    sb = sandbox(
        annotations={lc.ANNOTATION_IDLE_TIMEOUT: "15m", lc.ANNOTATION_LAST_ACTIVITY: "9999-12-31T23:59:59Z"},
        ready_at=T0,
    )
    plan = decide(snap(sb, now=LATER))
    assert plan == Nothing()


def test_a_hibernate_after_past_year_9999_is_never() -> None:
    # Within Go's range (200 years) but past datetime's end from a suspension in 9900.
    far = T0.replace(year=9900)
    sb = sandbox(annotations={lc.ANNOTATION_HIBERNATE_AFTER: "1752000h"}, mode="Suspended", suspended_at=far)
    plan = decide(snap(sb, now=LATER))
    assert plan == Nothing()


def test_a_resumed_at_in_year_9999_is_still_starting() -> None:
    sb = sandbox(
        annotations={lc.ANNOTATION_IDLE_TIMEOUT: "15m", lc.ANNOTATION_RESUMED_AT: "9999-12-31T23:59:59Z"}
    )
    plan = decide(snap(sb, now=LATER))
    assert isinstance(plan, Nothing)
    assert plan.requeue_after is not None
    assert not plan.problems
