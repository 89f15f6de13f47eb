"""A claim's env (ours, docs/lifecycle.md) reaches the Pod without write-behind or claim-pressure deferral."""

from __future__ import annotations

import pytest

from agent_sandbox.api.constants import ANNOTATION_POD_NAME
from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV
from agent_sandbox.controllers.sandbox import decide
from agent_sandbox.controllers.sandbox.plan import PatchObject
from tests.unit.controllers.sandbox.builders import NOW, SB, pod, sandbox, snap

pytestmark = pytest.mark.unit


def test_claim_env_patch_is_never_deferred() -> None:
    sb = sandbox(
        annotations={ANNOTATION_POD_NAME: SB}, template_annotations={ANNOTATION_CLAIM_ENV: '{"A":"1"}'}
    )
    plan = decide(snap(sb, pods=[pod()], write_behind_window=1.0), NOW)
    assert plan.pod.deferred_wait is None
    patches = [a for a in plan.pod.actions if isinstance(a, PatchObject) and a.kind.kind == "Pod"]
    assert len(patches) == 1
    assert patches[0].patch["metadata"]["annotations"][ANNOTATION_CLAIM_ENV] == '{"A":"1"}'


def test_other_pod_metadata_is_still_deferred() -> None:
    sb = sandbox(annotations={ANNOTATION_POD_NAME: SB}, template_annotations={"team": "x"})
    plan = decide(snap(sb, pods=[pod()], write_behind_window=1.0), NOW)
    assert plan.pod.deferred_wait == 1.0
