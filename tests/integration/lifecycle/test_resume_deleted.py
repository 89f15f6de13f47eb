"""A Sandbox deleted while it resumes, on the real control plane: the request the router holds for it, and
`agent-sandbox lifecycle resume`, are answered at once (503 "could not be resumed: it was deleted"; not found,
exit 3). A Sandbox without a finalizer goes from Running to absent in one watch event, never seen being
deleted: until December 7 both waited out their whole timeout and said it "was not Ready within".

The Sandbox's pod never becomes Ready (its readinessProbe asks for a path the runtime does not serve), so the
deletion always meets the resume still waiting, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import NoSuchSandbox, resume
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import POD, SANDBOX, ApiClient, Object
from agent_sandbox.router import Router
from tests.helpers import eventually
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.lifecycle.helpers import get_or_none, metric_value, router_metrics, through

pytestmark = pytest.mark.integration

StartRouter = Callable[..., Awaitable[Router]]
# Far above what the tests need, far below the default 60 s: a regression fails on the detail, not the clock.
_TIMEOUT = 30


def never_ready_suspended(name: str, annotations: dict[str, str]) -> Object:
    probe = {"httpGet": {"path": "/never-ready", "port": 8888}, "periodSeconds": 1}
    container = {"name": "runtime", "image": RUNTIME_IMAGE, "readinessProbe": probe}
    return {
        "apiVersion": SANDBOX.api_version,
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"operatingMode": "Suspended", "podTemplate": {"spec": {"containers": [container]}}},
    }


async def resumed_and_starting(kube: ApiClient, namespace: str, name: str) -> None:
    """Wait until the Sandbox was set Running and its (never Ready) pod exists: the resume is under way."""

    async def starting() -> bool:
        sandbox = await get_or_none(kube, SANDBOX, name, namespace)
        running = sandbox is not None and sandbox["spec"].get("operatingMode") == "Running"
        return running and await get_or_none(kube, POD, name, namespace) is not None

    await eventually(starting, f"{name} set Running, its pod created", within=_TIMEOUT)


async def test_held_request_for_a_sandbox_deleted_while_it_resumes_is_answered_at_once(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router(f"--sandbox-lifecycle-resume-timeout={_TIMEOUT}s")
    name = "gone"
    await kube.create(
        SANDBOX, never_ready_suspended(name, {lc.ANNOTATION_AUTO_RESUME: "true"}), namespace=namespace
    )

    async def router_sees_it_suspended() -> bool:
        assert router.lifecycle is not None
        view = router.lifecycle.state.sandboxes.get((namespace, name))
        return view is not None and view.suspended

    await eventually(router_sees_it_suspended, "the router seeing the Sandbox suspended")
    held = asyncio.create_task(through(http, router, name, namespace))
    await resumed_and_starting(kube, namespace, name)  # the router's resume
    assert not held.done()
    await kube.delete(SANDBOX, name, namespace=namespace)
    status, body = await held
    assert (status, body) == (
        503,
        {"detail": f"Sandbox {namespace}/{name} could not be resumed: it was deleted"},
    )
    metrics = await router_metrics(router)
    assert metric_value(metrics, "sandbox_router_resume_wait_seconds_count", outcome="failed") == 1
    assert metric_value(metrics, "sandbox_router_resume_wait_seconds_count", outcome="timeout") == 0


async def test_cli_resume_of_a_sandbox_deleted_while_it_starts_is_not_found(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    name = "gone-cli"
    await kube.create(SANDBOX, never_ready_suspended(name, {}), namespace=namespace)
    waiting = asyncio.create_task(resume(kube, name, namespace, wait=_TIMEOUT))
    await resumed_and_starting(kube, namespace, name)
    assert not waiting.done()
    await kube.delete(SANDBOX, name, namespace=namespace)
    with pytest.raises(NoSuchSandbox, match=f"Sandbox {namespace}/{name} was deleted while it started"):
        await waiting
