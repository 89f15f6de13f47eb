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
from agent_sandbox.router._lifecycle import ResumeFailed, RouterLifecycle
from agent_sandbox.router._lifecycle_state import LifecycleState, _diet_archive, archive_view, sandbox_view
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


def old_pod() -> dict[str, Any]:
    p = pod("sb", "127.0.0.5")
    p["metadata"]["uid"] = "pod-old"
    return p


def view_of(obj: dict[str, Any], *, mode: str, ready: bool, generation: int) -> Any:
    obj = {**obj, "metadata": {**obj["metadata"], "generation": generation}, "spec": {"operatingMode": mode}}
    status = "True" if ready else "False"
    obj["status"] = {"conditions": [{"type": "Ready", "status": status, "observedGeneration": generation}]}
    return sandbox_view(obj)


async def _seen_suspended_with_its_pod_not_deleting_yet() -> tuple[Any, LifecycleState, PodCache, Any]:
    api = FakeClient()
    stored = await api.create(SANDBOX, suspended_sandbox(), namespace="team")
    state = LifecycleState(api)
    state.sandboxes[("team", "sb")] = view_of(stored, mode="Suspended", ready=True, generation=2)
    cache = PodCache(api)
    cache._upsert(old_pod())  # the suspend's delete is not in the Pod cache yet
    lifecycle = RouterLifecycle(api, state, cache, RouterMetrics(), resume_timeout=30, activity_interval=0)
    assert lifecycle.seen_suspended(ROUTE)
    leaving = lifecycle.current_pod(ROUTE)
    deadline = asyncio.get_running_loop().time() + 30
    held = asyncio.create_task(lifecycle.hold(ROUTE, deadline, leaving, leaving=True))
    await asyncio.sleep(0.2)
    # The pod of a Sandbox seen Suspended is the one going, not the resumed one (CI's
    # `test_requests_around_the_controllers_idle_suspend_are_all_served` met it, and the request's command
    # was killed with that pod).
    assert not held.done()
    return lifecycle, state, cache, held


async def test_the_pod_of_a_sandbox_seen_suspended_is_not_taken_before_its_deletion_shows() -> None:
    lifecycle, _, cache, held = await _seen_suspended_with_its_pod_not_deleting_yet()
    gone = old_pod()
    gone["metadata"]["deletionTimestamp"] = "2026-12-05T21:00:00Z"
    cache._upsert(gone)
    await asyncio.sleep(0.1)
    assert not held.done()
    cache._delete(gone)
    new = pod("sb", "127.0.0.6")
    new["metadata"]["uid"] = "pod-new"
    cache._upsert(new)
    assert await asyncio.wait_for(held, 5) is True
    assert lifecycle.current_pod(ROUTE).pod_uid == "pod-new"  # type: ignore[union-attr]
    await lifecycle.close()


async def test_the_same_pod_serves_when_the_resume_came_before_its_deletion() -> None:
    lifecycle, state, _, held = await _seen_suspended_with_its_pod_not_deleting_yet()
    resumed = await lifecycle.api.get(SANDBOX, "sb", namespace="team")
    assert resumed["spec"]["operatingMode"] == "Running"  # the hold resumed it
    # Running but not Ready at the new generation yet: the controller has not reported on that pod.
    state.sandboxes[("team", "sb")] = view_of(resumed, mode="Running", ready=False, generation=3)
    state._changes.notify()
    await asyncio.sleep(0.1)
    assert not held.done()
    # The controller kept the pod (it saw Running before it deleted anything) and reports it Ready.
    state.sandboxes[("team", "sb")] = view_of(resumed, mode="Running", ready=True, generation=3)
    state._changes.notify()
    assert await asyncio.wait_for(held, 5) is True
    assert lifecycle.current_pod(ROUTE).pod_uid == "pod-old"  # type: ignore[union-attr]
    await lifecycle.close()


def _ready_false(reason: str, message: str) -> dict[str, Any]:
    obj = suspended_sandbox()
    obj["metadata"]["generation"] = 2
    obj["spec"]["operatingMode"] = "Running"
    obj["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": reason,
                "message": message,
                "observedGeneration": 2,
            }
        ]
    }
    return obj


