"""Watches that time claims and Sandboxes to Ready, and the open-loop claim load they time.

Owns:

* `ClaimTracker`: one watch over SandboxClaims recording, per claim, when the create was sent, when it was
  acknowledged, when Ready=True was first seen on the watch stream, and the controller's
  `controller-first-observed-at` / `claim-first-ready-at` annotations; optionally deletes each claim a
  dwell time after Ready (the upstream sustained phase). `drive` sends the creates open-loop.
* `ClaimRecord`: what the tracker knows about one claim.
* `SandboxTracker`: Sandbox ADDED and first-Ready times (refill and cold throughput).

Times are wall-clock seconds (`time.time()`), the same clock the controller stamps its annotations with,
so the three latency views can be compared claim by claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, ApiClient, Gone, KubeError, NotFound, Object

from .log import log
from .objects import is_ready, parse_rfc3339, rfc3339nano

__all__ = ["ClaimRecord", "ClaimTracker", "SandboxTracker"]


@dataclass(slots=True)
class ClaimRecord:
    namespace: str
    name: str
    scheduled: float = 0.0  # planned send time (epoch)
    sent: float = 0.0
    acked: float | None = None
    ready: float | None = None
    first_observed: float | None = None  # controller annotation
    first_ready: float | None = None  # controller annotation
    sandbox: str = ""
    launch_type: str = ""
    error: str = ""
    deleted: bool = False


class ClaimTracker:
    """Creates claims and watches them to Ready (see module docstring)."""

    def __init__(self, api: ApiClient, *, dwell: float | None = None) -> None:
        self.api = api
        self.dwell = dwell
        self.records: dict[str, ClaimRecord] = {}
        self._ready_count = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.inflight = 0
        self.max_inflight = 0
        self.deleted = 0

    # -- watch
    async def start(self) -> None:
        page = await self.api.list_page(SANDBOX_CLAIM, limit=1)
        self._task = asyncio.create_task(self._watch(page.resource_version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _watch(self, rv: str) -> None:
        while True:
            try:
                async for ev in self.api.watch(SANDBOX_CLAIM, resource_version=rv, timeout_seconds=600):
                    meta = ev.object.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if ev.type in ("ADDED", "MODIFIED"):
                        self._observe(ev.object)
            except Gone:
                rv = (await self.api.list_page(SANDBOX_CLAIM, limit=1)).resource_version
            except KubeError as exc:
                log(f"claim watch: {exc}; resuming")
                await asyncio.sleep(0.2)

    def _observe(self, obj: Object) -> None:
        meta = obj["metadata"]
        rec = self.records.get(f"{meta.get('namespace')}/{meta['name']}")
        if rec is None:
            return
        if rec.ready is None and is_ready(obj):
            rec.ready = time.time()
            self._ready_count += 1
            sandbox = ((obj.get("status") or {}).get("sandbox") or {}).get("name") or ""
            rec.sandbox = sandbox
            rec.launch_type = "warm" if sandbox and sandbox != meta["name"] else "cold"
            self._wake()
            if self.dwell is not None:
                self._spawn(self._delete_later(rec))
        ann = meta.get("annotations") or {}
        if rec.first_ready is None and ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT):
            rec.first_ready = parse_rfc3339(ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT))
            rec.first_observed = parse_rfc3339(ann.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT))

    def _wake(self) -> None:
        keep = []
        for target, fut in self._waiters:
            if self._ready_count >= target and not fut.done():
                fut.set_result(None)
            elif not fut.done():
                keep.append((target, fut))
        self._waiters = keep

    async def wait_ready(self, count: int, within: float) -> bool:
        """Wait until `count` tracked claims are Ready; False on timeout."""
        if self._ready_count >= count:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((count, fut))
        try:
            await asyncio.wait_for(fut, within)
        except TimeoutError:
            return False
        return True

    async def wait_annotations(self, within: float) -> None:
        """Give the controller's post-Ready metadata patch time to show on the watch."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if all(r.first_ready is not None for r in self.records.values() if r.ready is not None):
                return
            await asyncio.sleep(0.2)

    @property
    def ready_count(self) -> int:
        return self._ready_count

    # -- load
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_later(self, rec: ClaimRecord) -> None:
        assert self.dwell is not None
        await asyncio.sleep(self.dwell)
        with contextlib.suppress(NotFound):
            try:
                await self.api.delete(SANDBOX_CLAIM, rec.name, namespace=rec.namespace)
            except KubeError as exc:
                log(f"delete claim {rec.name}: {exc}")
                return
        rec.deleted = True
        self.deleted += 1

    def body(self, namespace: str, name: str, pool: str, sent: float) -> Object:
        return {
            "apiVersion": f"{c.EXTENSIONS_GROUP}/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {c.ANNOTATION_CLIENT_FIRST_REQUESTED_AT: rfc3339nano(sent)},
            },
            "spec": {"warmPoolRef": {"name": pool}},
        }

    async def create(self, namespace: str, name: str, pool: str, scheduled: float) -> None:
        rec = ClaimRecord(namespace, name, scheduled=scheduled)
        rec.sent = time.time()
        self.records[f"{namespace}/{name}"] = rec
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            await self.api.create(SANDBOX_CLAIM, self.body(namespace, name, pool, rec.sent))
            rec.acked = time.time()
        except KubeError as exc:
            rec.error = str(exc)[:200]
        finally:
            self.inflight -= 1

    async def drive(
        self,
        arrivals: Sequence[float],
        targets: Sequence[tuple[str, str]],
        *,
        prefix: str,
        max_inflight: int = 2000,
    ) -> float:
        """Open-loop load: claim i is created at t0 + arrivals[i] in targets[i] = (namespace, pool).

        Returns t0 (epoch). Requests are fired without waiting for earlier ones; if more than
        `max_inflight` are unanswered the driver waits (recorded as send lag, never silently dropped).
        """
        loop = asyncio.get_running_loop()
        t0_mono = loop.time() + 0.05
        t0 = time.time() + 0.05
        gate = asyncio.Semaphore(max_inflight)

        async def one(i: int, ns: str, pool: str) -> None:
            try:
                await self.create(ns, f"{prefix}-{i:05d}", pool, t0 + arrivals[i])
            finally:
                gate.release()

        for i, offset in enumerate(arrivals):
            delay = t0_mono + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await gate.acquire()
            ns, pool = targets[i]
            self._spawn(one(i, ns, pool))
        return t0

    async def wait_sent(self) -> None:
        while self.inflight:  # noqa: ASYNC110 (a counter, polled rarely)
            await asyncio.sleep(0.05)


