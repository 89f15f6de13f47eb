"""Informer logic against the in-memory FakeClient: sync, events, bookmarks, 410 relist, indexes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent_sandbox.kube import CONFIG_MAP, POD, Gone, HandlerFuncs, Informer, Object, TransportError
from agent_sandbox.kube.testing import FakeClient, FakeClock

pytestmark = pytest.mark.unit


def _cm(name: str, ns: str = "ns", **labels: str) -> Object:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels, "managedFields": [{"manager": "x"}]}
    }


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_add(self, obj: Object) -> None:
        self.events.append(("add", obj["metadata"]["name"]))

    def on_update(self, old: Object, new: Object) -> None:
        self.events.append(("update", new["metadata"]["name"]))

    def on_delete(self, obj: Object) -> None:
        self.events.append(("delete", obj["metadata"]["name"]))


def _watches(fake: FakeClient) -> int:
    """Watch calls so far (a re-watch adds one)."""
    return sum(1 for a in fake.actions if a[0] == "watch")


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def running(inf: Informer) -> AsyncIterator[None]:
    task = asyncio.create_task(inf.run())
    try:
        await asyncio.wait_for(inf.wait_for_sync(), 5)
        await settle()
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_initial_list_paged_transform_and_events() -> None:
    fake = FakeClient(*[(CONFIG_MAP, _cm(f"c{i}")) for i in range(7)])
    inf = Informer(fake, CONFIG_MAP, page_size=3)
    rec = Recorder()
    inf.add_handler(rec)
    async with running(inf):
        assert len(inf) == 7
        assert sorted(n for _, n in rec.events) == [f"c{i}" for i in range(7)]
        assert all("managedFields" not in o["metadata"] for o in inf.list())
        assert sum(1 for a in fake.actions if a[0] == "list") == 3  # 3 pages
        rec.events.clear()
        await fake.create(CONFIG_MAP, _cm("new"))
        await fake.patch(CONFIG_MAP, "new", {"data": {"a": "1"}}, namespace="ns")
        await fake.delete(CONFIG_MAP, "new", namespace="ns")
        await settle()
        assert rec.events == [("add", "new"), ("update", "new"), ("delete", "new")]
        assert inf.get("ns/new") is None
        assert inf.resource_version == fake.resource_version


async def test_bookmark_advances_resource_version_without_events() -> None:
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP)
    rec = Recorder()
    async with running(inf):
        inf.add_handler(rec)
        rec.events.clear()
        await fake.create(POD, {"metadata": {"name": "p", "namespace": "ns"}})  # bumps the global RV only
        assert inf.resource_version != fake.resource_version
        fake.send_bookmark(CONFIG_MAP)
        await settle()
        assert inf.resource_version == fake.resource_version
        assert rec.events == []


async def test_watch_end_resumes_from_last_resource_version_without_relist() -> None:
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP)
    async with running(inf):
        fake.watch_control.close_all()  # server closed the watch normally
        await settle()
        await fake.create(CONFIG_MAP, _cm("b"))
        await settle()
        assert inf.get("ns/b") is not None
        assert inf.relists == 1
        watches = [a for a in fake.actions if a[0] == "watch"]
        assert len(watches) == 2


async def test_410_triggers_relist_that_reconciles_missed_changes() -> None:
    fake = FakeClient((CONFIG_MAP, _cm("keep")), (CONFIG_MAP, _cm("gone")))
    inf = Informer(fake, CONFIG_MAP)
    rec = Recorder()
    inf.add_handler(rec)
    async with running(inf):
        pass  # synced, then stopped: changes below are missed by the watch
    await fake.delete(CONFIG_MAP, "gone", namespace="ns")
    await fake.patch(CONFIG_MAP, "keep", {"data": {"x": "1"}}, namespace="ns")
    await fake.create(CONFIG_MAP, _cm("added"))
    fake.compact()  # the informer's resourceVersion is now too old
    rec.events.clear()
    async with running(inf):
        await settle()
        assert inf.relists == 2
        assert sorted(rec.events) == [("add", "added"), ("delete", "gone"), ("update", "keep")]
        assert sorted(inf.keys()) == ["ns/added", "ns/keep"]
        await fake.create(CONFIG_MAP, _cm("after"))
        await settle()
        assert inf.get("ns/after") is not None


async def test_error_event_410_mid_stream_relists() -> None:
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP)
    async with running(inf):
        fake.watch_control.close_all(Gone(410, "Expired", "too old"))
        await settle()
        assert inf.relists == 2


async def test_transport_errors_back_off_on_the_clock_then_resume() -> None:
    clock = FakeClock()
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP, clock=clock)
    async with running(inf):
        fake.inject_error("watch", TransportError("connection reset"), times=1)
        fake.watch_control.close_all()
        await settle()
        watches_before = _watches(fake)
        clock.advance(0.5)
        await settle()
        assert _watches(fake) == watches_before  # still backing off
        clock.advance(1.0)  # 0.8 s * jitter (<= 1.2 s) has elapsed
        await settle()
        assert _watches(fake) == watches_before + 1
        await fake.create(CONFIG_MAP, _cm("b"))
        await settle()
        assert inf.get("ns/b") is not None
        assert inf.relists == 1


async def test_a_watch_that_worked_starts_a_new_outage_at_the_shortest_wait() -> None:
    """The backoff of an earlier outage is not kept once a watch has delivered events again (it delayed the
    next re-watch by up to 40 s, so a router or controller stayed on a stale view that long)."""
    clock = FakeClock()
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP, clock=clock)

    async with running(inf):
        fake.inject_error("watch", TransportError("connection reset"), times=3)
        fake.watch_control.close_all()
        for wait in (1.2, 2.4, 4.8):  # the outage: 0.8, 1.6, 3.2 s (each up to 1.5 times that)
            await settle()
            clock.advance(wait)
        await settle()
        await fake.create(CONFIG_MAP, _cm("b"))  # the watch works again
        await settle()
        assert inf.get("ns/b") is not None
        before = _watches(fake)
        fake.watch_control.close_all(TransportError("frozen connection"))
        await settle()
        clock.advance(1.25)
        await settle()
        assert _watches(fake) == before + 1


async def test_a_silent_watch_is_reopened_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch that went silent past the bookmark gap (a frozen connection, or a server without bookmarks)
    is watched again at once, without backoff: quiet is not an outage."""
    from agent_sandbox.kube import Timeout
    from agent_sandbox.kube import _informer as informer_module

    monkeypatch.setattr(informer_module, "WATCH_BOOKMARK_GAP", 0.2, raising=False)
    clock = FakeClock()
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP, clock=clock)

    async with running(inf):
        before = _watches(fake)
        await asyncio.sleep(0.15)
        fake.watch_control.close_all(Timeout("no byte for 100 s"))
        await settle()
        assert _watches(fake) == before + 1  # no clock advance needed: no backoff
        assert inf.relists == 1


