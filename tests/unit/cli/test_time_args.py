"""`agent-sandbox create --shutdown-after` checked by argparse, and `lifecycle resume` of a Sandbox whose Pod
has completed refused at once (cli/sandboxes.py, cli/lifecycle.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent_sandbox.cli.lifecycle import Refused, ResumeOutcome, resume
from agent_sandbox.kube import POD, SANDBOX
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
    from agent_sandbox.cli.option_values import _shutdown_after_arg

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
    await api.create(POD, finished_pod(), namespace=NS)
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


def finished_pod(*, deleting: bool = False, phase: str = "Succeeded") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "sb", "namespace": NS}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        meta["finalizers"] = ["example.com/hold"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": {"phase": phase}}


async def test_a_finished_pod_that_is_being_deleted_is_not_a_refusal() -> None:
    # Suspended, then resumed before the old Pod was gone: a Pod deleted gracefully ends in phase Failed or
    # Succeeded (kubelet, Kubernetes >= 1.27) and the Sandbox controller mirrors it as Finished=True for the
    # new generation; once the Pod is gone it creates a new one. Until December 6 (the day the refusal came)
    # this resume was refused at once, "has finished", though the Sandbox was about to run again.
    api = FakeClient()
    await api.create(SANDBOX, finished_sandbox(), namespace=NS)
    await api.create(POD, finished_pod(deleting=True, phase="Failed"), namespace=NS)
    with pytest.raises(TimeoutError):
        await resume(api, "sb", NS, wait=0.3, poll=0.05)  # type: ignore[arg-type]


async def test_a_finished_condition_without_its_pod_is_not_a_refusal() -> None:
    # The Pod is gone already (the condition lags): the Sandbox controller creates a new one.
    api = FakeClient()
    await api.create(SANDBOX, finished_sandbox(), namespace=NS)
    with pytest.raises(TimeoutError):
        await resume(api, "sb", NS, wait=0.3, poll=0.05)  # type: ignore[arg-type]


async def test_a_finished_pod_nobody_may_read_is_not_a_refusal() -> None:
    # No `get pods` grant: whether the Pod stays is unknown, so the wait goes on (as before December 6).
    from agent_sandbox.kube import Forbidden

    api = FakeClient()
    await api.create(SANDBOX, finished_sandbox(), namespace=NS)
    await api.create(POD, finished_pod(), namespace=NS)
    api.inject_error("get", Forbidden(403, "Forbidden", "no grant"), kind=POD, times=100)
    with pytest.raises(TimeoutError):
        await resume(api, "sb", NS, wait=0.3, poll=0.05)  # type: ignore[arg-type]
