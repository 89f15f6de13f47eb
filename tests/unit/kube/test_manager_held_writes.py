"""A graceful stop sends the writes held back (Events, claim priority's stamps) *before* it releases the Lease.

After the release the write gate refuses everything (`NotLeader`) and a successor does not redo them, so a
held Event or stamp left for later is lost. In-memory fakes, no cluster.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from agent_sandbox.kube import (
    CONFIG_MAP,
    EVENT,
    Cache,
    LeaderElectionConfig,
    LeaderElectionLost,
    Manager,
    ManagerOptions,
)
from agent_sandbox.kube.errors import TransportError
from agent_sandbox.kube.testing import FakeClient

pytestmark = pytest.mark.unit

CM: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "c", "namespace": "ns", "uid": "u"},
}


class Elector:
    """A leader from `acquire` on; `release` is recorded in the shared log."""

    config = LeaderElectionConfig(name="lease", namespace="ns")
    identity = "me"

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.is_leader = False

    async def acquire(self) -> None:
        self.is_leader = True

    async def hold(self) -> None:
        await asyncio.Event().wait()

    async def release(self) -> bool:
        self.log.append("release")
        self.is_leader = False
        return True

    async def close(self) -> None:
        return None


class Emitter:
    """A controller that records `n` Events about a claim it made Ready, then idles."""

    def __init__(self, mgr: Manager, n: int) -> None:
        self.recorder = mgr.event_recorder("sandboxclaim-controller")
        self.n = n
        self.emitted = asyncio.Event()

    async def start(self) -> None:
        for i in range(self.n):
            self.recorder.event(CM, "Normal", f"Reason{i}", "Adoption", "note")
        self.emitted.set()
        await asyncio.Event().wait()


class Held:
    """A `HeldWrites` whose writes go out only when flushed."""

    def __init__(self, fake: FakeClient, log: list[str]) -> None:
        self.fake, self.log, self.held = fake, log, 2

    async def flush(self) -> None:
        while self.held:
            await self.fake.patch(CONFIG_MAP, "c", {"data": {"n": str(self.held)}}, namespace="ns")
            self.held -= 1
            self.log.append("stamp")

    def unwritten(self) -> dict[str, int]:
        return {"claim_stamp": self.held}


async def _forever(age: float) -> None:
    """Claim priority's Event hold while claims keep arriving for longer than the stop takes."""
    await asyncio.Event().wait()


def _manager(fake: FakeClient, log: list[str], **options: Any) -> tuple[Manager, Elector]:
    elector = Elector(log)
    opts = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        leader_election=True,
        leader_election_id="lease",
        leader_election_namespace="ns",
        event_hold=_forever,
        new_elector=lambda _api, _cfg: elector,
        new_cache=lambda _api, o: Cache(fake, o),
        **options,
    )
    return Manager(fake, opts), elector  # type: ignore[arg-type]


def _logging_writes(fake: FakeClient, log: list[str]) -> None:
    real_create = fake.create

    async def create(kind: Any, body: Any, **kw: Any) -> Any:
        out = await real_create(kind, body, **kw)  # the write gate runs first: a refused write is not logged
        log.append(f"event {body['reason']}")
        return out

    fake.create = create  # type: ignore[method-assign,assignment]


async def test_a_graceful_stop_writes_held_events_before_it_releases_the_lease() -> None:
    """The Event broadcaster alone (no other held writes): the Event in its hold and the two queued behind
    it are written while still leader. (Before: all three refused with NotLeader after the release.)"""
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []
    _logging_writes(fake, log)
    mgr, _ = _manager(fake, log)
    emitter = Emitter(mgr, 3)
    mgr.add(emitter)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(emitter.emitted.wait(), 5)
    await asyncio.sleep(0.05)
    assert log == []
    stop.set()
    await asyncio.wait_for(task, 5)
    assert log == ["event Reason0", "event Reason1", "event Reason2", "release"]


async def test_a_graceful_stop_writes_held_events_and_stamps_before_it_releases_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []
    _logging_writes(fake, log)
    held = Held(fake, log)
    mgr, _ = _manager(fake, log, held_writes=(held,))
    emitter = Emitter(mgr, 3)
    mgr.add(emitter)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(emitter.emitted.wait(), 5)
    await asyncio.sleep(0.05)  # the first Event is in its hold, two wait behind it
    assert log == []
    assert mgr.events.unwritten() == {"event": 3}
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert time.monotonic() - started < 1.0  # the hold (claims still arriving) does not delay the stop
    assert sorted(log[:-1]) == ["event Reason0", "event Reason1", "event Reason2", "stamp", "stamp"]
    assert log[-1] == "release"
    assert [e["reason"] for e in await fake.list(EVENT, namespace="ns")] == ["Reason0", "Reason1", "Reason2"]
    assert "held writes lost" not in caplog.text


