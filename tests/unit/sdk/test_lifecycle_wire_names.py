"""The Python SDK's copies of our lifecycle wire names (docs/lifecycle.md) agree with `agent_sandbox.api`: the
SDK is standalone and cannot import them (tests/unit/sdk/test_standalone.py)."""

from __future__ import annotations

import pytest

from agent_sandbox.api import constants as api
from agent_sandbox.api import lifecycle as lc
from agent_sandbox_sdk import _lifecycle_names, _sandbox_state
from agent_sandbox_sdk import constants as sdk

pytestmark = pytest.mark.unit


def test_lifecycle_annotations_agree_with_the_api_package() -> None:
    assert sdk.AUTO_RESUME_ANNOTATION == lc.ANNOTATION_AUTO_RESUME
    assert sdk.SANDBOX_TEMPLATE_REF_ANNOTATION == api.ANNOTATION_SANDBOX_TEMPLATE_REF
    assert sdk.RESUME_REASON_ANNOTATION == lc.ANNOTATION_RESUME_REASON
    assert sdk.RESUMED_AT_ANNOTATION == lc.ANNOTATION_RESUMED_AT
    assert sdk.HIBERNATED_SANDBOX_ANNOTATION == lc.ANNOTATION_HIBERNATED_SANDBOX
    assert _lifecycle_names.SUSPEND_REASON_ANNOTATION == lc.ANNOTATION_SUSPEND_REASON
    assert _lifecycle_names.SUSPENDED_AT_ANNOTATION == lc.ANNOTATION_SUSPENDED_AT
    assert _lifecycle_names.HIBERNATE_ANNOTATION == lc.ANNOTATION_HIBERNATE
    assert _lifecycle_names.EXPIRED_AT_ANNOTATION == lc.ANNOTATION_EXPIRED_AT


def test_the_reasons_the_sdk_explains_are_the_ones_writers_record() -> None:
    # `SandboxModeChangedError` names who undid a suspend()/resume() by these values.
    assert set(_sandbox_state._RESUMED_BY) <= {str(c) for c in lc.Cause}
    assert set(_sandbox_state._SUSPENDED_BY) <= {str(c) for c in lc.Cause}
    assert str(lc.Cause.REQUEST) in _sandbox_state._RESUMED_BY
    assert str(lc.Cause.IDLE) in _sandbox_state._SUSPENDED_BY
