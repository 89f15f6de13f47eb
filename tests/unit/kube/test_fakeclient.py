"""FakeClient semantics that controller unit tests rely on."""

from __future__ import annotations

import pytest

from agent_sandbox.kube import (
    CONFIG_MAP,
    POD,
    SANDBOX,
    AlreadyExists,
    Client,
    Conflict,
    IndexedReader,
    Invalid,
    NotFound,
    PatchType,
)
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit


def test_implements_the_protocols() -> None:
    fake = FakeClient()
    assert isinstance(fake, Client)
    assert isinstance(fake, IndexedReader)


async def test_create_get_conflicts_and_generation() -> None:
    fake = FakeClient()
    sb = await fake.create(SANDBOX, {"metadata": {"name": "s", "namespace": "ns"}, "spec": {"a": 1}})
    assert sb["metadata"]["generation"] == 1
    assert sb["metadata"]["uid"]
    assert sb["apiVersion"] == "agents.x-k8s.io/v1beta1"
    with pytest.raises(AlreadyExists):
        await fake.create(SANDBOX, {"metadata": {"name": "s", "namespace": "ns"}})
    status = await fake.patch_status(SANDBOX, "s", {"status": {"ready": True}}, namespace="ns")
    assert status["metadata"]["generation"] == 1  # status writes keep generation
    spec = await fake.patch(SANDBOX, "s", {"spec": {"a": 2}, "status": {"ignored": 1}}, namespace="ns")
    assert spec["metadata"]["generation"] == 2
    assert spec["status"] == {"ready": True}  # main-resource writes keep status
    with pytest.raises(Conflict):
        await fake.update(SANDBOX, sb)  # stale resourceVersion
    with pytest.raises(Conflict):
        await fake.patch(
            SANDBOX, "s", {"metadata": {"resourceVersion": "1"}, "spec": {"a": 3}}, namespace="ns"
        )
    with pytest.raises(NotFound):
        await fake.get(SANDBOX, "nope", namespace="ns")
    gen = await fake.create(CONFIG_MAP, {"metadata": {"generateName": "g-", "namespace": "ns"}})
    assert gen["metadata"]["name"].startswith("g-")


async def test_json_patch_and_invalid_patch() -> None:
    fake = FakeClient((CONFIG_MAP, {"metadata": {"name": "c", "namespace": "ns"}, "data": {"a": "1"}}))
    out = await fake.patch(
        CONFIG_MAP,
        "c",
        [{"op": "add", "path": "/data/b", "value": "2"}],
        namespace="ns",
        patch_type=PatchType.JSON,
    )
    assert out["data"] == {"a": "1", "b": "2"}
    with pytest.raises(Invalid):
        await fake.patch(
            CONFIG_MAP, "c", [{"op": "remove", "path": "/nope"}], namespace="ns", patch_type=PatchType.JSON
        )


async def test_delete_preconditions_finalizers_and_garbage_collection() -> None:
    fake = FakeClient()
    owner = await fake.create(SANDBOX, {"metadata": {"name": "s", "namespace": "ns", "finalizers": ["x/y"]}})
    ref = {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "name": "s",
        "uid": owner["metadata"]["uid"],
    }
    await fake.create(POD, {"metadata": {"name": "p", "namespace": "ns", "ownerReferences": [ref]}})
    with pytest.raises(Conflict):
        await fake.delete(SANDBOX, "s", namespace="ns", uid="other")
    marked = await fake.delete(SANDBOX, "s", namespace="ns")
    assert marked["metadata"]["deletionTimestamp"]
    assert (await fake.get(POD, "p", namespace="ns"))["metadata"]["name"] == "p"
    await fake.patch(SANDBOX, "s", {"metadata": {"finalizers": None}}, namespace="ns")
    with pytest.raises(NotFound):
        await fake.get(SANDBOX, "s", namespace="ns")
    await fake.create(SANDBOX, {"metadata": {"name": "s2", "namespace": "ns"}})
    s2 = await fake.get(SANDBOX, "s2", namespace="ns")
    ref2 = {**ref, "name": "s2", "uid": s2["metadata"]["uid"]}
    await fake.create(POD, {"metadata": {"name": "p2", "namespace": "ns", "ownerReferences": [ref2]}})
    await fake.delete(SANDBOX, "s2", namespace="ns")
    with pytest.raises(NotFound):
        await fake.get(POD, "p2", namespace="ns")  # collected


async def test_list_selectors_indexes_and_error_injection() -> None:
    fake = FakeClient(
        (POD, {"metadata": {"name": "a", "namespace": "ns", "labels": {"h": "1"}}}),
        (POD, {"metadata": {"name": "b", "namespace": "ns", "labels": {"h": "2"}}}),
        (POD, {"metadata": {"name": "c", "namespace": "other", "labels": {"h": "1"}}}),
    )
    assert [p["metadata"]["name"] for p in await fake.list(POD, namespace="ns", label_selector="h=1")] == [
        "a"
    ]
    assert len(await fake.list(POD)) == 3
    assert [p["metadata"]["name"] for p in await fake.list(POD, field_selector="metadata.name=b")] == ["b"]
    fake.add_index(POD, "hash", lambda o: [o["metadata"]["labels"]["h"]])
    assert sorted(p["metadata"]["name"] for p in await fake.list_by_index(POD, "hash", "1")) == ["a", "c"]
    assert [p["metadata"]["name"] for p in await fake.list_by_index(POD, "hash", "1", namespace="ns")] == [
        "a"
    ]
    fake.inject_error("create", Conflict(409, "Conflict", "injected"), kind=POD)
    with pytest.raises(Conflict, match="injected"):
        await fake.create(POD, {"metadata": {"name": "d", "namespace": "ns"}})
    await fake.create(POD, {"metadata": {"name": "d", "namespace": "ns"}})  # only once
    assert ("create", "Pod", "ns", "d") in fake.actions
    got = await fake.get(POD, "a", namespace="ns")
    got["metadata"]["labels"]["h"] = "mutated"
    assert (await fake.get(POD, "a", namespace="ns"))["metadata"]["labels"]["h"] == "1"  # deep copies
