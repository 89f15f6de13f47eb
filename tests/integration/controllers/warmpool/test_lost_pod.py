"""A Ready warm-pool member whose Pod is gone leaves Ready at once (docs/design/boot-status-hold.md).

Real control plane and the real `agent-sandbox-controller --extensions` process (claim priority on, so the
boot hold is too). A probe found a member whose Pod was force-deleted under a zero-pod quota kept Ready=True
and the dead Pod's podIPs for the boot hold (~5 s): its Ready=False write was held as a booting member's,
and a claim applied 0.3 s later adopted the Pod-less member (§4.5.2 takes Ready members). The hold applies
only to a member that never was Ready or addressed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from agent_sandbox.api.meta import controller_ref
from agent_sandbox.controllers.sandbox.status import BOOT_HOLD
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import (
    POD,
    SANDBOX,
    SANDBOX_CLAIM,
    ApiClient,
    Object,
    ResourceKind,
    ServerError,
    TransportError,
)
from tests.helpers import eventually, is_ready
from tests.integration.controllers.builders import claim_body, create_template_and_pool, pool_members

pytestmark = pytest.mark.integration

RESOURCE_QUOTA = ResourceKind("", "v1", "ResourceQuota", "resourcequotas")


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with its default flags: claim priority (and with it the boot hold) enabled."""
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)


@contextlib.asynccontextmanager
async def _versions(kube: ApiClient, sandbox: Object) -> AsyncIterator[list[tuple[float, Object]]]:
    """Every version of `sandbox` written after the one given, with the monotonic time it arrived."""
    seen: list[tuple[float, Object]] = []
    ns, name = sandbox["metadata"]["namespace"], sandbox["metadata"]["name"]

    async def record() -> None:
        rv = sandbox["metadata"]["resourceVersion"]
        while True:
            stream = kube.watch(
                SANDBOX, namespace=ns, field_selector=f"metadata.name={name}", resource_version=rv
            )
            try:
                async for event in stream:
                    rv = event.object["metadata"]["resourceVersion"]
                    if event.type != "BOOKMARK":
                        seen.append((time.monotonic(), event.object))
            except (ServerError, TransportError):
                await asyncio.sleep(0.1)  # resume from the last version seen: no write is missed

    task = asyncio.create_task(record())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _owner_kind(sandbox: Object) -> str | None:
    ref = controller_ref(sandbox["metadata"])
    return None if ref is None else str(ref.get("kind"))


def _left_ready(sandbox: Object) -> bool:
    return not is_ready(sandbox) and not (sandbox.get("status") or {}).get("podIPs")


async def test_a_ready_member_whose_pod_is_gone_leaves_ready_before_a_claim_can_adopt_it(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    await create_template_and_pool(kube, ns, replicas=1)

    async def ready_member() -> Object | None:
        members = await pool_members(kube, ns)
        ok = [m for m in members if is_ready(m) and (m.get("status") or {}).get("podIPs")]
        return ok[0] if len(members) == 1 and ok else None

    member = await eventually(ready_member, "1 Ready, addressed pool member", within=90)
    name = member["metadata"]["name"]
    pod_name = member["metadata"]["annotations"].get("agents.x-k8s.io/pod-name", name)
    quota = {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    await kube.create(RESOURCE_QUOTA, quota, namespace=ns)

    async def enforced() -> bool:
        rq = await kube.get(RESOURCE_QUOTA, "no-pods", namespace=ns)
        return "hard" in (rq.get("status") or {})

    await eventually(enforced, "the quota enforced")
    member = await kube.get(SANDBOX, name, namespace=ns)
    assert is_ready(member)

    async with _versions(kube, member) as seen:
        started = time.monotonic()
        await kube.delete(POD, pod_name, namespace=ns, grace_period_seconds=0)

        async def left_ready() -> tuple[float, Object] | None:
            return next(((t, sb) for t, sb in seen if _left_ready(sb)), None)

        # Without the fix the write waited for the boot hold (>= BOOT_HOLD after the delete); the controller
        # acts on the Pod's delete event, so the write lands well within it.
        arrived, written = await eventually(left_ready, "the member's Ready=False write", within=30)
        assert arrived - started < BOOT_HOLD - 1.0, (
            f"Ready=False came {arrived - started:.1f}s after the delete"
        )
        # No version in between showed Ready=True with the dead Pod gone (the only other writes: metadata).
        before = [sb for t, sb in seen if t < arrived]
        assert all(_owner_kind(sb) == "SandboxWarmPool" for sb in before)
        ready_cond = next(cd for cd in written["status"]["conditions"] if cd["type"] == "Ready")
        assert ready_cond["status"] == "False"

        # A claim arriving now cannot adopt the Pod-less member (no podIPs: not a candidate, §4.5.2).
        await kube.create(SANDBOX_CLAIM, claim_body("late"), namespace=ns)

        async def claim_bound() -> str | None:
            claim = await kube.get(SANDBOX_CLAIM, "late", namespace=ns)
            return ((claim.get("status") or {}).get("sandbox") or {}).get("name") or None

        bound = await eventually(claim_bound, "the claim bound to a Sandbox", within=60)
        assert bound != name
        member = await kube.get(SANDBOX, name, namespace=ns)
        assert _owner_kind(member) == "SandboxWarmPool"
        assert all(
            _owner_kind(sb) == "SandboxWarmPool"
            for _, sb in seen
            if not sb["metadata"].get("deletionTimestamp")
        )
