"""`agent-sandbox lifecycle resume` (cli/lifecycle.py) of a name whose Sandbox is not the hibernated one, and
of a hibernated Sandbox whose volume was deleted, over the in-memory FakeClient.

A newcomer under an archive that has expired is told to delete the archive (`Retain`), or resumed with a
warning (the controller deletes the archive); a restore an older controller created is no newcomer.

Until December 7 a resume of a Sandbox created under a hibernated name said "already running" (exit 0)
with the archive left hibernated, and a restore without its volume said nothing of it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time
from agent_sandbox.cli.lifecycle import Refused, ResumeOutcome, resume
from agent_sandbox.controllers.lifecycle.owners import ANNOTATION_RESTORED_FROM, archive_owner_ref
from agent_sandbox.kube import PVC, SANDBOX, SANDBOX_CLAIM, Object
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

NS = "lc"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def sandbox(annotations: dict[str, str] | None = None, uid: str = "new-uid") -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "sb", "namespace": NS, "uid": uid, "annotations": annotations or {}},
        "spec": {"operatingMode": "Running"},
    }


async def hibernated(api: FakeClient, *, with_volume: bool = True) -> Object:
    children = [{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    archive = await api.create(
        lc.ARCHIVE,
        lc.archive_body(sandbox(uid="old-uid"), cause=lc.Cause.REQUESTED, now=T0, children=children),
        namespace=NS,
    )
    if with_volume:
        held = {"name": "data-sb", "ownerReferences": [archive_owner_ref(archive)]}
        await api.create(
            PVC, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": held}, namespace=NS
        )
    return archive


async def test_a_newcomer_under_a_hibernated_name_is_refused() -> None:
    api = FakeClient()
    await hibernated(api)
    await api.create(SANDBOX, sandbox(), namespace=NS)  # another UID: created under the name since
    with pytest.raises(Refused) as refused:
        await resume(api, "sb", NS)  # type: ignore[arg-type]
    said = str(refused.value)
    assert said.startswith(f"Sandbox {NS}/sb is not the hibernated one")
    assert f"kubectl delete sandbox -n {NS} sb" in said
    assert f"kubectl delete sandboxarchive -n {NS} sb" in said
    assert "restore" not in (await api.get(lc.ARCHIVE, "sb", namespace=NS))["spec"]  # nothing asked


async def test_the_restore_under_way_is_not_a_newcomer() -> None:
    api = FakeClient()
    archive = await hibernated(api)
    marked = sandbox({ANNOTATION_RESTORED_FROM: archive["metadata"]["uid"]})
    await api.create(SANDBOX, marked, namespace=NS)
    assert await resume(api, "sb", NS) is ResumeOutcome.ALREADY_RUNNING  # type: ignore[arg-type]
    # The archived Sandbox itself (still there while being archived) is no newcomer either.
    await api.delete(SANDBOX, "sb", namespace=NS)
    archived = await api.create(SANDBOX, sandbox(), namespace=NS)
    patch = {"spec": {"sandboxUID": archived["metadata"]["uid"]}}
    await api.patch(lc.ARCHIVE, "sb", patch, namespace=NS)
    assert await resume(api, "sb", NS) is ResumeOutcome.ALREADY_RUNNING  # type: ignore[arg-type]


async def test_a_restore_without_its_volume_goes_ahead_with_a_warning() -> None:
    api = FakeClient()
    await hibernated(api, with_volume=False)
    warnings: list[str] = []
    outcome = await resume(api, "sb", NS, on_warning=warnings.append)  # type: ignore[arg-type]
    assert outcome is ResumeOutcome.RESTORING
    assert warnings == [
        f"the volume PersistentVolumeClaim 'data-sb' of hibernated Sandbox {NS}/sb was deleted while it was "
        "hibernated: it is restored without that data, with a new, empty volume in its place"
    ]
    assert (await api.get(lc.ARCHIVE, "sb", namespace=NS))["spec"]["restore"]["cause"] == "Manual"
    api2, quiet = FakeClient(), list[str]()
    await hibernated(api2)
    assert await resume(api2, "sb", NS, on_warning=quiet.append) is ResumeOutcome.RESTORING  # type: ignore[arg-type]
    assert quiet == []


# --------------------------------------------------------------------------- an expired archive, an older restore


async def _expired_hibernated(api: FakeClient, policy: str) -> Object:
    old = sandbox(uid="old-uid")
    old["spec"] |= {"shutdownTime": format_time(T0), "shutdownPolicy": policy}
    children = [{"kind": "PersistentVolumeClaim", "name": "data-sb"}]
    body = lc.archive_body(old, cause=lc.Cause.REQUESTED, now=T0, children=children)
    return await api.create(lc.ARCHIVE, body, namespace=NS)


async def test_a_newcomer_under_an_expired_kept_archive_is_told_to_delete_the_archive_not_to_restore() -> (
    None
):
    """Until December 7 it was told to delete itself "and run this again to restore the hibernated one",
    which is never restored once expired."""
    api = FakeClient()
    await _expired_hibernated(api, "Retain")
    await api.create(SANDBOX, sandbox(), namespace=NS)
    with pytest.raises(Refused) as refused:
        await resume(api, "sb", NS)  # type: ignore[arg-type]
    said = str(refused.value)
    assert said.startswith(f"Sandbox {NS}/sb is not the hibernated one")
    assert "has expired (its shutdownTime passed; shutdownPolicy Retain): it is never restored" in said
    assert f"Delete the archive (kubectl delete sandboxarchive -n {NS} sb" in said
    assert "restore the hibernated one" not in said
    assert "kubectl delete sandbox -n" not in said


async def test_a_newcomer_under_an_archive_the_controller_deletes_is_resumed_with_a_warning() -> None:
    api = FakeClient()
    await _expired_hibernated(api, "Delete")
    await api.create(SANDBOX, sandbox(), namespace=NS)
    warnings: list[str] = []
    outcome = await resume(api, "sb", NS, on_warning=warnings.append)  # type: ignore[arg-type]
    assert outcome is ResumeOutcome.ALREADY_RUNNING
    assert warnings == [
        f"Sandbox {NS}/sb was created under the name while SandboxArchive {NS}/sb keeps a hibernated Sandbox "
        "that has expired: the lifecycle controller deletes that archive and its volumes, and this Sandbox "
        "gets new, empty volumes once they are gone"
    ]


async def test_a_newcomer_under_an_archive_whose_claim_expired_is_resumed_with_a_warning() -> None:
    api = FakeClient()
    claim = await api.create(
        SANDBOX_CLAIM,
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "c"},
            "spec": {"lifecycle": {"shutdownTime": format_time(T0)}},
        },
        namespace=NS,
    )
    old = sandbox(uid="old-uid")
    old["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "name": "c",
            "uid": claim["metadata"]["uid"],
            "controller": True,
        }
    ]
    await api.create(
        lc.ARCHIVE, lc.archive_body(old, cause=lc.Cause.REQUESTED, now=T0, children=[]), namespace=NS
    )
    await api.create(SANDBOX, sandbox(), namespace=NS)
    warnings: list[str] = []
    assert await resume(api, "sb", NS, on_warning=warnings.append) is ResumeOutcome.ALREADY_RUNNING  # type: ignore[arg-type]
    assert len(warnings) == 1
    assert "has expired: the lifecycle controller deletes that archive" in warnings[0]


async def test_a_restore_an_older_controller_created_is_not_a_newcomer() -> None:
    """Created by a controller from before `restored-from`, stopped before it recorded `restored-uid`
    (an upgrade): until December 7 `resume` refused it as a newcomer (exit 1)."""
    api = FakeClient()
    await hibernated(api)
    asked = datetime.now(UTC)
    await api.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, asked), namespace=NS)
    archive = await api.get(lc.ARCHIVE, "sb", namespace=NS)
    await api.create(SANDBOX, lc.archived_sandbox(archive, cause=lc.Cause.MANUAL, now=asked), namespace=NS)
    assert await resume(api, "sb", NS) is ResumeOutcome.ALREADY_RUNNING  # type: ignore[arg-type]


async def test_a_newcomer_the_sdk_resumed_while_a_restore_was_asked_is_refused() -> None:
    """The Python SDK's `resume()` stamps `resume-reason` and `resumed-at` on a Sandbox in any mode: until
    December 7 a newcomer so stamped within a minute of its creation, a restore asked meanwhile, was taken
    for an older controller's restore (`owners.legacy_restore`) and said "already running"."""
    api = FakeClient()
    await hibernated(api)
    asked = datetime.now(UTC)
    await api.patch(lc.ARCHIVE, "sb", lc.restore_request_patch(lc.Cause.MANUAL, asked), namespace=NS)
    await api.create(SANDBOX, sandbox(), namespace=NS)
    sdk = {lc.ANNOTATION_RESUME_REASON: "Manual", lc.ANNOTATION_RESUMED_AT: lc.format_rfc3339nano(asked)}
    await api.patch(SANDBOX, "sb", {"metadata": {"annotations": sdk}}, namespace=NS)
    with pytest.raises(Refused) as refused:
        await resume(api, "sb", NS)  # type: ignore[arg-type]
    assert str(refused.value).startswith(f"Sandbox {NS}/sb is not the hibernated one")
