"""Leader election isolated from the controller's load: its own thread, event loop and API client.

Why: the controllers share one event loop and one client (with the `--kube-api-qps` token bucket and a
bounded connection pool). Under overload, a renewal on that loop waits behind every ready reconcile
step, and its requests queue behind the reconcilers' in the token bucket; past the renew deadline the
controller gives up its own lease and exits (issue 11: a 30 claims/s run lost it). client-go renews
from a goroutine of its own with a client of its own; this is the same arrangement.

How: `ThreadedLeaderElector` wraps a `LeaderElector` whose client is used by nothing else (the manager
passes `ApiClient.clone(...)`: own connection pool, own token bucket). The elector's coroutines run on a
private event loop in a daemon thread; the caller's `acquire()`/`hold()`/`release()` await them through
thread-safe futures, so cancelling the caller's task cancels the elector's. CPU-bound work on the main
loop does not delay the thread by more than the interpreter's GIL switch interval (5 ms) per step.

Failure modes: `hold()` raises `LeaderElectionLost` in the caller exactly as `LeaderElector.hold()` does,
so "leader lost" stops the manager as before. `close()` stops the thread and closes the client; a thread
that does not stop within its bound is left behind (daemon) with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..api.errortext import describe_error
from ._client import ApiClient
from ._clock import REAL_CLOCK, Clock
from ._leaderelection import LeaderElectionConfig, LeaderElector, RenewalRound

__all__ = ["ThreadedLeaderElector"]

log = logging.getLogger("agent_sandbox.kube.leaderelection")

T = TypeVar("T")

_JOIN_TIMEOUT = 5.0


class ThreadedLeaderElector:
    """A `LeaderElector` running on its own thread and event loop with a client nobody else uses.

    The elector owns `client` (closed by `close()`). The thread starts on the first call and stops in
    `close()`; call `release()` (graceful stop) before `close()`.
    """

    def __init__(
        self,
        client: ApiClient,
        config: LeaderElectionConfig,
        *,
        clock: Clock = REAL_CLOCK,
        thread_name: str = "leader-election",
    ) -> None:
        self._client = client
        self.elector = LeaderElector(client, config, clock=clock)
        self.config = config
        self.identity = self.elector.identity
        self._thread_name = thread_name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._hold_task: asyncio.Task[None] | None = None  # lives on the elector's loop

    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader

    @property
    def observed_holder(self) -> str:
        return self.elector.observed_holder

    @property
    def renew_rounds(self) -> deque[RenewalRound]:
        """See `LeaderElector.renew_rounds`."""
        return self.elector.renew_rounds

    @property
    def thread(self) -> threading.Thread | None:
        """The elector's thread once started (None before the first call)."""
        return self._thread

    # ------------------------------------------------------------------ the thread

    def _ensure_thread(self) -> asyncio.AbstractEventLoop:
        if self._loop is not None:
            return self._loop
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            try:
                loop.run_forever()
            finally:
                _cancel_leftovers(loop)
                loop.close()

        thread = threading.Thread(target=run, name=self._thread_name, daemon=True)
        thread.start()
        started.wait()
        self._loop, self._thread = loop, thread
        return loop

    async def _on_thread(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the elector's loop; cancelling the caller cancels it there too."""
        loop = self._ensure_thread()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    # ------------------------------------------------------------------ Elector

    async def acquire(self) -> None:
        """Block until this candidate holds the Lease (campaigning on the elector's thread)."""
        await self._on_thread(self.elector.acquire())

    async def hold(self) -> None:
        """Renew on the elector's thread until cancelled; raise `LeaderElectionLost` here when lost."""
        await self._on_thread(self._hold())

    async def _hold(self) -> None:
        self._hold_task = asyncio.current_task()
        await self.elector.hold()

    async def release(self) -> bool:
        """Stop renewing and give the Lease up (both on the elector's thread)."""
        if self._loop is None:
            return False
        return await self._on_thread(self._release())

    async def _release(self) -> bool:
        task = self._hold_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        return await self.elector.release()

    async def close(self) -> None:
        """Close the client and stop the thread (waits up to 5 s for it)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            await self._client.close()  # never used on a thread: nothing was opened on another loop
            return
        try:
            await self._on_thread(self._client.close())
        except Exception as exc:
            log.warning("closing the leader election client failed: %s", describe_error(exc))
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, _JOIN_TIMEOUT)
        if thread.is_alive():
            log.warning("leader election thread did not stop within %.0fs", _JOIN_TIMEOUT)
        self._loop = None


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel tasks still pending on a stopped loop and let them unwind (asyncio.run's clean-up)."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
