"""The settings a router applies to a hibernated Sandbox (`LifecycleState.archive_policy`): its own, else its
SandboxTemplate's as it is now, else, once the template is gone, the template's `auto-resume` the lifecycle
controller recorded on the archive. Until December 7 a hibernated claim whose template was deleted was not
restored on request (upstream's 502). The real controller's side: tests/integration/lifecycle/
test_restore_template_gone.py."""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._lifecycle_state import LifecycleState, _diet_archive, archive_view

pytestmark = pytest.mark.unit

AUTO = {lc.ANNOTATION_AUTO_RESUME: "true"}


def archive(own: dict[str, str], recorded: str | None) -> dict[str, Any]:
    annotations = {lc.ANNOTATION_TEMPLATE_AUTO_RESUME: recorded} if recorded is not None else {}
    kept = {"metadata": {"annotations": {c.ANNOTATION_SANDBOX_TEMPLATE_REF: "tp", **own}}, "spec": {}}
    return {
        "metadata": {"name": "sb", "namespace": "team", "uid": "a", "annotations": annotations},
        "spec": {"sandbox": kept, "children": []},
    }


@pytest.mark.parametrize(
    ("own", "template", "recorded", "auto"),
    [
        ({}, None, "true", True),  # the template deleted: what it said when archived
        ({}, None, None, False),  # an archive of an older controller: nothing recorded, as before
        ({}, {}, "true", False),  # the template still there (its auto-resume since removed): as it is now
        ({}, AUTO, None, True),
        ({lc.ANNOTATION_AUTO_RESUME: "false"}, None, "true", False),  # the Sandbox's own setting wins
    ],
)
def test_archive_policy(
    own: dict[str, str], template: dict[str, str] | None, recorded: str | None, auto: bool
) -> None:
    state = LifecycleState(FakeClient())
    if template is not None:
        state.templates[("team", "tp")] = template
    view = archive_view(_diet_archive(archive(own, recorded)))
    assert state.archive_policy(view).auto_resume is auto
