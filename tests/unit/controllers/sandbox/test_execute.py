"""Executor semantics against the in-memory FakeClient: step abort, delete tolerance, expectations."""

from __future__ import annotations

import pytest

from agent_sandbox.controllers.sandbox import ChildExpectations, Executor
from agent_sandbox.controllers.sandbox.children import build_pvc
from agent_sandbox.controllers.sandbox.plan import (
    CreateObject,
    DeleteObject,
    DeleteSandbox,
    PatchSandboxMetadata,
    StepPlan,
)
from agent_sandbox.kube import POD, PVC, SANDBOX, ServerError
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.sandbox.builders import HASH, SB, pod, sandbox, vct

pytestmark = pytest.mark.unit


def _create_pvc(name: str) -> CreateObject:
    return CreateObject(kind=PVC, obj=build_pvc(vct(name), sandbox(), HASH), what="failed to create PVC")


async def test_first_failure_skips_the_rest_of_the_step_and_abandons_their_creations() -> None:
    client = FakeClient((SANDBOX, sandbox()))
    client.inject_error("create", ServerError(500, "InternalError", "etcd down"), kind=PVC, name=f"b-{SB}")
    expectations = ChildExpectations()
    ex = Executor(client, sandbox(), expectations)
    result = await ex.run_step(StepPlan((_create_pvc("a"), _create_pvc("b"), _create_pvc("c"))))
    assert result.failed_at == 1
    assert result.error == "failed to create PVC: etcd down"
    assert [p["metadata"]["name"] for p in client.objects(PVC)] == [f"a-{SB}"]
    # Only the successful create is still expected (its ADDED event will lower it).
    assert expectations.pending((PVC,), "ns", SB)
    expectations.handler(PVC).on_add(client.objects(PVC)[0])
    assert not expectations.pending((PVC,), "ns", SB)


@pytest.mark.parametrize("uid", ["uid-pod-sb", "uid-of-someone-else"], ids=["deleted", "namesake-untouched"])
async def test_delete_tolerates_gone_and_replaced_objects(uid: str) -> None:
    client = FakeClient((SANDBOX, sandbox()), (POD, pod()))
    expectations = ChildExpectations()
    ex = Executor(client, sandbox(), expectations)
    step = StepPlan((DeleteObject(kind=POD, name=SB, uid=uid, what="failed to delete pod"),))
    assert (await ex.run_step(step)).ok
    assert (await ex.run_step(step)).ok  # NotFound (or still a UID mismatch) is success too
    remaining = [p["metadata"]["uid"] for p in client.objects(POD)]
    assert remaining == ([] if uid == "uid-pod-sb" else ["uid-pod-sb"])
    if uid != "uid-pod-sb":
        assert not expectations.pending((POD,), "ns", SB)  # rolled back: nothing will be observed


async def test_sandbox_metadata_patch_and_self_delete() -> None:
    client = FakeClient((SANDBOX, sandbox()))
    ex = Executor(client, sandbox())
    patch = {"metadata": {"annotations": {"agents.x-k8s.io/pod-name": SB}}}
    assert (await ex.run_step(StepPlan((PatchSandboxMetadata(patch=patch),)))).ok
    assert client.objects(SANDBOX)[0]["metadata"]["annotations"] == {"agents.x-k8s.io/pod-name": SB}
    delete = StepPlan((DeleteSandbox(uid="uid-sb"),))
    assert (await ex.run_step(delete)).ok
    assert (await ex.run_step(delete)).ok
    assert client.objects(SANDBOX) == []
    await ex.write_status({"status": {"selector": "x"}})  # NotFound after deletion is ignored
