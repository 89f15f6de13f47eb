"""A hibernated Sandbox whose owner is gone (docs/lifecycle.md "Deep hibernation"), on the real control plane.

A claim deleted with `propagationPolicy: Orphan` leaves its dependents: its hibernated Sandbox's archive is
kept (the garbage collector drops the claim's reference from it). The archived copy of the Sandbox still
names the claim as its owner; restored as it was, the new Sandbox would have only a missing owner, and the
garbage collector would delete it at once. Until December 6 the restore then ended as "a restored Sandbox
deleted during its restore": the archive was deleted and the volume with it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import hibernate, resume
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import (
    PVC,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    ApiClient,
    Object,
)
from tests.helpers import eventually, is_ready
from tests.integration.lifecycle.helpers import claim_body, get_or_none, pool_body, runtime_template
from tests.integration.lifecycle.test_hibernate import VCT, archived, owner_uids

pytestmark = pytest.mark.integration


async def test_a_restore_under_an_orphaning_deleted_claim_keeps_the_volume(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    template = runtime_template("own-tmpl", volumeClaimTemplates=VCT)
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body("own-pool", "own-tmpl", 1), namespace=namespace)
    await kube.create(SANDBOX_CLAIM, claim_body("gone", "own-pool"), namespace=namespace)

    async def bound() -> str | None:
        cl = await get_or_none(kube, SANDBOX_CLAIM, "gone", namespace)
        name = (((cl or {}).get("status") or {}).get("sandbox") or {}).get("name")
        return str(name) if cl is not None and is_ready(cl) and name else None

    name = await eventually(bound, "claim Ready", within=90)
    claim_uid = (await kube.get(SANDBOX_CLAIM, "gone", namespace=namespace))["metadata"]["uid"]
    await hibernate(kube, name, namespace)
    archive = await archived(kube, namespace, name, within=90)
    assert owner_uids(archive, "SandboxClaim") == [claim_uid]
    pvc_name = f"data-{name}"

    await kube.delete(SANDBOX_CLAIM, "gone", namespace=namespace, propagation_policy="Orphan")

    async def orphaned() -> Object | None:
        if await get_or_none(kube, SANDBOX_CLAIM, "gone", namespace) is not None:
            return None
        kept = await get_or_none(kube, lc.ARCHIVE, name, namespace)
        return kept if kept is not None and not owner_uids(kept, "SandboxClaim") else None

    # kube-controller-manager's garbage collector does the orphaning: a fresh-clone CI run on a loaded box once
    # took over 60 s (passes in ~40 s alone), so it gets the claim's own 90.
    kept = await eventually(orphaned, "the claim deleted, its archive kept (orphaned)", within=90)
    # The archived copy still names the deleted claim: that is what the restore must not bring back.
    archived_owners = kept["spec"]["sandbox"]["metadata"]["ownerReferences"]
    assert [o["uid"] for o in archived_owners] == [claim_uid]

    await resume(kube, name, namespace)  # a restore request; no claim to be expired

    async def restored() -> Object | None:
        pvc = await get_or_none(kube, PVC, pvc_name, namespace)
        assert pvc is not None, "the volume was deleted"
        assert not pvc["metadata"].get("deletionTimestamp"), "the volume is being deleted"
        sb = await get_or_none(kube, SANDBOX, name, namespace)
        archive = await get_or_none(kube, lc.ARCHIVE, name, namespace)
        if sb is None and archive is None:  # the garbage collector takes the volume next
            pytest.fail("the restored Sandbox and its archive were deleted")
        if sb is None or not is_ready(sb) or archive is not None:
            return None
        return sb if owner_uids(pvc, "Sandbox") == [sb["metadata"]["uid"]] else None

    sb = await eventually(restored, "restored, Ready, its volume adopted, the archive gone", within=120)
    # An ordinary unowned Sandbox now, as a live one is after its claim's orphaning deletion.
    owners: list[dict[str, Any]] = sb["metadata"].get("ownerReferences") or []
    assert [o for o in owners if o.get("uid") == claim_uid] == []
    # Still there once the garbage collector had its look (it would delete a Sandbox whose owners are gone).
    await asyncio.sleep(2)
    again = await get_or_none(kube, SANDBOX, name, namespace)
    assert again is not None
    assert again["metadata"]["uid"] == sb["metadata"]["uid"]
    pvc = await kube.get(PVC, pvc_name, namespace=namespace)
    assert not pvc["metadata"].get("deletionTimestamp")
