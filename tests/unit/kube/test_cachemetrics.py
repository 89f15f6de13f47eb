"""`agent_sandbox_cached_objects{resource}` counts each informer's store, and replacing it never double-registers."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry

from agent_sandbox.kube import CONFIG_MAP, POD, SANDBOX, Cache
from agent_sandbox.kube._cachemetrics import CACHED_OBJECTS_METRIC, CachedObjectsCollector
from agent_sandbox.kube.metrics import register_replacing
from agent_sandbox.kube.testing import FakeClient
from tests.helpers import eventually

pytestmark = pytest.mark.unit


def _obj(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns"}}


async def test_counts_follow_the_informer_stores() -> None:
    fake = FakeClient(*[(POD, _obj(f"p{i}")) for i in range(3)], (SANDBOX, _obj("s")))
    cache = Cache(fake)
    registry = CollectorRegistry()
    register_replacing(registry, CACHED_OBJECTS_METRIC, CachedObjectsCollector(cache))
    assert registry.get_sample_value(CACHED_OBJECTS_METRIC, {"resource": "pods"}) is None  # no informer yet
    pods, sandboxes = cache.informer(POD), cache.informer(SANDBOX)
    task = asyncio.create_task(cache.start())
    try:
        async with asyncio.timeout(5):
            await pods.wait_for_sync()
            await sandboxes.wait_for_sync()
        assert registry.get_sample_value(CACHED_OBJECTS_METRIC, {"resource": "pods"}) == 3
        assert (
            registry.get_sample_value(CACHED_OBJECTS_METRIC, {"resource": "sandboxes.agents.x-k8s.io"}) == 1
        )
        await fake.delete(POD, "p0", namespace="ns")

        async def two_left() -> bool:
            return len(pods) == 2

        await eventually(two_left, "the delete in the pod informer", within=5.0, interval=0.01)
        assert registry.get_sample_value(CACHED_OBJECTS_METRIC, {"resource": "pods"}) == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_replacing_unregisters_the_previous_collector() -> None:
    registry = CollectorRegistry()
    first, second = Cache(FakeClient()), Cache(FakeClient((CONFIG_MAP, _obj("c"))))
    register_replacing(registry, CACHED_OBJECTS_METRIC, CachedObjectsCollector(first))
    register_replacing(registry, CACHED_OBJECTS_METRIC, CachedObjectsCollector(second))  # no duplicate error
    second.informer(CONFIG_MAP)
    first.informer(POD)
    assert registry.get_sample_value(CACHED_OBJECTS_METRIC, {"resource": "configmaps"}) == 0  # not synced yet
    assert (
        registry.get_sample_value(CACHED_OBJECTS_METRIC, {"resource": "pods"}) is None
    )  # the old one is gone
