"""Informers and the cache against the real API server: events, indexes, relist after a real 410."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import (
    CONFIG_MAP,
    EVENT,
    ApiClient,
    Cache,
    CacheOptions,
    HandlerFuncs,
    Informer,
    KindOptions,
    NotFound,
    Object,
)
from tests.integration.kube.helpers import compact_etcd, event_manifest

pytestmark = pytest.mark.integration


async def _until(pred: Callable[[], Any], what: str, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        if pred():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(coro_fn: Callable[[], Any]) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.create_task(coro_fn())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_informer_sees_add_update_delete_and_maintains_indexes(kube: ApiClient, namespace: str) -> None:
    await kube.create(CONFIG_MAP, {"metadata": {"name": "pre", "labels": {"team": "a"}}}, namespace=namespace)
    inf = Informer(kube, CONFIG_MAP, namespace=namespace)
    inf.add_index("team", lambda o: [t] if (t := (o["metadata"].get("labels") or {}).get("team")) else [])
    seen: list[tuple[str, str]] = []
    inf.add_handler(
        HandlerFuncs(
            add=lambda o: seen.append(("add", o["metadata"]["name"])),
            update=lambda old, new: seen.append(("update", new["metadata"]["name"])),
            delete=lambda o: seen.append(("delete", o["metadata"]["name"])),
        )
    )
    async with running(inf.run):
        await asyncio.wait_for(inf.wait_for_sync(), 30)
        pre = inf.get(f"{namespace}/pre")
        assert pre is not None
        assert "managedFields" not in pre["metadata"]  # default transform
        assert [o["metadata"]["name"] for o in inf.by_index("team", "a")] == ["pre"]

        await kube.create(
            CONFIG_MAP, {"metadata": {"name": "new", "labels": {"team": "a"}}}, namespace=namespace
        )
        await _until(lambda: ("add", "new") in seen, "add event")
        await kube.patch(CONFIG_MAP, "new", {"metadata": {"labels": {"team": "b"}}}, namespace=namespace)
        await _until(lambda: ("update", "new") in seen, "update event")
        assert [o["metadata"]["name"] for o in inf.by_index("team", "b")] == ["new"]
        assert [o["metadata"]["name"] for o in inf.by_index("team", "a")] == ["pre"]
        await kube.delete(CONFIG_MAP, "new", namespace=namespace)
        await _until(lambda: ("delete", "new") in seen, "delete event")
        assert inf.get(f"{namespace}/new") is None
        assert inf.by_index("team", "b") == []
    # Pre-existing objects arrive as adds (the namespace also holds kube-root-ca.crt).
    assert ("add", "pre") in seen
    assert seen.index(("add", "pre")) < seen.index(("add", "new"))


async def test_informer_relists_after_410_and_catches_up(
    kube: ApiClient, namespace: str, cluster: DevCluster
) -> None:
    # Events are not served from the watch cache, so a compacted resourceVersion yields a real 410.
    await kube.create(EVENT, event_manifest("first", namespace), namespace=namespace)
    inf = Informer(kube, EVENT, namespace=namespace)
    deleted: list[str] = []
    inf.add_handler(HandlerFuncs(delete=lambda o: deleted.append(o["metadata"]["name"])))
    async with running(inf.run):
        await asyncio.wait_for(inf.wait_for_sync(), 30)
    assert inf.relists == 1
    stale_rv = inf.resource_version
    assert stale_rv is not None

    # While the informer is down: one object created, one deleted; then history is compacted.
    await kube.create(EVENT, event_manifest("second", namespace), namespace=namespace)
    await kube.delete(EVENT, "first", namespace=namespace)
    latest = (await kube.list_page(EVENT, namespace=namespace)).resource_version
    compact_etcd(cluster, int(latest))

    async with running(inf.run):
        await _until(lambda: inf.relists == 2, "relist after 410")
        await _until(lambda: inf.get(f"{namespace}/second") is not None, "catch-up after relist")
        assert inf.get(f"{namespace}/first") is None
        assert deleted == ["first"]
        # And it keeps watching after the relist.
        await kube.create(EVENT, event_manifest("third", namespace), namespace=namespace)
        await _until(lambda: inf.get(f"{namespace}/third") is not None, "watch after relist")


async def test_cache_reads_scoping_and_lazy_informers(kube: ApiClient, namespace: str) -> None:
    await kube.create(
        CONFIG_MAP, {"metadata": {"name": "tracked", "labels": {"t": "1"}}}, namespace=namespace
    )
    await kube.create(CONFIG_MAP, {"metadata": {"name": "untracked"}}, namespace=namespace)
    cache = Cache(
        kube, CacheOptions(by_kind={CONFIG_MAP: KindOptions(label_selector="t", namespace=namespace)})
    )
    async with running(cache.start):
        # Informer created lazily on first read, after the cache started.
        got: Object = await asyncio.wait_for(cache.get(CONFIG_MAP, "tracked", namespace=namespace), 30)
        assert got["metadata"]["name"] == "tracked"
        with pytest.raises(NotFound):
            await cache.get(CONFIG_MAP, "untracked", namespace=namespace)  # filtered server-side
        names = [o["metadata"]["name"] for o in await cache.list(CONFIG_MAP, namespace=namespace)]
        assert names == ["tracked"]
        await asyncio.wait_for(cache.wait_for_sync(), 30)
