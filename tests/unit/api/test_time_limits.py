"""Times and durations at the edges of what the API admits (api/meta.py `parse_time`, `deadline_after`;
api/lifecycle.py `_duration`, `claim_expired`).

Until December 6: a `shutdownTime` kube-apiserver admits but `parse_time` rejected ("+24:00", "X5Z") counted
as unset (the Sandbox never expired); a TTL above int32 (the apiserver does not range-check the CRD's
int32) and a duration beyond Go's raised OverflowError in every controller pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api import meta

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIN = datetime.min.replace(tzinfo=UTC)
MAX = datetime.max.replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Admitted by kube-apiserver's date-time check (kube-openapi strfmt IsDateTime): offsets are
        # +-(hh*60+mm) minutes whatever their range.
        ("2026-01-01T00:00:00+24:00", T0 - timedelta(hours=24)),
        ("2026-01-01T00:00:00+99:99", T0 - timedelta(minutes=99 * 60 + 99)),
        ("2026-01-01T00:00:00-99:99", T0 + timedelta(minutes=99 * 60 + 99)),
        ("2026-01-01T00:00:00+00:60", T0 - timedelta(minutes=60)),
        # Its unescaped "." before the fraction admits any one character.
        ("2026-01-01T00:00:00X5Z", T0 + timedelta(milliseconds=500)),
        ("2026-01-01T00:00:00,25Z", T0 + timedelta(milliseconds=250)),
        ("2026-01-01T00:00:00+5Z", T0 + timedelta(milliseconds=500)),
        ("2026-01-01T00:00:00:1-01:00", T0 + timedelta(hours=1, milliseconds=100)),
        ("2026-01-01T00:00:00.123456789Z", T0 + timedelta(microseconds=123456)),
        # Lower case, and pieces after a second "t" that the check never looks at.
        ("2026-01-01t00:00:00z", T0),
        ("2026-01-01T00:00:00ZtFOO", T0),
        # Past the ends of datetime: clamped, so "now >= shutdownTime" stays right.
        ("0000-02-29T00:00:00Z", MIN),
        ("0001-01-01T00:00:00+01:00", MIN),
        ("9999-12-31T23:59:59-99:99", MAX),
        # Standard forms, unchanged.
        ("2026-01-01T02:00:00+02:00", T0),
        ("2026-01-01T00:00:00-05:00", T0 + timedelta(hours=5)),
        ("2026-01-01T00:00:00", T0),  # not admitted, but annotations (no schema) have always read so
        ("2026-01-01 00:00:00Z", T0),
        ("2026-01-01T01:00:00+0100", T0),
        # Rejected by the apiserver and by parse_time.
        ("2026-02-30T00:00:00Z", None),
        ("2026-01-01T24:00:00Z", None),
        ("2026-01-01T00:60:00Z", None),
        ("2026-01-01T00:00:60Z", None),
        ("2026-01-01T00:00:00X", None),
        ("yesterday", None),
    ],
)
def test_parse_time_reads_what_the_apiserver_admits(text: str, expected: datetime | None) -> None:
    assert meta.parse_time(text) == expected


def test_deadline_after_past_datetime_max_is_never() -> None:
    assert meta.deadline_after(T0, 60) == T0 + timedelta(seconds=60)
    assert meta.deadline_after(T0, 10**12) is None  # OverflowError: date value out of range
    assert meta.deadline_after(T0, 10**15) is None  # OverflowError: Python int too large to convert to C int
    assert meta.deadline_after(MAX, 0.001) is None
    assert meta.deadline_after(T0, -(10**12)) == MIN


def finished_claim(ttl: int, *, shutdown: str | None = None) -> dict[str, object]:
    lifecycle: dict[str, object] = {"ttlSecondsAfterFinished": ttl}
    if shutdown is not None:
        lifecycle["shutdownTime"] = shutdown
    return {
        "spec": {"lifecycle": lifecycle},
        "status": {
            "conditions": [
                {"type": "Finished", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        },
    }


@pytest.mark.parametrize("ttl", [10**12, 10**15, 2**63])
def test_claim_expired_with_a_ttl_past_datetime_never_expires(ttl: int) -> None:
    assert lc.claim_expired(finished_claim(ttl), T0 + timedelta(days=1)) == (False, None)
    # An earlier shutdownTime still counts.
    expired, left = lc.claim_expired(
        finished_claim(ttl, shutdown="2026-01-01T12:00:00Z"), T0 + timedelta(days=1)
    )
    assert expired
    assert left == -12 * 3600


@pytest.mark.parametrize("key", [lc.ANNOTATION_IDLE_TIMEOUT, lc.ANNOTATION_HIBERNATE_AFTER])
def test_durations_beyond_gos_are_unusable(key: str) -> None:
    policy = lc.lifecycle_policy({key: "99999999h"})
    assert policy.idle_timeout is None
    assert policy.hibernate_after is None
    assert len(policy.problems) == 1
    assert key in policy.problems[0]
    assert "99999999h" in policy.problems[0]
    # Go's longest duration is still one.
    longest = lc.lifecycle_policy({key: "2562047h47m16.854775807s"})
    assert not longest.problems
    assert (longest.idle_timeout or longest.hibernate_after) == pytest.approx(lc.MAX_GO_DURATION_SECONDS)
    assert lc.lifecycle_policy({key: "2562048h"}).problems


@pytest.mark.parametrize(
    "text",
    [
        "2026-01-01T00:00:00+24:00",
        "2026-01-01T00:00:00-99:99",
        "2026-01-01T00:00:00X5Z",
        "2026-01-01T00:00:00.123456789+01:00",
        "2026-01-01t00:00:00z",
        "2026-01-01T00:00:00ZtFOO",
        "0000-02-29T00:00:00Z",
        "9999-12-31T23:59:59-99:99",
        "2026-01-01T00:00:00",
        "2026-01-01 00:00:00+01:00",
        "2026-02-30T00:00:00Z",
        "2026-01-01T24:00:00Z",
        "",
    ],
)
def test_the_sdk_reads_times_as_the_control_plane(text: str) -> None:
    # The SDK installs alone, so it has its own copy of parse_time (agent_sandbox_sdk/_apitime.py).
    from agent_sandbox_sdk._apitime import parse_time as _parse_time

    assert _parse_time(text) == meta.parse_time(text)
