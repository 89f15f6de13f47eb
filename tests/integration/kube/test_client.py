"""ApiClient against the real local API server: CRUD, every patch flavour, preconditions, status, watch."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import (
    CONFIG_MAP,
    EVENT,
    SERVICE,
    AlreadyExists,
    ApiClient,
    BadRequest,
    Conflict,
    EventBroadcaster,
    Gone,
    Invalid,
    NotFound,
    PatchType,
    WatchEvent,
)
from tests.integration.kube.helpers import compact_etcd, event_manifest

pytestmark = pytest.mark.integration


async def _drain(stream: AsyncIterator[WatchEvent]) -> None:
    async for _ in stream:
        pass


def _cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": {"a": "1"},
    }


async def test_create_get_list_update_delete(kube: ApiClient, namespace: str) -> None:
    created = await kube.create(CONFIG_MAP, _cm("one", app="x"), namespace=namespace)
    assert created["metadata"]["uid"]
    await kube.create(CONFIG_MAP, _cm("two", app="y"), namespace=namespace)

    got = await kube.get(CONFIG_MAP, "one", namespace=namespace)
    assert got["data"] == {"a": "1"}

    names = {
        o["metadata"]["name"] for o in await kube.list(CONFIG_MAP, namespace=namespace, label_selector="app")
    }
    assert names == {"one", "two"}
    only_x = await kube.list(CONFIG_MAP, namespace=namespace, label_selector={"app": "x"})
    assert [o["metadata"]["name"] for o in only_x] == ["one"]
    assert all(o["kind"] == "ConfigMap" and o["apiVersion"] == "v1" for o in only_x)

    got["data"]["b"] = "2"
    updated = await kube.update(CONFIG_MAP, got)
    assert updated["data"] == {"a": "1", "b": "2"}
    with pytest.raises(Conflict):
        await kube.update(CONFIG_MAP, got)  # stale resourceVersion

    with pytest.raises(AlreadyExists):
        await kube.create(CONFIG_MAP, _cm("one"), namespace=namespace)

    await kube.delete(CONFIG_MAP, "one", namespace=namespace)
    with pytest.raises(NotFound):
        await kube.get(CONFIG_MAP, "one", namespace=namespace)
    with pytest.raises(NotFound):
        await kube.delete(CONFIG_MAP, "one", namespace=namespace)


async def test_pagination_follows_continue_tokens(kube: ApiClient, namespace: str) -> None:
    await asyncio.gather(
        *(kube.create(CONFIG_MAP, _cm(f"p{i}", page="t"), namespace=namespace) for i in range(7))
    )
    page = await kube.list_page(CONFIG_MAP, namespace=namespace, label_selector="page=t", limit=3)
    assert len(page.items) == 3
    assert page.continue_token
    assert page.resource_version
    everything = await kube.list(CONFIG_MAP, namespace=namespace, label_selector="page=t", page_size=3)
    assert sorted(o["metadata"]["name"] for o in everything) == [f"p{i}" for i in range(7)]


async def test_patch_flavours(kube: ApiClient, namespace: str) -> None:
    await kube.create(CONFIG_MAP, _cm("cm"), namespace=namespace)
    merged = await kube.patch(CONFIG_MAP, "cm", {"data": {"b": "2", "a": None}}, namespace=namespace)
    assert merged["data"] == {"b": "2"}

    jsonp = await kube.patch(
        CONFIG_MAP,
        "cm",
        [{"op": "test", "path": "/data/b", "value": "2"}, {"op": "add", "path": "/data/c", "value": "3"}],
        namespace=namespace,
        patch_type=PatchType.JSON,
    )
    assert jsonp["data"] == {"b": "2", "c": "3"}
    with pytest.raises(Invalid):  # failed "test" op
        await kube.patch(
            CONFIG_MAP,
            "cm",
            [{"op": "test", "path": "/data/b", "value": "nope"}],
            namespace=namespace,
            patch_type=PatchType.JSON,
        )

    strategic = await kube.patch(
        CONFIG_MAP,
        "cm",
        {"metadata": {"labels": {"s": "1"}}},
        namespace=namespace,
        patch_type=PatchType.STRATEGIC,
    )
    assert strategic["metadata"]["labels"]["s"] == "1"

    applied = await kube.patch(
        CONFIG_MAP,
        "applied",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"x": "y"}},
        namespace=namespace,
        patch_type=PatchType.APPLY,
        field_manager="kube-tests",
        force=True,
    )
    assert applied["data"] == {"x": "y"}
    assert any(m["manager"] == "kube-tests" for m in applied["metadata"]["managedFields"])


async def test_resource_version_in_merge_patch_is_a_precondition(kube: ApiClient, namespace: str) -> None:
    created = await kube.create(CONFIG_MAP, _cm("rv"), namespace=namespace)
    rv = created["metadata"]["resourceVersion"]
    await kube.patch(CONFIG_MAP, "rv", {"data": {"n": "1"}}, namespace=namespace)
    with pytest.raises(Conflict):
        await kube.patch(
            CONFIG_MAP, "rv", {"metadata": {"resourceVersion": rv}, "data": {"n": "2"}}, namespace=namespace
        )


async def test_delete_preconditions_and_propagation(kube: ApiClient, namespace: str) -> None:
    created = await kube.create(CONFIG_MAP, _cm("pre"), namespace=namespace)
    with pytest.raises(Conflict):
        await kube.delete(CONFIG_MAP, "pre", namespace=namespace, uid=str(uuid.uuid4()))
    with pytest.raises(Conflict):
        await kube.delete(CONFIG_MAP, "pre", namespace=namespace, resource_version="1")
    await kube.delete(
        CONFIG_MAP,
        "pre",
        namespace=namespace,
        uid=created["metadata"]["uid"],
        resource_version=created["metadata"]["resourceVersion"],
        propagation_policy="Background",
    )
    with pytest.raises(NotFound):
        await kube.get(CONFIG_MAP, "pre", namespace=namespace)

    # Foreground deletion keeps the owner (with a finalizer) until dependents are gone.
    owner = await kube.create(
        CONFIG_MAP,
        {**_cm("owner"), "metadata": {"name": "owner", "finalizers": ["test/hold"]}},
        namespace=namespace,
    )
    answer = await kube.delete(CONFIG_MAP, "owner", namespace=namespace, propagation_policy="Foreground")
    assert answer["metadata"]["deletionTimestamp"]
    assert "foregroundDeletion" in answer["metadata"]["finalizers"]
    await kube.patch(
        CONFIG_MAP,
        "owner",
        {"metadata": {"finalizers": None}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    assert owner["metadata"]["uid"]


async def test_status_subresource_writes_only_status(kube: ApiClient, namespace: str) -> None:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "selector": {"app": "x"}},
    }
    await kube.create(SERVICE, svc, namespace=namespace)
    # A main-resource patch silently drops status changes...
    main = await kube.patch(
        SERVICE, "svc", {"status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.9"}]}}}, namespace=namespace
    )
    assert not main.get("status", {}).get("loadBalancer", {}).get("ingress")
    # ...the status subresource applies them.
    status = await kube.patch_status(
        SERVICE, "svc", {"status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.9"}]}}}, namespace=namespace
    )
    assert [i["ip"] for i in status["status"]["loadBalancer"]["ingress"]] == ["127.0.0.9"]
    got = await kube.get(SERVICE, "svc", namespace=namespace, subresource="status")
    got["status"]["loadBalancer"]["ingress"] = [{"ip": "127.0.0.10"}]
    replaced = await kube.update_status(SERVICE, got)
    assert [i["ip"] for i in replaced["status"]["loadBalancer"]["ingress"]] == ["127.0.0.10"]


async def test_watch_streams_added_modified_deleted(kube: ApiClient, namespace: str) -> None:
    start = await kube.list_page(CONFIG_MAP, namespace=namespace)
    events: list[WatchEvent] = []

    async def consume() -> None:
        async for ev in kube.watch(CONFIG_MAP, namespace=namespace, resource_version=start.resource_version):
            if ev.type == "BOOKMARK":
                continue
            events.append(ev)
            if ev.type == "DELETED":
                return

    task = asyncio.create_task(consume())
    await kube.create(CONFIG_MAP, _cm("w"), namespace=namespace)
    await kube.patch(CONFIG_MAP, "w", {"data": {"z": "9"}}, namespace=namespace)
    await kube.delete(CONFIG_MAP, "w", namespace=namespace)
    await asyncio.wait_for(task, 30)
    assert [e.type for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert events[1].object["data"]["z"] == "9"


async def test_watch_and_list_from_compacted_resource_version_raise_gone(
    kube: ApiClient, namespace: str, cluster: DevCluster
) -> None:
    # Events have no watch cache in kube-apiserver, so an old resourceVersion reaches etcd, which has
    # compacted it: the API server answers 410. (Cached kinds replay current state instead.)
    await kube.create(EVENT, event_manifest("old", namespace), namespace=namespace)
    latest = (await kube.list_page(EVENT, namespace=namespace)).resource_version
    compact_etcd(cluster, int(latest))
    with pytest.raises(Gone):
        await asyncio.wait_for(_drain(kube.watch(EVENT, namespace=namespace, resource_version="1")), 30)
    with pytest.raises(Gone):
        await kube.list_page(EVENT, namespace=namespace, resource_version="1", resource_version_match="Exact")


async def test_bad_selector_is_bad_request(kube: ApiClient, namespace: str) -> None:
    with pytest.raises(BadRequest):
        await kube.list(CONFIG_MAP, namespace=namespace, label_selector="a in (")


async def test_event_broadcaster_creates_and_aggregates(kube: ApiClient, namespace: str) -> None:
    cm = await kube.create(CONFIG_MAP, _cm("evt"), namespace=namespace)
    broadcaster = EventBroadcaster(kube, instance="kube-tests")
    recorder = broadcaster.recorder("sandbox-controller")
    task = asyncio.create_task(broadcaster.start())
    try:
        recorder.event(cm, "Warning", "MultiplePods", "Reconciling", "first")
        recorder.event(cm, "Warning", "MultiplePods", "Reconciling", "second")

        async def events() -> list[dict[str, Any]]:
            while True:
                found = [
                    e
                    for e in await kube.list(EVENT, namespace=namespace)
                    if e["regarding"].get("uid") == cm["metadata"]["uid"]
                ]
                if found and found[0].get("series", {}).get("count") == 2:
                    return found
                await asyncio.sleep(0.1)

        found = await asyncio.wait_for(events(), 30)
    finally:
        task.cancel()
    assert len(found) == 1
    event = found[0]
    assert event["reason"] == "MultiplePods"
    assert event["action"] == "Reconciling"
    assert event["type"] == "Warning"
    assert event["reportingController"] == "sandbox-controller"
    assert event["reportingInstance"] == "kube-tests"
    assert event["regarding"]["kind"] == "ConfigMap"
