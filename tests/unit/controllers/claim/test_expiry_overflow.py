"""Claim expiry with a TTL past datetime's range (controllers/claim/status.py `expiry`, spec §4.9).

`ttlSecondsAfterFinished` is int32 in the CRD, but the apiserver does not enforce the range: until December 6
1e12 raised `OverflowError: date value out of range` (1e15: `Python int too large to convert to C int`) in
every pass, so the claim's status froze (Finished never mirrored, never expiring). Such a deadline is never.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.controllers.claim.status import expiry
from tests.unit.controllers.claim.builders import T0, claim, ts

pytestmark = pytest.mark.unit


def finished(at: str) -> dict[str, Any]:
    return {"type": "Finished", "status": "True", "reason": "PodSucceeded", "lastTransitionTime": at}


@pytest.mark.parametrize("ttl", [10**12, 10**15, 2**63])
def test_a_ttl_past_datetime_never_expires(ttl: int) -> None:
    cl = claim(status={"conditions": [finished(ts(T0))]}, lifecycle={"ttlSecondsAfterFinished": ttl})
    got = expiry(cl, T0 + timedelta(days=3650))
    assert (got.expired, got.time_left) == (False, None)
    # The lifecycle controller, routers and the CLI reckon it the same way.
    assert lc.claim_expired(cl, T0 + timedelta(days=3650)) == (False, None)


def test_an_earlier_shutdown_time_still_expires_it() -> None:
    cl = claim(
        status={"conditions": [finished(ts(T0))]},
        lifecycle={"ttlSecondsAfterFinished": 10**12, "shutdownTime": ts(T0 + timedelta(hours=1))},
    )
    got = expiry(cl, T0 + timedelta(hours=2))
    assert (got.expired, got.time_left) == (True, -3600)


def test_a_shutdown_time_with_an_offset_past_24h_counts() -> None:
    # Admitted by the apiserver (its date-time check takes any two-digit hh:mm); until December 6 unset.
    cl = claim(lifecycle={"shutdownTime": "2026-01-02T12:00:00+24:00"})
    got = expiry(cl, T0)
    assert (got.expired, got.time_left) == (True, 0)