def test_a_conflict_the_sandbox_controller_retries_is_not_a_blocker() -> None:
    # Until December 6 a restore's PVC hand-over raced the Sandbox controller's adoption and the held
    # request got an immediate 503 "could not be resumed: ReconcilerError: ... the object has been modified".
    conflict = (
        "failed to patch PVC with owner reference: Operation cannot be fulfilled on persistentvolumeclaims "
        '"data-sb": the object has been modified; please apply your changes to the latest version and try again'
    )
    assert sandbox_view(_ready_false("ReconcilerError", conflict)).blocker == ""
    quota = 'Error seen: pods "sb" is forbidden: exceeded quota: q'
    assert sandbox_view(_ready_false("ReconcilerError", quota)).blocker == f"ReconcilerError: {quota}"
    expired = sandbox_view(_ready_false("SandboxExpired", "Sandbox has expired")).blocker
    assert expired == "SandboxExpired: Sandbox has expired"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"spec": {"shutdownTime": "2026-01-01T00:00:00Z"}}, "it has expired"),
        ({"metadata": {"deletionTimestamp": "2026-12-05T18:00:00Z"}}, "it is being deleted"),
    ],
)
async def test_an_expired_or_deleting_sandbox_fails_at_once(change: dict[str, Any], said: str) -> None:
    # Until December 6 the request was held for the whole resume timeout, then "was not Ready within 60s".
    api = FakeClient()
    stored = await api.create(SANDBOX, suspended_sandbox(), namespace="team")
    obj = {**stored, "metadata": {**stored["metadata"], **change.get("metadata", {})}}
    obj["spec"] = {**stored["spec"], **change.get("spec", {})}
    state = LifecycleState(api)
    state.sandboxes[("team", "sb")] = sandbox_view(obj)
    lifecycle = RouterLifecycle(
        api,  # type: ignore[arg-type]
        state,
        PodCache(api),
        RouterMetrics(),
        resume_timeout=30,
        activity_interval=0,
    )
    deadline = asyncio.get_running_loop().time() + 30
    with pytest.raises(ResumeFailed, match=said):
        await asyncio.wait_for(lifecycle.hold(ROUTE, deadline), 2)
    unchanged = await api.get(SANDBOX, "sb", namespace="team")
    assert unchanged["spec"]["operatingMode"] == "Suspended"  # not resumed for nothing
    await lifecycle.close()


async def test_an_expired_archive_is_not_restored() -> None:
    api = FakeClient()
    state = LifecycleState(api)
    archive = {
        "metadata": {"name": "sb", "namespace": "team", "uid": "a-uid", "resourceVersion": "3"},
        "spec": {
            "sandbox": {
                "metadata": {"annotations": {lc.ANNOTATION_AUTO_RESUME: "true"}},
                "spec": {"shutdownTime": "2026-01-01T00:00:00Z"},
            }
        },
    }
    state.archives[("team", "sb")] = archive_view(_diet_archive(archive))
    lifecycle = RouterLifecycle(
        api,  # type: ignore[arg-type]
        state,
        PodCache(api),
        RouterMetrics(),
        resume_timeout=30,
        activity_interval=0,
    )
    deadline = asyncio.get_running_loop().time() + 30
    with pytest.raises(ResumeFailed, match="could not be resumed: it is hibernated and has expired"):
        await asyncio.wait_for(lifecycle.hold(ROUTE, deadline), 2)
    await lifecycle.close()


async def test_the_first_resume_in_a_namespace_is_counted_under_its_name() -> None:
    # Until December 7 the namespace was admitted to the metrics labels only once a pod resolved, after the
    # hold had counted its resume and its wait: a namespace's first resume was counted under "-".
    api = FakeClient()
    stored = await api.create(SANDBOX, suspended_sandbox(), namespace="team")
    state = LifecycleState(api)
    state.sandboxes[("team", "sb")] = sandbox_view(stored)
    cache = PodCache(api)
    metrics = RouterMetrics()
    cache._upsert(pod("sb", "127.0.0.6"))  # Ready at once: the hold counts its wait and ends
    lifecycle = RouterLifecycle(api, state, cache, metrics, resume_timeout=30, activity_interval=0)
    assert await lifecycle.hold(ROUTE, asyncio.get_running_loop().time() + 30) is True
    await asyncio.gather(*lifecycle._resuming.values())  # the resume it started counts its write
    sample = metrics.registry.get_sample_value
    resumes = {"sandbox_namespace": "team", "result": "resumed"}
    assert sample("sandbox_router_lifecycle_resumes_total", resumes) == 1
    waits = {"sandbox_namespace": "team", "outcome": "ready"}
    assert sample("sandbox_router_resume_wait_seconds_count", waits) == 1
    await lifecycle.close()
