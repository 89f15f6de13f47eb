"""Unclaimed warm-pool members through a `--sandbox-lifecycle` router, on the real control plane.

A pool member is not routable by name until a claim takes it (router spec §1.9.4): a request naming one gets
the prompt 502, with or without lifecycle, even when its template asks for `auto-resume` (and an idle
timeout). Until December 6 the lifecycle router held that request for its whole resume timeout and then
answered 503 "... is resuming but was not Ready within 60s". Once claimed, the same Sandbox is served by name.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from agent_sandbox.router import Router
from tests.helpers import eventually, is_ready
from tests.integration.lifecycle.helpers import (
    claim_body,
    get_or_none,
    metric_value,
    pool_body,
    router_metrics,
    runtime_template,
    through,
)

pytestmark = pytest.mark.integration

StartRouter = Callable[..., Awaitable[Router]]
ASKS = {lc.ANNOTATION_AUTO_RESUME: "true", lc.ANNOTATION_IDLE_TIMEOUT: "10m"}


async def _ready_member(kube: ApiClient, ns: str, pool: str) -> str:
    async def probe() -> str | None:
        for sb in await kube.list(SANDBOX, namespace=ns):
            labels = sb["metadata"].get("labels") or {}
            owners = sb["metadata"].get("ownerReferences") or []
            pooled = c.LABEL_WARM_POOL_SANDBOX in labels and any(o.get("name") == pool for o in owners)
            if pooled and is_ready(sb):
                return str(sb["metadata"]["name"])
        return None

    return await eventually(probe, f"a Ready member of pool {pool}", within=90)


async def test_an_unclaimed_pool_member_gets_the_prompt_502_then_is_served_once_claimed(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    await kube.create(SANDBOX_TEMPLATE, runtime_template("pauto", annotations=ASKS), namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body("pauto", "pauto", 1), namespace=namespace)
    member = await _ready_member(kube, namespace, "pauto")
    router = await start_router("--sandbox-lifecycle-activity-interval=1s")

    start = time.monotonic()
    status, body = await through(http, router, member, namespace)
    assert (status, body) == (502, {"detail": f"Could not connect to the backend sandbox: {member}"})
    assert time.monotonic() - start < 15  # the dial retries, not the 60 s resume timeout
    metrics = await router_metrics(router)
    assert metric_value(metrics, "sandbox_router_resume_wait_seconds_count") == 0  # never held
    sandbox = await kube.get(SANDBOX, member, namespace=namespace)
    annotations = sandbox["metadata"].get("annotations") or {}
    assert lc.ANNOTATION_LAST_ACTIVITY not in annotations  # no write on a Sandbox nobody has claimed
    assert lc.ANNOTATION_RESUME_REASON not in annotations

    await kube.create(SANDBOX_CLAIM, claim_body("mine", "pauto"), namespace=namespace)

    async def bound() -> str | None:
        claim = await get_or_none(kube, SANDBOX_CLAIM, "mine", namespace)
        name = (((claim or {}).get("status") or {}).get("sandbox") or {}).get("name")
        return str(name) if claim is not None and is_ready(claim) and name else None

    assert await eventually(bound, "claim mine Ready", within=90) == member  # adopted
    status, body = await through(http, router, member, namespace, "echo claimed")
    assert (status, body.get("stdout")) == (200, "claimed\n"), body
