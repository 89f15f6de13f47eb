"""Wire constants (api spec §7, controllers spec §0)."""

from __future__ import annotations

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import kinds

pytestmark = pytest.mark.unit


def test_enums_are_wire_strings() -> None:
    assert c.OperatingMode.SUSPENDED == "Suspended"
    assert [m.value for m in c.EnvVarsInjectionPolicy] == ["Allowed", "Overrides", "Disallowed"]
    assert [m.value for m in c.VolumeClaimTemplatesPolicy] == ["Disallowed", "Allowed", "Overrides"]
    assert [m.value for m in c.UpdateStrategyType] == ["Recreate", "OnReplenish"]
    assert [m.value for m in c.ClaimShutdownPolicy] == ["Delete", "DeleteForeground", "Retain"]
    assert c.FINALIZERS == ()
    assert set(c.STATE_ANNOTATIONS) == {k.kind for k in kinds.ALL_KINDS}
