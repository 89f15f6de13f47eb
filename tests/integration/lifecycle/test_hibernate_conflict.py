"""A hibernated Sandbox's volumes on the real control plane: kept from a namesake, reported when gone.

- A new Sandbox created under a hibernated Sandbox's name does not get the archived volume: the Sandbox
  controller refuses the PVC the archive holds (Ready=False naming the archive, no Pod mounting it), the
  lifecycle controller reports the conflict on it, and `lifecycle resume` refuses, saying what to delete.
  Deleting the newcomer lets the hibernated Sandbox be restored with its data. (Until December 7 the
  newcomer adopted the PVC, mounted and could change the hibernated data, and `resume` said "already
  running" with exit 0 while the archive stayed hibernated.)
- A restore whose archived volume was deleted meanwhile goes ahead with a new, empty volume, and says so:
  a Warning `RestoreVolumeMissing` Event on the restored Sandbox, and `resume`'s warning. (Until December 7
  nothing said it: a Normal `Restored` Event, exit 0.)
"""

from __future__ import annotations

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import status_condition
from agent_sandbox.cli.lifecycle import Refused, ResumeOutcome, hibernate, resume
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import EVENT, POD, PVC, SANDBOX, ApiClient, Object
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import execute, get_or_none, ready_ip
from tests.integration.lifecycle.test_hibernate import archived, owner_uids, pvc_sandbox

pytestmark = pytest.mark.integration


async def _events(kube: ApiClient, ns: str, name: str, uid: str, reason: str) -> list[Object]:
    return [
        e
        for e in await kube.list(EVENT, namespace=ns)
        if (e.get("regarding") or {}).get("uid") == uid and e.get("reason") == reason
    ]


async def test_a_new_sandbox_under_a_hibernated_name_does_not_get_its_volume(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(SANDBOX, pvc_sandbox("plain3", {}), namespace=namespace)
    ip = await ready_ip(kube, namespace, "plain3")
    async with http.put(f"http://{ip}:8080/v1/files/notes.txt", data=b"hibernated data") as resp:
        assert resp.status == 204
    await hibernate(kube, "plain3", namespace)
    archive = await archived(kube, namespace, "plain3")
    archive_uid = archive["metadata"]["uid"]

    # The same manifest applied again: a new Sandbox under the archived name.
    newcomer = await kube.create(SANDBOX, pvc_sandbox("plain3", {}), namespace=namespace)
    new_uid = newcomer["metadata"]["uid"]

    async def refused() -> Object | None:
        sb = await kube.get(SANDBOX, "plain3", namespace=namespace)
        ready = status_condition(sb, "Ready") or {}
        said = ready.get("status") == "False" and "SandboxArchive" in str(ready.get("message"))
        return sb if said else None

    sb = await eventually(refused, "the newcomer's Ready=False naming the archive", within=30)
    message = str(status_condition(sb, "Ready")["message"])  # type: ignore[index]
    assert "data-plain3" in message, message
    assert "lifecycle resume plain3" in message, message
    conflict = await eventually(
        lambda: _events(kube, namespace, "plain3", new_uid, "HibernationConflict"),
        "a HibernationConflict Event on the newcomer",
        within=30,
    )
    assert "SandboxArchive 'plain3'" in conflict[0]["note"], conflict[0]
    assert "data-plain3" in conflict[0]["note"], conflict[0]
    # Neither adopted nor mounted: the PVC is the archive's alone, and no Pod was created to mount it.
    pvc = await kube.get(PVC, "data-plain3", namespace=namespace)
    assert owner_uids(pvc, "Sandbox") == []
    assert owner_uids(pvc, "SandboxArchive") == [archive_uid]
    assert await get_or_none(kube, POD, "plain3", namespace) is None

    # `resume` names the conflict (exit 1 from the command line) and asks for no restore.
    with pytest.raises(Refused, match="not the hibernated one"):
        await resume(kube, "plain3", namespace, wait=5)
    assert "restore" not in (await kube.get(lc.ARCHIVE, "plain3", namespace=namespace))["spec"]

    # Still neither after a while (the Sandbox controller retries with backoff).
    pvc = await kube.get(PVC, "data-plain3", namespace=namespace)
    assert owner_uids(pvc, "Sandbox") == []

    # The newcomer deleted, the hibernated Sandbox comes back with its data.
    await kube.delete(SANDBOX, "plain3", namespace=namespace, uid=new_uid)

    async def newcomer_gone() -> bool:
        return await get_or_none(kube, SANDBOX, "plain3", namespace) is None

    await eventually(newcomer_gone, "the newcomer deleted", within=30)
    assert await resume(kube, "plain3", namespace, wait=90) is ResumeOutcome.RESTORING
    ip = await ready_ip(kube, namespace, "plain3")
    assert (await execute(http, ip, "cat notes.txt"))["stdout"] == "hibernated data"


async def test_a_restore_whose_volume_was_deleted_says_so(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    await kube.create(SANDBOX, pvc_sandbox("plain2", {}), namespace=namespace)
    await ready_ip(kube, namespace, "plain2")
    await hibernate(kube, "plain2", namespace)
    archive = await archived(kube, namespace, "plain2")
    assert archive["spec"]["children"] == [{"kind": "PersistentVolumeClaim", "name": "data-plain2"}]
    await kube.delete(PVC, "data-plain2", namespace=namespace)

    async def pvc_gone() -> bool:
        return await get_or_none(kube, PVC, "data-plain2", namespace) is None

    await eventually(pvc_gone, "the archived PVC deleted", within=30)

    warnings: list[str] = []
    outcome = await resume(kube, "plain2", namespace, wait=90, on_warning=warnings.append)
    assert outcome is ResumeOutcome.RESTORING
    assert len(warnings) == 1, warnings
    assert "'data-plain2'" in warnings[0], warnings
    assert "new, empty volume" in warnings[0], warnings
    restored = await kube.get(SANDBOX, "plain2", namespace=namespace)
    missing = await eventually(
        lambda: _events(kube, namespace, "plain2", restored["metadata"]["uid"], "RestoreVolumeMissing"),
        "a RestoreVolumeMissing Event on the restored Sandbox",
        within=30,
    )
    assert missing[0]["type"] == "Warning", missing[0]
    assert "'data-plain2'" in missing[0]["note"], missing[0]
