"""Every lifecycle feature is off unless asked for (docs/lifecycle.md): with the real controller and the real
router both without `--sandbox-lifecycle` (their default), a Sandbox that carries every lifecycle annotation is never suspended,
hibernated or resumed, no activity is written on it, and no lifecycle metric appears.

The opposite half (the component installed, a Sandbox that did not ask) is
`test_resume.py::test_sandboxes_that_did_not_ask_keep_upstream_behaviour` and `test_idle.py`'s untouched
Sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import POD, SANDBOX, ApiClient, Object
from agent_sandbox.router import Router
from tests.helpers import controller_metrics, eventually
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.lifecycle.helpers import get_or_none, ready_ip, router_metrics, through

pytestmark = pytest.mark.integration

EVERYTHING = {
    lc.ANNOTATION_IDLE_TIMEOUT: "2s",
    lc.ANNOTATION_HIBERNATE_AFTER: "1s",
    lc.ANNOTATION_AUTO_RESUME: "true",
}


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with its default flags (no `--sandbox-lifecycle`)."""
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)


def asking_sandbox(name: str) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": dict(EVERYTHING)},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}}},
    }


async def test_default_flags_mean_no_lifecycle_behaviour(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: Callable[..., Awaitable[Router]],
    http: aiohttp.ClientSession,
) -> None:
    default_router = await start_router(lifecycle=False)  # the Pod cache on: the dev cluster has no DNS
    await kube.create(SANDBOX, asking_sandbox("asks"), namespace=namespace)
    await ready_ip(kube, namespace, "asks")
    status, body = await through(http, default_router, "asks", namespace)
    assert (status, body["stdout"]) == (200, "asks\n")
    # Well past idle-timeout + hibernate-after (a lifecycle controller suspends and archives within ~4 s).
    await asyncio.sleep(8)
    sandbox = await kube.get(SANDBOX, "asks", namespace=namespace)
    assert sandbox["spec"].get("operatingMode", "Running") == "Running"
    annotations = sandbox["metadata"]["annotations"]
    written = {lc.ANNOTATION_SUSPEND_REASON, lc.ANNOTATION_LAST_ACTIVITY, lc.ANNOTATION_RESUME_REASON}
    assert written.isdisjoint(annotations)
    ours = {k: v for k, v in annotations.items() if k.startswith("lifecycle.agents.x-k8s.io/")}
    assert ours == EVERYTHING

    # Suspended by hand, a request is upstream's 502 and does not resume it.
    await kube.patch(SANDBOX, "asks", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)

    async def pod_gone() -> bool:
        return await get_or_none(kube, POD, "asks", namespace) is None

    await eventually(pod_gone, "the pod gone")
    status, body = await through(http, default_router, "asks", namespace)
    assert (status, body) == (502, {"detail": "Could not connect to the backend sandbox: asks"})
    await asyncio.sleep(3)  # hibernate-after (1 s) passed again: still a plain suspended Sandbox
    sandbox = await kube.get(SANDBOX, "asks", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Suspended"
    assert lc.ANNOTATION_RESUME_REASON not in sandbox["metadata"]["annotations"]

    assert "agent_sandbox_lifecycle_" not in controller_metrics(cluster)
    assert "sandbox_router_lifecycle_resumes_total{" not in await router_metrics(default_router)
    assert "sandbox_router_resume_wait_seconds_count{" not in await router_metrics(default_router)