class SandboxTracker:
    """Watches Sandboxes: when each was first seen (ADDED) and first Ready (throughput of refill / cold)."""

    def __init__(self, api: ApiClient, namespace: str | None = None) -> None:
        self.api = api
        self.namespace = namespace
        self.added: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        page = await self.api.list_page(SANDBOX, namespace=self.namespace, limit=1)
        self._task = asyncio.create_task(self._watch(page.resource_version))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self, rv: str) -> None:
        while True:
            try:
                async for ev in self.api.watch(
                    SANDBOX, namespace=self.namespace, resource_version=rv, timeout_seconds=600
                ):
                    meta = ev.object.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if ev.type == "BOOKMARK":
                        continue
                    key = f"{meta.get('namespace')}/{meta.get('name')}"
                    now = time.time()
                    if ev.type == "ADDED":
                        self.added.setdefault(key, now)
                    if ev.type != "DELETED" and key not in self.ready and is_ready(ev.object):
                        self.ready[key] = now
            except Gone:
                rv = (await self.api.list_page(SANDBOX, namespace=self.namespace, limit=1)).resource_version
            except KubeError as exc:
                log(f"sandbox watch: {exc}; resuming")
                await asyncio.sleep(0.2)

    async def wait_ready(self, count: int, within: float) -> bool:
        deadline = time.monotonic() + within
        while len(self.ready) < count:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True
