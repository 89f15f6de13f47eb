"""`RouterLifecycle.hold` against in-memory caches: which pod counts as the resumed one.

A Sandbox the router sees Suspended may still have its old pod in the Pod cache (Ready, being deleted: a real
kubelet keeps a terminating pod Ready until its probe fails). That pod is never taken for the resumed one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import SANDBOX
from agent_sandbox.kube.testing import FakeClient
from agent_sandbox.router._lifecycle import RouterLifecycle
from agent_sandbox.router._lifecycle_state import LifecycleState, sandbox_view
from agent_sandbox.router._metrics import RouterMetrics
from agent_sandbox.router._podcache import PodCache
from agent_sandbox.router._routing import Route
from tests.unit.router.test_resolve import pod

pytestmark = pytest.mark.unit

ROUTE = Route("sb", "team", 8888)


def suspended_sandbox() -> dict[str, Any]:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "sb",
            "namespace": "team",
            "uid": "uid-sb",
            "annotations": {lc.ANNOTATION_AUTO_RESUME: "true"},
        },
        "spec": {"operatingMode": "Suspended"},
    }


def deleting(p: dict[str, Any]) -> dict[str, Any]:
    p["metadata"]["deletionTimestamp"] = "2026-12-05T18:00:00Z"
    p["metadata"]["uid"] = "pod-old"
    return p


async def test_a_pod_being_deleted_is_not_taken_for_the_resumed_one() -> None:
    api = FakeClient()
    stored = await api.create(SANDBOX, suspended_sandbox(), namespace="team")
    state = LifecycleState(api)
    state.sandboxes[("team", "sb")] = sandbox_view(stored)
    cache = PodCache(api)
    cache._upsert(deleting(pod("sb", "127.0.0.5")))
    lifecycle = RouterLifecycle(api, state, cache, RouterMetrics(), resume_timeout=30, activity_interval=0)
    assert lifecycle.seen_suspended(ROUTE)

    held = asyncio.create_task(lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30))
    await asyncio.sleep(0.2)
    assert not held.done()  # the old pod, still Ready, is not the resumed one
    resumed = await api.get(SANDBOX, "sb", namespace="team")
    assert resumed["spec"]["operatingMode"] == "Running"  # the resume was written meanwhile

    cache._delete(deleting(pod("sb", "127.0.0.5")))
    new = pod("sb", "127.0.0.6")
    new["metadata"]["uid"] = "pod-new"
    cache._upsert(new)
    assert await asyncio.wait_for(held, 5) is True
    assert lifecycle.current_pod(ROUTE) is not None
    assert lifecycle.current_pod(ROUTE).ip == "127.0.0.6"  # type: ignore[union-attr]
    await lifecycle.close()
