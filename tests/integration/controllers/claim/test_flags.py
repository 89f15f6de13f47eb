"""Claim controller flags and metrics on the real controller process (controllers spec §4.13, §5.1, §5.8).

`--disable-claim-events` (no Events) and `--disable-claim-observability-annotations` (no persisted
first-observed time) wired end to end, and the claim metrics served on `/metrics` with both launch types.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import (
    EVENT,
    SANDBOX_CLAIM,
    SANDBOX_WARM_POOL,
    ApiClient,
    Object,
)
from tests.helpers import controller_metrics, eventually, is_ready
from tests.integration.controllers.builders import (
    claim_body,
    create_template_and_pool,
    pool_body,
    pool_members,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def quiet_controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(
        cluster, extra=("--disable-claim-events", "--disable-claim-observability-annotations")
    )
    try:
        yield started
    finally:
        stop(started)


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_part = line[len(name) + 1 : line.rindex("}")]
        have = dict(kv.split("=", 1) for kv in label_part.split(",") if "=" in kv)
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_disabled_events_and_annotations_and_claim_metrics(
    cluster: DevCluster, kube: ApiClient, namespace: str, quiet_controller: Started
) -> None:
    ns = namespace
    await create_template_and_pool(kube, ns, replicas=1, pool="warm")
    await kube.create(SANDBOX_WARM_POOL, pool_body("cold", replicas=0), namespace=ns)

    async def member_ready() -> bool:
        members = await pool_members(kube, ns, "warm")
        return any(is_ready(m) for m in members)

    await eventually(member_ready, "a Ready warm member")
    before = controller_metrics(cluster)
    for name, pool in (("w", "warm"), ("k", "cold")):
        await kube.create(SANDBOX_CLAIM, claim_body(name, pool), namespace=ns)

    async def both_stamped() -> list[Object] | None:
        claims = [await kube.get(SANDBOX_CLAIM, n, namespace=ns) for n in ("w", "k")]
        stamped = all(
            c.ANNOTATION_CLAIM_FIRST_READY_AT in (cl["metadata"].get("annotations") or {}) for cl in claims
        )
        return claims if stamped and all(is_ready(cl) for cl in claims) else None

    warm, cold = await eventually(both_stamped, "both claims Ready and stamped")
    for claim in (warm, cold):
        assert c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT not in claim["metadata"]["annotations"]
    assert warm["metadata"]["annotations"][c.ANNOTATION_SANDBOX_NAME] == warm["status"]["sandbox"]["name"]
    assert cold["status"]["sandbox"]["name"] == "k"
    await asyncio.sleep(2)  # events are written in the background: give any that were emitted time to land
    emitted = [
        e
        for e in await kube.list(EVENT, namespace=ns)
        if e.get("reportingController") == "sandboxclaim-controller"
    ]
    assert emitted == []

    after = controller_metrics(cluster)
    # What the informers hold (ours, not upstream's): at least this test's claims and their Sandboxes' Pods.
    cached = "agent_sandbox_cached_objects"
    assert sample(after, cached, resource="sandboxclaims.extensions.agents.x-k8s.io") >= 2
    assert sample(after, cached, resource="sandboxes.agents.x-k8s.io") >= 2
    assert sample(after, cached, resource="pods") >= 2
    for launch in ("warm", "cold"):
        name = "agent_sandbox_claim_controller_startup_latency_ms_count"
        assert sample(after, name, launch_type=launch, sandbox_template="tmpl") == (
            sample(before, name, launch_type=launch, sandbox_template="tmpl") + 1
        )
        created = "agent_sandbox_claim_creation_total"
        assert sample(after, created, namespace=ns, launch_type=launch, sandbox_template="tmpl") == 1
    warm_created = sample(after, "agent_sandbox_claim_creation_total", namespace=ns, launch_type="warm")
    assert warm_created == sample(
        after,
        "agent_sandbox_claim_creation_total",
        namespace=ns,
        launch_type="warm",
        warmpool_name="warm",
        pod_condition="ready",
    )
