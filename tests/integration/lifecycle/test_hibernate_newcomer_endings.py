"""A Sandbox under a hibernated Sandbox's name on the real control plane: the archive's expiry still ends
it, and a restore an older controller created is finished after an upgrade.

- A newcomer does not keep an expired archive (`shutdownPolicy: Delete`): the archive is deleted at its
  `shutdownTime`, its volume with it, and the newcomer then gets a volume of its own and its Pod (the
  Sandbox controller looks again at a bounded interval, `ARCHIVE_RETRY`). Until December 7 the archive was
  never deleted while the newcomer existed, and the newcomer never got a volume or a Pod.
- A restore created by a controller from before `restored-from`, which did not record `restored-uid`
  before it was stopped (an upgrade), is known by what that controller wrote (`owners.legacy_restore`):
  the lifecycle controller records and marks it, and it comes back with its data. Until December 7 it was
  taken for a newcomer: no volume, no Pod, `lifecycle resume` refused.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.meta import format_time, parse_time, status_condition
from agent_sandbox.cli.lifecycle import ResumeOutcome, hibernate, resume
from agent_sandbox.controllers.lifecycle.owners import ANNOTATION_RESTORED_FROM
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import PVC, SANDBOX, ApiClient, Object
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import execute, get_or_none, ready_ip
from tests.integration.lifecycle.test_hibernate import archived, owner_uids, pvc_sandbox

pytestmark = pytest.mark.integration


async def test_a_newcomer_does_not_keep_an_expired_archive(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    body = pvc_sandbox("lapsed", {})
    body["spec"]["shutdownTime"] = format_time(datetime.now(UTC) + timedelta(seconds=45))
    body["spec"]["shutdownPolicy"] = "Delete"
    await kube.create(SANDBOX, body, namespace=namespace)
    await ready_ip(kube, namespace, "lapsed")
    await hibernate(kube, "lapsed", namespace)
    await archived(kube, namespace, "lapsed")
    old_pvc_uid = (await kube.get(PVC, "data-lapsed", namespace=namespace))["metadata"]["uid"]

    # A new Sandbox under the name (without the hibernated one's shutdownTime), before the archive expires.
    newcomer = await kube.create(SANDBOX, pvc_sandbox("lapsed", {}), namespace=namespace)
    new_uid = newcomer["metadata"]["uid"]
    deadline = parse_time(body["spec"]["shutdownTime"])
    assert deadline is not None
    assert datetime.now(UTC) < deadline  # else this shows nothing: the archive went before the newcomer came

    async def refused() -> bool:
        sb = await kube.get(SANDBOX, "lapsed", namespace=namespace)
        return "SandboxArchive" in str((status_condition(sb, "Ready") or {}).get("message"))

    await eventually(refused, "the newcomer refused the archived volume", within=30)

    async def archive_gone() -> bool:
        return await get_or_none(kube, lc.ARCHIVE, "lapsed", namespace) is None

    await eventually(archive_gone, "the expired archive deleted despite the newcomer", within=90)

    async def own_volume() -> Object | None:
        pvc = await get_or_none(kube, PVC, "data-lapsed", namespace)
        fresh = pvc is not None and pvc["metadata"]["uid"] != old_pvc_uid
        return pvc if fresh and owner_uids(pvc, "Sandbox") == [new_uid] else None

    pvc = await eventually(own_volume, "the newcomer's own, new volume", within=60)
    assert owner_uids(pvc, "SandboxArchive") == [], pvc
    await ready_ip(kube, namespace, "lapsed", within=60)
    sb = await kube.get(SANDBOX, "lapsed", namespace=namespace)
    assert sb["metadata"]["uid"] == new_uid  # the newcomer, not a restore
    assert ANNOTATION_RESTORED_FROM not in (sb["metadata"].get("annotations") or {})


async def test_an_older_controllers_unrecorded_restore_is_finished(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(SANDBOX, pvc_sandbox("upgraded", {}), namespace=namespace)
    ip = await ready_ip(kube, namespace, "upgraded")
    async with http.put(f"http://{ip}:8080/v1/files/notes.txt", data=b"kept across the upgrade") as resp:
        assert resp.status == 204
    await hibernate(kube, "upgraded", namespace)
    archive = await archived(kube, namespace, "upgraded")

    # What the older controller did before it was stopped: created the restore (no `restored-from`), and
    # asked for it; `restored-uid` never recorded.
    now = datetime.now(UTC)
    made = lc.archived_sandbox(archive, cause=lc.Cause.MANUAL, now=now)
    assert ANNOTATION_RESTORED_FROM not in made["metadata"]["annotations"]
    restored = await kube.create(SANDBOX, made, namespace=namespace)
    await kube.patch(
        lc.ARCHIVE, "upgraded", lc.restore_request_patch(lc.Cause.MANUAL, now), namespace=namespace
    )

    ip = await ready_ip(kube, namespace, "upgraded", within=90)
    assert (await execute(http, ip, "cat notes.txt"))["stdout"] == "kept across the upgrade"
    sb = await kube.get(SANDBOX, "upgraded", namespace=namespace)
    assert sb["metadata"]["uid"] == restored["metadata"]["uid"]
    assert sb["metadata"]["annotations"][ANNOTATION_RESTORED_FROM] == archive["metadata"]["uid"]
    assert await resume(kube, "upgraded", namespace) is ResumeOutcome.ALREADY_RUNNING

    async def archive_gone() -> bool:
        return await get_or_none(kube, lc.ARCHIVE, "upgraded", namespace) is None

    await eventually(archive_gone, "the archive deleted once the restore is done", within=60)
