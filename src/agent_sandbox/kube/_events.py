"""Kubernetes Events through the events.k8s.io/v1 API (controllers spec §5.10).

Owns: `EventBroadcaster`, a runnable that writes events in the background (a reconcile never waits on an
event write), and `EventRecorder`, the per-reporter handle controllers call (`recorder.event(obj, ...)`).
Behaviour follows client-go's events/v1 broadcaster in simplified form:

* the first occurrence of an event creates an `Event` named `<object>.<hex timestamp>` in the object's
  namespace ("default" for cluster-scoped objects);
* an isomorphic repeat (same object, type, reason, action, reporter) within 6 minutes patches the
  existing Event's `series` (count, lastObservedTime) instead of creating a new object;
* a per-object spam filter (burst 25, one token per 5 minutes, like client-go) drops floods;
* the buffer is bounded (1000); when full, events are dropped and counted rather than blocking;
* an optional `hold` delays each write (claim priority: Events wait while claims arrive); `flush()` ends
  it and writes everything queued, which the manager awaits on a graceful stop *before* it releases the
  Lease (afterwards every write is refused with `NotLeader`).

Failure modes: write errors are logged at debug level and dropped; events are best-effort by design. A 403
is logged as a warning (a missing RBAC grant), unless it is the refusal of a namespace being deleted. Once
the process is stopping (`flush()` called, or `start()` cancelled), a write that fails is also counted in
`unwritten()`, so the manager's stop warning names it: the API server down or leadership lost mid-flush
(`NotLeader`) would otherwise lose every held Event without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from ..api.errortext import describe_error
from ._client import ApiClient
from ._ratelimit import TokenBucket
from ._resources import EVENT
from ._types import Object
from .errors import Forbidden, KubeError, NotFound, is_namespace_terminating

__all__ = ["EventBroadcaster", "EventRecorder", "EventSink", "NullEventRecorder"]

log = logging.getLogger("agent_sandbox.kube.events")

EventType = Literal["Normal", "Warning"]
_SERIES_WINDOW = 6 * 60.0
_NOTE_MAX = 1024


class EventSink(Protocol):
    """What controllers depend on: fire-and-forget event emission."""

    def event(self, regarding: Object, type_: EventType, reason: str, action: str, note: str) -> None: ...


class NullEventRecorder:
    """Discards events (used when events are disabled, e.g. `--disable-claim-events`)."""

    def event(self, regarding: Object, type_: EventType, reason: str, action: str, note: str) -> None:
        return None


@dataclass(slots=True)
class _Pending:
    controller: str
    regarding: dict[str, str]
    type_: str
    reason: str
    action: str
    note: str
    at: float


@dataclass(slots=True)
class _Series:
    name: str
    namespace: str
    count: int
    last: float


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _reference(obj: Object) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""), "name": meta.get("name", "")}
    for src, dst in (("namespace", "namespace"), ("uid", "uid"), ("resourceVersion", "resourceVersion")):
        if meta.get(src):
            ref[dst] = meta[src]
    return ref


class EventRecorder:
    """Emits events as one reporting controller (e.g. "sandboxclaim-controller")."""

    __slots__ = ("_broadcaster", "controller")

    def __init__(self, broadcaster: EventBroadcaster, controller: str) -> None:
        self._broadcaster = broadcaster
        self.controller = controller

    def event(self, regarding: Object, type_: EventType, reason: str, action: str, note: str) -> None:
        """Queue an event about `regarding`; never blocks, never raises."""
        self._broadcaster.submit(
            _Pending(
                self.controller, _reference(regarding), type_, reason, action, note[:_NOTE_MAX], time.time()
            )
        )


class EventBroadcaster:
    """Background writer of Events; run `start()` as a (non-leader-gated) runnable."""

    need_leader_election = False

    def __init__(
        self,
        client: ApiClient,
        *,
        instance: str,
        buffer: int = 1000,
        hold: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        """Args: client to write with; instance: `reportingInstance` (controller identity); hold: awaited
        with an event's age (seconds) before it is written, to let a busier path go first."""
        self._client = client
        self._instance = instance
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=buffer)
        self._series: dict[tuple[str, ...], _Series] = {}
        self._spam: dict[str, TokenBucket] = {}
        self.dropped = 0
        self._hold = hold
        self._running = False
        self._flushing = False
        self._flush_now: asyncio.Future[None] | None = None  # resolved by flush(): ends the hold in progress
        self._current: _Pending | None = None  # taken from the queue, not written yet
        self._writing = False  # `_current` was handed to the API client (not re-sent after a cancel)
        self._lost = 0  # writes that failed while stopping (part of `unwritten()`)

    def recorder(self, controller: str) -> EventRecorder:
        """A recorder reporting as `controller`."""
        return EventRecorder(self, controller)

    def submit(self, pending: _Pending) -> None:
        uid = pending.regarding.get("uid") or pending.regarding.get("name", "")
        bucket = self._spam.get(uid)
        if bucket is None:
            bucket = self._spam[uid] = TokenBucket(1 / 300.0, 25)
            if len(self._spam) > 4096:  # bound memory: forget the oldest filters
                self._spam.pop(next(iter(self._spam)))
        if bucket.reserve() > 0:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            self.dropped += 1

    async def start(self) -> None:
        """Write queued events until cancelled; flushes what is left (1 s max) on the way out.

        That last flush runs after a leader released its Lease, so its writes are refused; the manager's
        graceful stop calls `flush()` before the release, and this only catches what that left.
        """
        self._running = True
        try:
            while True:
                pending = self._current = await self._queue.get()
                await self._wait_hold(pending)
                self._writing = True
                await self._write(pending)
                self._current, self._writing = None, False
                self._queue.task_done()
        finally:
            self._running = False
            if self._writing:  # cancelled mid-write: it may have been sent, so not again (nor counted)
                self._current, self._writing = None, False
                self._queue.task_done()
            # An event cancelled in its hold was never sent: it goes first. Each stays `_current` (counted
            # by `unwritten()`) until its write returned, whenever the manager takes the count.
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                async with asyncio.timeout(1.0):
                    await self._write_left()

    async def flush(self) -> None:
        """Stop holding and write every queued event; returns once the queue is empty (`manager.HeldWrites`).

        The hold stays off afterwards (the process is stopping). The caller bounds the wait.
        """
        self._flushing = True
        if self._flush_now is not None and not self._flush_now.done():
            self._flush_now.set_result(None)
        if self._running:
            await self._queue.join()
            return
        await self._write_left()  # not started (or stopped): write them here

    async def _write_left(self) -> None:
        """Write, here, the event taken and not sent (`_current`) and then every queued one. Each stays
        `_current` (counted by `unwritten()`) until its write returned."""
        while self._current is not None or not self._queue.empty():
            if self._current is None:
                self._current = self._queue.get_nowait()
            await self._write(self._current)
            self._current = None
            self._queue.task_done()

    def unwritten(self) -> dict[str, int]:
        """Events queued or held and not written yet, plus those that failed while stopping (`manager.HeldWrites`)."""
        return {"event": self._queue.qsize() + (1 if self._current is not None else 0) + self._lost}

    async def _wait_hold(self, pending: _Pending) -> None:
        """The hold for `pending`, cut short by `flush()`."""
        if self._hold is None or self._flushing:
            return
        if self._flush_now is None:
            self._flush_now = asyncio.get_running_loop().create_future()
        hold = asyncio.ensure_future(self._hold(time.time() - pending.at))
        try:
            await asyncio.wait((hold, self._flush_now), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not hold.done():
                hold.cancel()
            elif not hold.cancelled() and (exc := hold.exception()) is not None:
                log.warning("event hold failed, writing now: %s", describe_error(exc))

    def _failed(self) -> None:
        """A write failed: lost for good once stopping (no successor emits it), best effort before."""
        if self._flushing or not self._running:
            self._lost += 1

    async def _write(self, p: _Pending) -> None:
        ref = p.regarding
        key = (p.controller, ref.get("uid", ""), ref.get("name", ""), p.type_, p.reason, p.action)
        series = self._series.get(key)
        try:
            if series is not None and p.at - series.last < _SERIES_WINDOW:
                series.count += 1
                series.last = p.at
                patch: dict[str, Any] = {"series": {"count": series.count, "lastObservedTime": _micro(p.at)}}
                await self._client.patch(EVENT, series.name, patch, namespace=series.namespace)
                return
            body = self._body(p)
            created = await self._client.create(EVENT, body)
            meta = created["metadata"]
            self._series[key] = _Series(meta["name"], meta["namespace"], 1, p.at)
            if len(self._series) > 4096:
                self._series.pop(next(iter(self._series)))
        except NotFound:
            self._series.pop(key, None)  # the Event expired server-side; next repeat creates a new one
        except Forbidden as exc:
            if is_namespace_terminating(exc):
                # The namespace is being deleted, the Event would go with it: nothing to report.
                log.debug("dropping event %s/%s: %s", p.reason, ref.get("name"), describe_error(exc))
                return
            # A missing RBAC grant is an installation problem: say so (client-go logs rejected events too).
            log.warning("dropping event %s/%s: %s", p.reason, ref.get("name"), describe_error(exc))
            self._failed()
        except KubeError as exc:  # includes NotLeader: leadership ended, nothing may be written any more
            log.debug("dropping event %s/%s: %s", p.reason, ref.get("name"), describe_error(exc))
            self._failed()

    def _body(self, p: _Pending) -> Object:
        ref = p.regarding
        namespace = ref.get("namespace") or "default"
        return {
            "apiVersion": EVENT.api_version,
            "kind": EVENT.kind,
            "metadata": {"name": f"{ref.get('name', 'event')}.{time.time_ns():x}", "namespace": namespace},
            "eventTime": _micro(p.at),
            "reportingController": p.controller,
            "reportingInstance": self._instance,
            "action": p.action,
            "reason": p.reason,
            "note": p.note,
            "type": p.type_,
            "regarding": ref,
        }
