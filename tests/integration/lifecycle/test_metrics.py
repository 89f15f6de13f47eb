"""The lifecycle metrics (docs/lifecycle.md "Observability"), scraped from the real controller and router.

One Sandbox goes through the whole journey (idle suspend, resume on request, hibernation, restore on
request) and each step must move exactly its own series: suspends and resumes by cause, the resume latency
histograms (the controller's and the router's resume-on-request wait), and the hibernated count.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import hibernate
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import SANDBOX, ApiClient, Object
from agent_sandbox.router import Router
from tests.helpers import controller_metrics, eventually
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.lifecycle.helpers import (
    get_or_none,
    metric_value,
    ready_ip,
    router_metrics,
    through,
)

pytestmark = pytest.mark.integration

StartRouter = Callable[..., Awaitable[Router]]


def counted(cluster: DevCluster, name: str, **labels: str) -> Callable[[], Awaitable[float | None]]:
    """A probe for `eventually`: the controller's `name{labels}` once it is non-zero."""

    async def probe() -> float | None:
        return metric_value(controller_metrics(cluster), name, **labels) or None

    return probe


async def test_each_step_moves_its_own_series(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
) -> None:
    router = await start_router()
    body: Object = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {
            "name": "counted",
            "annotations": {lc.ANNOTATION_AUTO_RESUME: "true", lc.ANNOTATION_IDLE_TIMEOUT: "2s"},
        },
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}}},
    }
    await kube.create(SANDBOX, body, namespace=namespace)
    await ready_ip(kube, namespace, "counted")

    # Idle suspend, by the controller.
    suspends = "agent_sandbox_lifecycle_suspends_total"
    assert await eventually(counted(cluster, suspends, cause="Idle"), "an Idle suspend counted") == 1
    sandbox = await kube.get(SANDBOX, "counted", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Suspended"
    # No more idle timer: the rest of the journey is driven by hand.
    no_timer = {"metadata": {"annotations": {lc.ANNOTATION_IDLE_TIMEOUT: None}}}
    await kube.patch(SANDBOX, "counted", no_timer, namespace=namespace)

    # Resume on request: the router's wait histogram and the controller's resume series.
    status, _ = await through(http, router, "counted", namespace)
    assert status == 200
    text = await router_metrics(router)
    assert metric_value(text, "sandbox_router_lifecycle_resumes_total", result="resumed") == 1
    assert metric_value(text, "sandbox_router_resume_wait_seconds_count", outcome="ready") == 1
    assert metric_value(text, "sandbox_router_resume_wait_seconds_sum", outcome="ready") > 0
    assert metric_value(text, "sandbox_router_resume_wait_seconds_bucket", outcome="ready", le="+Inf") == 1
    seconds = "agent_sandbox_lifecycle_resume_seconds_count"
    resumed = counted(cluster, seconds, cause="Request", **{"from": "suspended"})
    assert await eventually(resumed, "the resume timed to Ready") == 1
    text = controller_metrics(cluster)
    assert metric_value(text, "agent_sandbox_lifecycle_resumes_total", cause="Request") == 1
    assert metric_value(text, "agent_sandbox_lifecycle_resumes_total", cause="Manual") == 0
    assert metric_value(text, "agent_sandbox_lifecycle_hibernated_sandboxes", namespace=namespace) == 0

    # Hibernation on demand: suspended first (cause Hibernate), archived, counted as hibernated.
    await hibernate(kube, "counted", namespace)
    hibernations = counted(cluster, "agent_sandbox_lifecycle_hibernations_total", cause="Requested")
    assert await eventually(hibernations, "the hibernation counted") == 1
    gauge = "agent_sandbox_lifecycle_hibernated_sandboxes"
    assert await eventually(counted(cluster, gauge, namespace=namespace), "one hibernated") == 1
    assert metric_value(controller_metrics(cluster), suspends, cause="Hibernate") == 1

    # Restore on request.
    status, _ = await through(http, router, "counted", namespace)
    assert status == 200
    text = await router_metrics(router)
    assert metric_value(text, "sandbox_router_lifecycle_resumes_total", result="restored") == 1
    assert metric_value(text, "sandbox_router_resume_wait_seconds_count", outcome="ready") == 2
    restored = counted(cluster, seconds, cause="Request", **{"from": "hibernated"})
    assert await eventually(restored, "the restore timed to Ready") == 1
    restores = counted(cluster, "agent_sandbox_lifecycle_restores_total", cause="Request")
    assert await eventually(restores, "the restore counted") == 1

    async def none_hibernated() -> bool:
        archive_gone = await get_or_none(kube, lc.ARCHIVE, "counted", namespace) is None
        return archive_gone and metric_value(controller_metrics(cluster), gauge, namespace=namespace) == 0

    await eventually(none_hibernated, "the hibernated count back to 0")
    assert metric_value(controller_metrics(cluster), suspends, cause="Idle") == 1  # nothing else suspended
