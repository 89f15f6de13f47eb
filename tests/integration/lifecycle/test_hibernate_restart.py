"""A resume made while the controller was down, between archiving's first steps and the Sandbox's deletion.

Deterministic: the controller is stopped, the archive and the volume's hold are written exactly as the
controller's first steps write them (`archive_body`, `adopt_child_patch`), the user resumes, and the
controller starts again. Until December 6 it finished the archiving: it deleted the now Running Sandbox
(Orphan), leaving the new Pod running with no owner and the archive holding the volume.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import ResumeOutcome, resume, suspend
from agent_sandbox.controllers.lifecycle.decide import adopt_child_patch
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import POD, PVC, SANDBOX, ApiClient, Object
from tests.helpers import eventually, is_ready
from tests.integration.lifecycle.helpers import get_or_none, ready_ip
from tests.integration.lifecycle.test_hibernate import held_by_sandbox_alone, owner_uids, pvc_sandbox

pytestmark = pytest.mark.integration

LIFECYCLE = ("--sandbox-lifecycle",)


@pytest.fixture
def controllers(cluster: DevCluster) -> Iterator[list[Started]]:
    """Controllers this test starts (the last one is the running one); all stopped at the end."""
    started: list[Started] = []
    try:
        yield started
    finally:
        for one in started:
            stop(one)


async def test_a_resume_while_the_controller_was_down_mid_archive_wins(
    kube: ApiClient, namespace: str, cluster: DevCluster, controllers: list[Started]
) -> None:
    controllers.append(start_controller(cluster, extra=LIFECYCLE))
    await kube.create(SANDBOX, pvc_sandbox("halted", {}), namespace=namespace)
    await ready_ip(kube, namespace, "halted")
    await suspend(kube, "halted", namespace)

    async def suspended() -> Object | None:
        sb = await kube.get(SANDBOX, "halted", namespace=namespace)
        conds = {c["type"]: c["status"] for c in sb.get("status", {}).get("conditions") or []}
        gone = await get_or_none(kube, POD, "halted", namespace) is None
        return sb if conds.get("Suspended") == "True" and gone else None

    await eventually(suspended, "Sandbox Suspended, its Pod gone", within=60)
    stop(controllers[-1])

    # The controller's first archiving steps, then its crash: hibernation asked, archive, volume held.
    ask = {"metadata": {"annotations": {lc.ANNOTATION_HIBERNATE: "true"}}}
    sb = await kube.patch(SANDBOX, "halted", ask, namespace=namespace)
    pvc = await kube.get(PVC, "data-halted", namespace=namespace)
    children = [{"kind": "PersistentVolumeClaim", "name": "data-halted"}]
    body = lc.archive_body(sb, cause=lc.Cause.REQUESTED, now=datetime.now(UTC), children=children)
    archive = await kube.create(lc.ARCHIVE, body, namespace=namespace)
    await kube.patch(PVC, "data-halted", adopt_child_patch(pvc, archive), namespace=namespace)
    # The user resumes meanwhile.
    assert await resume(kube, "halted", namespace) is ResumeOutcome.RESUMED

    controllers.append(start_controller(cluster, extra=LIFECYCLE))

    async def running_and_released() -> Object | None:
        now = await get_or_none(kube, SANDBOX, "halted", namespace)
        if now is None:
            raise AssertionError("the resumed Sandbox was deleted by the archiving")
        if not is_ready(now) or await get_or_none(kube, lc.ARCHIVE, "halted", namespace) is not None:
            return None
        return now

    resumed = await eventually(running_and_released, "Sandbox Ready, archive given up", within=90)
    assert resumed["metadata"]["uid"] == sb["metadata"]["uid"]
    assert resumed["spec"]["operatingMode"] == "Running"
    pod = await kube.get(POD, "halted", namespace=namespace)
    assert owner_uids(pod, "Sandbox") == [sb["metadata"]["uid"]]
    await held_by_sandbox_alone(kube, namespace, "data-halted", sb["metadata"]["uid"])
