"""The SDK's reading of claim expiry at the edges of what the API admits (`_expiry.claim_is_expired`,
`_apitime.parse_time`): as the control plane reads it (tests/unit/api/test_time_limits.py keeps the two in step).

Until December 6 a `ttlSecondsAfterFinished` above int32 (the apiserver does not range-check it) raised
OverflowError, and a `shutdownTime` the apiserver admits ("+24:00", "X5Z") counted as unset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agent_sandbox_sdk._apitime import parse_time as _parse_time
from agent_sandbox_sdk._expiry import claim_is_expired as _claim_is_expired

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def finished_claim(lifecycle: dict[str, object]) -> dict[str, object]:
    return {
        "spec": {"lifecycle": lifecycle},
        "status": {
            "conditions": [
                {"type": "Finished", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        },
    }


@pytest.mark.parametrize("ttl", [10**12, 10**15, 2**63])
def test_a_ttl_past_datetime_never_expires(ttl: int) -> None:
    assert not _claim_is_expired(finished_claim({"ttlSecondsAfterFinished": ttl}), T0 + timedelta(days=3650))
    earlier = {"ttlSecondsAfterFinished": ttl, "shutdownTime": "2026-01-01T01:00:00Z"}
    assert _claim_is_expired(finished_claim(earlier), T0 + timedelta(hours=2))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00+24:00", T0 - timedelta(hours=24)),
        ("2026-01-01T00:00:00+99:99", T0 - timedelta(minutes=99 * 60 + 99)),
        ("2026-01-01T00:00:00X5Z", T0 + timedelta(milliseconds=500)),
        ("2026-01-01T00:00:00.123456789Z", T0 + timedelta(microseconds=123456)),
        ("2026-01-01t00:00:00z", T0),
        ("0000-01-01T00:00:00Z", datetime.min.replace(tzinfo=UTC)),
        ("2026-01-01T00:00:00", T0),
        ("2026-02-30T00:00:00Z", None),
        ("nope", None),
    ],
)
def test_parse_time_reads_what_the_apiserver_admits(text: str, expected: datetime | None) -> None:
    assert _parse_time(text) == expected


def test_a_shutdown_time_with_a_large_offset_expires_the_claim() -> None:
    claim = {"spec": {"lifecycle": {"shutdownTime": "2026-01-02T00:00:00+24:00"}}}
    assert _claim_is_expired(claim, T0)
