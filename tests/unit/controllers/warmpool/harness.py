"""A warm pool reconciler wired to real informers over the in-memory FakeClient (unit tests only)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from agent_sandbox.controllers.indexes import POOL_BY_TEMPLATE, SANDBOX_BY_POOL, ensure_indexes
from agent_sandbox.controllers.warmpool import ExpectationsObserver, WarmPoolConfig, WarmPoolReconciler
from agent_sandbox.kube import (
    POD,
    SANDBOX,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Cache,
    CachedClient,
    Expectations,
    Object,
    Request,
    Result,
)
from agent_sandbox.kube.testing import FakeClient, FakeClock

from .fixtures import NS

KINDS = (SANDBOX, SANDBOX_WARM_POOL, SANDBOX_TEMPLATE, POD)


@dataclass
class RecordedEvents:
    events: list[tuple[str, str, str, str]] = field(default_factory=list)

    def event(self, regarding: Object, type_: str, reason: str, action: str, note: str) -> None:
        self.events.append((type_, reason, action, note))


class Harness:
    """Reconciler + informer cache (with the expectations observer) + fake API + fake clocks."""

    def __init__(self, fake: FakeClient, config: WarmPoolConfig | None = None) -> None:
        self.fake = fake
        self.cache = Cache(fake)
        ensure_indexes(self.cache, SANDBOX_BY_POOL, POOL_BY_TEMPLATE)
        self.expectations = Expectations(clock=FakeClock())
        self.cache.informer(SANDBOX).add_handler(ExpectationsObserver(self.expectations))
        for kind in KINDS:
            self.cache.informer(kind)
        self.client = CachedClient(self.cache, fake)  # type: ignore[arg-type]
        self.events = RecordedEvents()
        self.clock = FakeClock()
        # The FakeClient stamps creationTimestamp with the real time: start the wall clock there.
        self.now = time.time()
        self.reconciler = WarmPoolReconciler(
            self.client,
            config=config or WarmPoolConfig(grace_jitter=0),
            expectations=self.expectations,
            events=self.events,
            clock=self.clock,
            wall_clock=lambda: self.now,
        )

    async def reconcile(self, name: str = "pool") -> Result:
        return await self.reconciler.reconcile(Request(NS, name))

    async def settle(self) -> None:
        """Wait until every informer mirrors the fake API exactly."""
        for _ in range(10_000):
            if all(self._mirrored(kind) for kind in KINDS):
                return
            await asyncio.sleep(0)
        raise AssertionError("informers did not catch up")

    def _mirrored(self, kind: Any) -> bool:
        inf = self.cache.informer(kind)
        want = {(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in self.fake.objects(kind)}
        have = {(o["metadata"]["name"], o["metadata"]["resourceVersion"]) for o in inf.list()}
        return want == have

    def sandboxes(self) -> list[Object]:
        return self.fake.objects(SANDBOX)

    def creates(self) -> int:
        return sum(1 for verb, kind, _, _ in self.fake.actions if verb == "create" and kind == "Sandbox")

    def pool_status(self, name: str = "pool") -> dict[str, Any]:
        (p,) = [o for o in self.fake.objects(SANDBOX_WARM_POOL) if o["metadata"]["name"] == name]
        status: dict[str, Any] = p.get("status") or {}
        return status


@contextlib.asynccontextmanager
async def running(fake: FakeClient, config: WarmPoolConfig | None = None) -> AsyncIterator[Harness]:
    h = Harness(fake, config)
    task = asyncio.create_task(h.cache.start())
    try:
        await h.cache.wait_for_sync()
        yield h
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