async def test_held_writes_that_cannot_be_sent_in_time_are_counted_and_do_not_hold_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []

    async def hang(*args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    held = Held(fake, log)
    mgr, _ = _manager(fake, log, held_writes=(held,), shutdown_flush_timeout=0.2)
    emitter = Emitter(mgr, 2)
    mgr.add(emitter)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(emitter.emitted.wait(), 5)
    await asyncio.sleep(0.05)
    fake.create = hang  # type: ignore[method-assign]  # an API server that no longer answers
    fake.patch = hang  # type: ignore[method-assign]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="agent_sandbox.kube.manager"):
        stop.set()
        await asyncio.wait_for(task, 10)
    assert time.monotonic() - started < 3.0
    assert log == ["release"]
    assert "stopping: 4 held writes lost (not written within 0.2s): claim_stamp=2, event=2" in caplog.text


async def test_a_leader_that_lost_the_lease_sends_nothing_and_says_what_is_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []
    _logging_writes(fake, log)
    held = Held(fake, log)
    mgr, elector = _manager(fake, log, held_writes=(held,), leader_election_release_on_cancel=False)
    emitter = Emitter(mgr, 1)
    mgr.add(emitter)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(emitter.emitted.wait(), 5)
    await asyncio.sleep(0.05)
    elector.is_leader = False  # past the renew deadline: a successor may be about to start
    fake.actions.clear()
    stop.set()
    await asyncio.wait_for(task, 5)
    assert log == []
    assert [a for a in fake.actions if a[0] != "list" and a[0] != "watch"] == []
    assert "stopping: 3 held writes lost (leadership lost): claim_stamp=2, event=1" in caplog.text


async def _stop_with_events(
    fake: FakeClient, mgr: Manager, emitter: Emitter, fail: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Start, let `emitter` hold its Events, make Event creates go through `fail`, stop gracefully."""
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(emitter.emitted.wait(), 5)
    await asyncio.sleep(0.05)
    fake.create = fail  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="agent_sandbox.kube.manager"):
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_held_events_the_api_server_refuses_during_the_flush_are_counted_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An API server refusing connections (or answering 5xx) fails every flushed write at once: the
    broadcaster drops them (best effort), but a stop must still say they are lost. (Before: no warning.)"""
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []
    mgr, _ = _manager(fake, log)
    emitter = Emitter(mgr, 3)
    mgr.add(emitter)

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise TransportError("POST events: connection refused")

    await _stop_with_events(fake, mgr, emitter, refused, caplog)
    assert await fake.list(EVENT, namespace="ns") == []
    assert log == ["release"]
    assert "stopping: 3 held writes lost (write failed): event=3" in caplog.text


async def test_held_events_refused_because_leadership_ends_mid_flush_are_counted_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []
    mgr, elector = _manager(fake, log)
    emitter = Emitter(mgr, 3)
    mgr.add(emitter)
    real = fake.create

    async def deposed(kind: Any, body: Any, **kw: Any) -> Any:
        elector.is_leader = False  # the renew deadline passes while the flush runs
        return await real(kind, body, **kw)  # the write gate refuses it (NotLeader)

    await _stop_with_events(fake, mgr, emitter, deposed, caplog)
    assert await fake.list(EVENT, namespace="ns") == []
    assert "stopping: 3 held writes lost (leadership lost): event=3" in caplog.text


async def test_a_lost_lease_counts_the_held_events_the_cancelled_writer_could_not_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`LeaderElectionLost` cancels the Event writer, whose last flush empties its queue into refused writes
    before the manager counts: they are lost all the same. (Before: the warning named only the stamps.)"""
    fake = FakeClient((CONFIG_MAP, CM))
    log: list[str] = []
    _logging_writes(fake, log)
    held = Held(fake, log)
    mgr, elector = _manager(fake, log, held_writes=(held,))
    lost = asyncio.Event()

    async def hold() -> None:
        await lost.wait()
        elector.is_leader = False
        raise LeaderElectionLost("lease lost")

    elector.hold = hold  # type: ignore[method-assign]
    emitter = Emitter(mgr, 2)
    mgr.add(emitter)
    stop = asyncio.Event()
    task = asyncio.create_task(mgr.start(stop))
    await asyncio.wait_for(emitter.emitted.wait(), 5)
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.WARNING):
        lost.set()
        with pytest.raises(LeaderElectionLost):
            await asyncio.wait_for(task, 10)
    assert "event" not in str(log)
    assert "stopping: 4 held writes lost (leadership lost): claim_stamp=2, event=2" in caplog.text
