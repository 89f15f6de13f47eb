"""`RouterLifecycle` leaves unclaimed warm-pool members alone.

An unclaimed pool member is not routable by name (router spec §1.9.4: nobody may use, or tamper with, a sandbox
before its claimant): without `--sandbox-lifecycle` a request naming one gets the prompt 502. Its template may
ask for `auto-resume` (the claimed Sandbox inherits it), but until December 6 the router held such a request
for the whole resume timeout ("wait": the member looks Running) and then answered a misleading 503 "... is
resuming but was not Ready within 60s"; a suspended member would even have been resumed, and one with an idle
timeout got a `last-activity` write. The views go through the informer's diet here, as in the router, so a
diet that dropped the pool label would be caught.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api.constants import ANNOTATION_SANDBOX_TEMPLATE_REF, LABEL_WARM_POOL_SANDBOX
from agent_sandbox.kube import SANDBOX
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._lifecycle import RouterLifecycle
from agent_sandbox.router._lifecycle_state import LifecycleState, _diet_sandbox, sandbox_view
from agent_sandbox.router._metrics import RouterMetrics
from agent_sandbox.router._podcache import PodCache
from agent_sandbox.router._routing import Route
from tests.unit.router.test_resolve import pod

pytestmark = pytest.mark.unit

ROUTE = Route("pauto-74fvk", "team", 8888)
TEMPLATE = "pauto"


def member(*, mode: str = "Running", claimed: bool = False, **spec: Any) -> dict[str, Any]:
    """A pool member Sandbox as the warm-pool controller makes it (the template is referenced, not copied)."""
    labels = {"agents.x-k8s.io/sandbox-template-ref-hash": "abc"}
    if not claimed:  # the claim's takeover removes it (before the claim is Ready)
        labels[LABEL_WARM_POOL_SANDBOX] = "def"
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": ROUTE.sandbox_id,
            "namespace": ROUTE.namespace,
            "uid": "uid-member",
            "labels": labels,
            "annotations": {ANNOTATION_SANDBOX_TEMPLATE_REF: TEMPLATE},
        },
        "spec": {"operatingMode": mode, **spec},
    }


async def lifecycle_for(
    obj: dict[str, Any], template: dict[str, str], *, activity_interval: float = 0
) -> tuple[FakeClient, RouterLifecycle]:
    api = FakeClient()
    stored = await api.create(SANDBOX, obj, namespace=ROUTE.namespace)
    state = LifecycleState(api)
    state.templates[(ROUTE.namespace, TEMPLATE)] = template
    state.sandboxes[(ROUTE.namespace, ROUTE.sandbox_id)] = sandbox_view(_diet_sandbox(stored))
    lifecycle = RouterLifecycle(
        api,  # type: ignore[arg-type]
        state,
        PodCache(api),
        RouterMetrics(),
        resume_timeout=30,
        activity_interval=activity_interval,
    )
    return api, lifecycle


AUTO = {lc.ANNOTATION_AUTO_RESUME: "true"}


@pytest.mark.parametrize("mode", ["Running", "Suspended"])
async def test_a_request_to_an_unclaimed_pool_member_is_not_held(mode: str) -> None:
    api, lifecycle = await lifecycle_for(member(mode=mode), AUTO)
    deadline = asyncio.get_running_loop().time() + 30
    # False: "goes on as without lifecycle" (the prompt 502), not held until the resume timeout.
    assert await asyncio.wait_for(lifecycle.hold(ROUTE, deadline), 2) is False
    unchanged = await api.get(SANDBOX, ROUTE.sandbox_id, namespace=ROUTE.namespace)
    assert unchanged["spec"]["operatingMode"] == mode  # a suspended member is not resumed by a stranger
    assert lc.ANNOTATION_RESUME_REASON not in (unchanged["metadata"].get("annotations") or {})
    await lifecycle.close()


async def test_an_expired_unclaimed_pool_member_gets_no_lifecycle_503() -> None:
    _, lifecycle = await lifecycle_for(member(shutdownTime="2026-01-01T00:00:00Z"), AUTO)
    deadline = asyncio.get_running_loop().time() + 30
    assert await asyncio.wait_for(lifecycle.hold(ROUTE, deadline), 2) is False
    await lifecycle.close()


class _InFlight:
    """A request awaiting its response (`_lifecycle_activity.Traffic`)."""

    awaiting_response = True
    last_traffic = 0.0


async def test_a_request_to_an_unclaimed_pool_member_records_no_activity() -> None:
    api, lifecycle = await lifecycle_for(
        member(), {**AUTO, lc.ANNOTATION_IDLE_TIMEOUT: "10m"}, activity_interval=1
    )
    assert lifecycle.record(ROUTE.namespace, ROUTE.sandbox_id) is None
    lifecycle.watch(
        ROUTE.namespace, ROUTE.sandbox_id, _InFlight()
    )  # even a request in flight: nothing to write
    for _ in range(2):
        assert lifecycle.record(ROUTE.namespace, ROUTE.sandbox_id) is None
    assert not lifecycle._pending
    unchanged = await api.get(SANDBOX, ROUTE.sandbox_id, namespace=ROUTE.namespace)
    assert lc.ANNOTATION_LAST_ACTIVITY not in (unchanged["metadata"].get("annotations") or {})
    await lifecycle.close()


async def test_a_claimed_member_resumes_on_request_as_any_sandbox() -> None:
    # Once claimed (its pool label gone) the member is the claimant's Sandbox: held while it starts.
    _, lifecycle = await lifecycle_for(member(claimed=True), AUTO)
    lifecycle.cache._upsert(pod(ROUTE.sandbox_id, "127.0.0.5", uid="uid-member"))
    deadline = asyncio.get_running_loop().time() + 30
    assert await asyncio.wait_for(lifecycle.hold(ROUTE, deadline), 2) is True
    held = asyncio.create_task(lifecycle.hold(ROUTE, deadline, lifecycle.current_pod(ROUTE)))
    await asyncio.sleep(0.2)
    assert not held.done()  # waited for (its pod failed a dial): not handed back as "not ours"
    held.cancel()
    await lifecycle.close()


def test_the_view_keeps_whether_the_sandbox_is_an_unclaimed_pool_member() -> None:
    assert sandbox_view(_diet_sandbox(member())).unclaimed_pool_member
    assert not sandbox_view(_diet_sandbox(member(claimed=True))).unclaimed_pool_member


async def test_a_suspended_unclaimed_pool_member_is_not_taken_for_a_suspending_sandbox() -> None:
    # The proxy holds a request to a Sandbox seen Suspended before dialling its pod: not for a pool member.
    _, lifecycle = await lifecycle_for(member(mode="Suspended"), AUTO)
    assert not lifecycle.seen_suspended(ROUTE)
    await lifecycle.close()