async def test_indexes_follow_updates_and_deletes_and_can_be_added_late() -> None:
    fake = FakeClient((CONFIG_MAP, _cm("a", team="x")), (CONFIG_MAP, _cm("b", "other", team="x")))
    inf = Informer(fake, CONFIG_MAP)

    def by_team(o: Object) -> list[str]:
        t = (o["metadata"].get("labels") or {}).get("team")
        return [t] if t else []

    async with running(inf):
        inf.add_index("team", by_team)  # late registration indexes existing objects
        assert sorted(o["metadata"]["name"] for o in inf.by_index("team", "x")) == ["a", "b"]
        assert [o["metadata"]["name"] for o in inf.by_index("team", "x", namespace="other")] == ["b"]
        await fake.patch(CONFIG_MAP, "a", {"metadata": {"labels": {"team": "y"}}}, namespace="ns")
        await settle()
        assert [o["metadata"]["name"] for o in inf.by_index("team", "y")] == ["a"]
        assert [o["metadata"]["name"] for o in inf.by_index("team", "x")] == ["b"]
        await fake.delete(CONFIG_MAP, "b", namespace="other")
        await settle()
        assert inf.by_index("team", "x") == []
        with pytest.raises(ValueError, match="already registered"):
            inf.add_index("team", by_team)
        with pytest.raises(KeyError):
            inf.by_index("nope", "x")


async def test_handler_errors_are_contained_and_late_handlers_get_replayed_adds() -> None:
    fake = FakeClient((CONFIG_MAP, _cm("a")))
    inf = Informer(fake, CONFIG_MAP)

    def boom(_: Object) -> None:
        raise RuntimeError("handler bug")

    inf.add_handler(HandlerFuncs(add=boom))
    async with running(inf):
        rec = Recorder()
        inf.add_handler(rec)
        assert rec.events == [("add", "a")]
        await fake.create(CONFIG_MAP, _cm("b"))
        await settle()
        assert ("add", "b") in rec.events


async def test_namespace_label_and_custom_transform_scoping() -> None:
    fake = FakeClient(
        (CONFIG_MAP, _cm("in", "ns", t="1")),
        (CONFIG_MAP, _cm("nolabel", "ns")),
        (CONFIG_MAP, _cm("out", "x", t="1")),
    )

    def transform(o: Object) -> Object:
        o["metadata"].pop("labels", None)
        return o

    inf = Informer(fake, CONFIG_MAP, namespace="ns", label_selector="t", transform=transform)
    async with running(inf):
        assert inf.keys() == ["ns/in"]
        obj: Any = inf.get("ns/in")
        assert "labels" not in obj["metadata"]
        assert "managedFields" in obj["metadata"]  # custom transform replaces the default
