"""`agent-sandbox create --shutdown-after` checked by argparse, and `lifecycle resume` of a Sandbox whose Pod
has completed refused at once (cli/sandboxes.py, cli/lifecycle.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent_sandbox.cli.lifecycle import Refused, ResumeOutcome, resume
from agent_sandbox.kube import SANDBOX
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

NS = "lc"


@pytest.mark.parametrize("value", ["0", "-5", "99999999999", "1.5", "soon"])
def test_shutdown_after_is_checked_naming_the_option(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from agent_sandbox.cli.main import main

    # Until December 6: exit 1, "error: shutdown_after_seconds must be a positive integer ..." (the SDK's name).
    with pytest.raises(SystemExit) as info:
        main(["create", "pool", f"--shutdown-after={value}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --shutdown-after: " in err
    assert "shutdown_after_seconds" not in err


def test_shutdown_after_takes_whole_seconds_up_to_100_years() -> None:
    from agent_sandbox.cli.sandboxes import _shutdown_after_arg

    assert _shutdown_after_arg("1") == 1
    assert _shutdown_after_arg("3153600000") == 3153600000


def finished_sandbox(mode: str = "Running", *, observed: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": NS},
        "spec": {"operatingMode": mode},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "DependenciesNotReady",
                    "observedGeneration": observed,
                },
                {
                    "type": "Finished",
                    "status": "True",
                    "reason": "PodSucceeded",
                    "message": "Pod completed successfully",
                    "observedGeneration": observed,
                },
            ]
        },
    }


async def test_resuming_a_finished_sandbox_is_refused_at_once() -> None:
    # Until December 6 it waited out --timeout (120 s), then "not Ready within 120s" (exit 4).
    api = FakeClient()
    await api.create(SANDBOX, finished_sandbox(), namespace=NS)
    started = time.monotonic()
    with pytest.raises(Refused, match=r"has finished .*PodSucceeded.* will not become Ready"):
        await resume(api, "sb", NS, wait=30, poll=0.05)  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    # Without waiting it is what it was: running.
    assert await resume(api, "sb", NS) is ResumeOutcome.ALREADY_RUNNING  # type: ignore[arg-type]


async def test_a_finished_condition_from_before_a_resume_is_not_a_refusal() -> None:
    # Resumed from Suspended: the generation moved past the condition's; a new Pod is on its way.
    api = FakeClient()
    await api.create(SANDBOX, finished_sandbox("Suspended"), namespace=NS)
    with pytest.raises(TimeoutError):
        await resume(api, "sb", NS, wait=0.3, poll=0.05)  # type: ignore[arg-type]
