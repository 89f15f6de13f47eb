"""A hibernated Sandbox's volumes and Service go to its restore only (controllers/sandbox/children.py
`archive_refusal`, ours on top of the adoption rule of controllers spec §0.4).

The SandboxArchive holds them by a non-controller owner reference, and they carry the tracking label: by
§0.4 alone any Sandbox created under the hibernated name adopted them (until December 7), and its Pod
mounted the hibernated data. A child no archive holds is adopted exactly as the spec says. A refused
Sandbox is looked at again every `ARCHIVE_RETRY` seconds (nothing it watches says when the archive goes).
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import LABEL_SANDBOX_NAME_HASH
from agent_sandbox.controllers.indexes import INDEX_POD_NAME_HASH, pod_name_hash_index
from agent_sandbox.controllers.lifecycle.owners import ANNOTATION_RESTORED_FROM, archive_hold, restores
from agent_sandbox.controllers.sandbox import SandboxReconcileError, SandboxReconciler, decide
from agent_sandbox.controllers.sandbox.decide import ARCHIVE_RETRY
from agent_sandbox.controllers.sandbox.plan import CreateObject, PatchObject
from agent_sandbox.kube import POD, PVC, SANDBOX, Request, ServerError
from agent_sandbox.kube.testing import FakeClient
from tests.unit.controllers.sandbox.builders import (
    HASH,
    NOW,
    NS,
    SB,
    SB_UID,
    pvc,
    ref,
    sandbox,
    service,
    snap,
    vct,
)

pytestmark = pytest.mark.unit

ARCHIVE_REF = ref(
    "SandboxArchive", "sb", "uid-archive", api_version=lc.ARCHIVE.api_version, controller=False
) | {"blockOwnerDeletion": False}
TRACKED = {LABEL_SANDBOX_NAME_HASH: HASH}


def _archived_pvc() -> dict[str, Any]:
    return pvc("data-sb", owner=ARCHIVE_REF, labels=TRACKED)


def _creates_pod(plan: Any) -> bool:
    return any(isinstance(a, CreateObject) and a.kind.kind == "Pod" for a in plan.pod.actions)


def test_a_newcomer_gets_neither_the_archived_volume_nor_a_pod_mounting_it() -> None:
    plan = decide(snap(sandbox(vcts=[vct("data")]), pvcs=[_archived_pvc()]), NOW)
    assert plan.pvcs.actions == ()
    error = plan.pvcs.error
    assert error is not None
    assert error.startswith('PVC "data-sb" belongs to the hibernated Sandbox "sb" (SandboxArchive "sb"')
    assert "agent-sandbox lifecycle resume sb" in error
    assert "kubectl delete sandboxarchive sb" in error
    assert not _creates_pod(plan)
    assert plan.pod.error is None  # the PVC step says why; the Pod step only waits


def test_the_restore_takes_the_archived_volume_back_keeping_the_archives_reference() -> None:
    restored = sandbox(vcts=[vct("data")], annotations={ANNOTATION_RESTORED_FROM: "uid-archive"})
    plan = decide(snap(restored, pvcs=[_archived_pvc()]), NOW)
    assert plan.pvcs.error is None
    (adopt,) = plan.pvcs.actions
    assert isinstance(adopt, PatchObject)
    assert [r["uid"] for r in adopt.patch["metadata"]["ownerReferences"]] == ["uid-archive", SB_UID]
    assert _creates_pod(plan)


def test_a_restore_of_another_archive_is_a_newcomer_too() -> None:
    stale = sandbox(vcts=[vct("data")], annotations={ANNOTATION_RESTORED_FROM: "uid-earlier-archive"})
    plan = decide(snap(stale, pvcs=[_archived_pvc()]), NOW)
    assert plan.pvcs.error is not None
    assert not _creates_pod(plan)


def test_children_no_archive_holds_are_adopted_as_the_spec_says() -> None:
    cm = ref("ConfigMap", "cm", "uid-cm", api_version="v1", controller=False)
    plan = decide(snap(sandbox(vcts=[vct("data")]), pvcs=[pvc("data-sb", owner=cm, labels=TRACKED)]), NOW)
    assert plan.pvcs.error is None
    assert [type(a) for a in plan.pvcs.actions] == [PatchObject]
    assert _creates_pod(plan)
    # A kind named SandboxArchive of another group is not ours.
    other = ARCHIVE_REF | {"apiVersion": "example.com/v1"}
    assert archive_hold(pvc("data-sb", owner=other)) is None


def test_the_archived_service_goes_to_the_restore_only() -> None:
    held = service(owner=ARCHIVE_REF)
    plan = decide(snap(sandbox(service=True), svc=held), NOW)
    assert plan.service is not None
    assert plan.service.actions == ()
    assert plan.service.error is not None
    assert plan.service.error.startswith('service "sb" belongs to the hibernated Sandbox "sb"')
    restored = sandbox(service=True, annotations={ANNOTATION_RESTORED_FROM: "uid-archive"})
    plan = decide(snap(restored, svc=held), NOW)
    assert plan.service is not None
    assert plan.service.error is None
    assert [type(a) for a in plan.service.actions] == [PatchObject]


def test_restores_goes_by_the_annotation_or_the_recorded_uid() -> None:
    marked = sandbox(annotations={ANNOTATION_RESTORED_FROM: "uid-archive"})
    assert restores(marked, "uid-archive")
    assert not restores(marked, "uid-other")
    assert restores(sandbox(), "uid-archive", SB_UID)  # restored before the annotation existed
    assert not restores(sandbox(), "uid-archive", None)
    assert not restores(sandbox(), "", None)


# --------------------------------------------------------------------------- the refusal's text and retry


def test_the_refusal_does_not_promise_a_restore_of_an_expired_archive() -> None:
    """This controller does not read archives: the text offers the restore only "unless it has expired"
    (until December 7 it offered it outright, also of an archive that is never restored)."""
    plan = decide(snap(sandbox(vcts=[vct("data")]), pvcs=[_archived_pvc()]), NOW)
    error = plan.pvcs.error
    assert error is not None
    assert "delete the archive (kubectl delete sandboxarchive sb; its volumes go with it) to keep" in error
    assert "unless it has expired (agent-sandbox lifecycle resume sb says which)" in error


def test_the_refusal_is_looked_at_again_at_a_bounded_interval() -> None:
    plan = decide(snap(sandbox(vcts=[vct("data")]), pvcs=[_archived_pvc()]), NOW)
    assert plan.pvcs.retry_after == ARCHIVE_RETRY
    plan = decide(snap(sandbox(service=True), svc=service(owner=ARCHIVE_REF)), NOW)
    assert plan.service is not None
    assert plan.service.retry_after == ARCHIVE_RETRY


async def test_a_refused_newcomer_is_retried_in_30s_not_with_the_error_backoff() -> None:
    """What ends the refusal (the archive deleted, then its PVC collected) is no event this controller
    watches: with the error backoff the newcomer waited up to 1000 s for its volumes (until December 7)."""
    newcomer = sandbox(vcts=[vct("data")])
    client = FakeClient((SANDBOX, newcomer), (PVC, _archived_pvc()))
    client.add_index(POD, INDEX_POD_NAME_HASH, lambda o: list(pod_name_hash_index(o)))
    reconciler = SandboxReconciler(client, client, now=lambda: NOW)
    result = await reconciler.reconcile(Request(NS, SB))  # no error raised: no backoff
    assert result.requeue_after == ARCHIVE_RETRY
    status = (await client.get(SANDBOX, SB, namespace=NS))["status"]
    (ready,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ReconcilerError")
    assert "SandboxArchive" in ready["message"]
    assert client.objects(POD) == []
    # The archive deleted, its PVC collected: the next (bounded) pass creates the newcomer's own.
    await client.delete(PVC, "data-sb", namespace=NS)
    assert (await reconciler.reconcile(Request(NS, SB))).requeue_after is None
    (own,) = client.objects(PVC)
    assert own["metadata"]["ownerReferences"][0]["uid"] == SB_UID
    assert len(client.objects(POD)) == 1


async def test_an_api_failure_besides_the_refusal_still_backs_off() -> None:
    newcomer = sandbox(vcts=[vct("logs"), vct("data")])  # the create of "logs" fails
    client = FakeClient((SANDBOX, newcomer), (PVC, _archived_pvc()))
    client.add_index(POD, INDEX_POD_NAME_HASH, lambda o: list(pod_name_hash_index(o)))
    client.inject_error("create", ServerError(503, "ServiceUnavailable", "etcd leader change"), kind=PVC)
    reconciler = SandboxReconciler(client, client, now=lambda: NOW)
    with pytest.raises(SandboxReconcileError):
        await reconciler.reconcile(Request(NS, SB))
