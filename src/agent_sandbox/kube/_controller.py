"""Controller: a named work queue, its event sources and N workers running one `Reconciler`.

Owns the worker loop semantics of controller-runtime (`pkg/internal/controller`), copied exactly:

* `get` a key, always `done` it in `finally`;
* outcome switch: exception -> `add_rate_limited` (unless `TerminalError`: logged, counted, forgotten);
  `requeue_after` > 0 -> `forget` + `add_after`; otherwise -> `forget`;
* exceptions are contained at the worker boundary, logged with a reconcile id, and counted
  (`controller_runtime_reconcile_*` metrics, result label success / error / requeue_after); an expected
  error (`EXPECTED_ERRORS`: API, connection, timeout) is one line without a traceback; a `Waiting`
  (an expected wait, ours) is retried the same way but logged at info and counted as `requeue`;
* start order: wait for the sources' informers to sync (bounded by `cache_sync_timeout`), register the
  event handlers (existing objects are replayed as adds), launch the workers;
* on cancellation: shut the queue (waiting keys are dropped, no new keys accepted), let in-flight
  reconciles finish for up to `drain_timeout`, then cancel stragglers.

Does not own: which events map to which keys (`_handlers`), how the informers work (`_informer`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ..api.errortext import describe_error
from ._clock import REAL_CLOCK, Clock
from ._handlers import EnqueueHandler, MapFunc
from ._informer import Informer
from ._logging import bind_reconcile
from ._predicates import Predicate
from ._ratelimit import RateLimiter
from ._reconcile import EXPECTED_ERRORS, Reconciler, Request, Result, TerminalError, Waiting
from ._workqueue import WorkQueue
from .metrics import (
    CONTROLLER_ACTIVE_WORKERS,
    CONTROLLER_MAX_CONCURRENT,
    RECONCILE_ERRORS,
    RECONCILE_PANICS,
    RECONCILE_TERMINAL_ERRORS,
    RECONCILE_TIME,
    RECONCILE_TOTAL,
)

__all__ = ["Controller", "Watch"]

log = logging.getLogger("agent_sandbox.kube.controller")


@dataclass(frozen=True, slots=True)
class Watch:
    """One event source of a controller: an informer, a mapping to requests, and filters."""

    informer: Informer
    map_fn: MapFunc
    predicates: Sequence[Predicate] = ()


class Controller:
    """Runs `reconciler` over keys from its queue with `workers` concurrent workers.

    `need_leader_election` is True: the manager starts controllers only on the elected leader.
    """

    need_leader_election = True

    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        *,
        workers: int = 1,
        rate_limiter: RateLimiter | None = None,
        watches: Sequence[Watch] = (),
        cache_sync_timeout: float = 120.0,
        drain_timeout: float = 30.0,
        clock: Clock = REAL_CLOCK,
        metrics: bool = True,
    ) -> None:
        """Create a controller (not started).

        Args:
            name: controller name: metrics label, queue name, log field (e.g. "sandbox").
            reconciler: the reconcile logic.
            workers: concurrent reconciles (`--*-concurrent-workers`); must be > 0.
            rate_limiter: backoff for failed keys; default controller-runtime's.
            watches: event sources (more can be added with `watch()` before start).
            cache_sync_timeout: max wait for the sources' informers to sync before failing.
            drain_timeout: max wait for in-flight reconciles on shutdown.
            clock: time source (tests inject a FakeClock).
            metrics: publish controller and workqueue metrics.
        """
        if workers <= 0:
            raise ValueError(f"controller {name}: workers must be > 0, got {workers}")
        self.name = name
        self.reconciler = reconciler
        self.workers = workers
        self.queue: WorkQueue[Request] = WorkQueue(
            name, rate_limiter=rate_limiter, clock=clock, metrics=metrics
        )
        self._watches = list(watches)
        self._cache_sync_timeout = cache_sync_timeout
        self._drain_timeout = drain_timeout
        self._metrics = metrics
        self._started = False
        if metrics:
            self._m_total = {
                r: RECONCILE_TOTAL.labels(name, r) for r in ("success", "error", "requeue", "requeue_after")
            }
            self._m_errors = RECONCILE_ERRORS.labels(name)
            self._m_terminal = RECONCILE_TERMINAL_ERRORS.labels(name)
            self._m_panics = RECONCILE_PANICS.labels(name)
            self._m_time = RECONCILE_TIME.labels(name)
            self._m_active = CONTROLLER_ACTIVE_WORKERS.labels(name)
            CONTROLLER_MAX_CONCURRENT.labels(name).set(workers)
            # Pre-create the result series at zero, as controller-runtime does.
            for child in (*self._m_total.values(), self._m_errors, self._m_terminal, self._m_panics):
                child.inc(0)

    def watch(self, informer: Informer, map_fn: MapFunc, *predicates: Predicate) -> None:
        """Add an event source (before `start`)."""
        if self._started:
            raise RuntimeError(f"controller {self.name}: cannot add watches after start")
        self._watches.append(Watch(informer, map_fn, predicates))

    # ------------------------------------------------------------------ run

    async def start(self) -> None:
        """Wait for sources to sync, then run workers until cancelled (then drain)."""
        self._started = True
        try:
            async with asyncio.timeout(self._cache_sync_timeout):
                for w in self._watches:
                    await w.informer.wait_for_sync()
        except TimeoutError:
            raise TimeoutError(f"controller {self.name}: timed out waiting for caches to sync") from None
        for w in self._watches:
            w.informer.add_handler(EnqueueHandler(self.queue, w.map_fn, w.predicates))
        log.info("starting workers", extra={"controller": self.name, "workers": self.workers})
        tasks = [
            asyncio.create_task(self._worker(), name=f"{self.name}-worker-{i}") for i in range(self.workers)
        ]
        gauges = asyncio.create_task(self._gauge_loop()) if self._metrics else None
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a worker only ends early on a bug: surface it
        finally:
            if gauges is not None:
                gauges.cancel()
            await self._drain(tasks)

    async def _drain(self, tasks: list[asyncio.Task[None]]) -> None:
        # asyncio.wait (unlike gather/TaskGroup) does not cancel the workers when we are cancelled,
        # so in-flight reconciles get to finish.
        self.queue.shutdown()
        pending = [t for t in tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=self._drain_timeout)
            for task in still:
                task.cancel()
            if still:
                log.warning(
                    "drain timeout: cancelled %d reconciles", len(still), extra={"controller": self.name}
                )
                await asyncio.wait(still)
        log.info("workers stopped", extra={"controller": self.name})

    async def _gauge_loop(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.queue.update_unfinished_work()

    async def _worker(self) -> None:
        queue = self.queue
        while (req := await queue.get()) is not None:
            try:
                await self.process(req)
            finally:
                queue.done(req)

    async def process(self, req: Request) -> None:
        """Reconcile one key and apply the four-arm outcome switch (public for tests)."""
        queue = self.queue
        metrics = self._metrics
        if metrics:
            self._m_active.inc()
        start = time.perf_counter()
        token = bind_reconcile(self.name, req.namespace, req.name, uuid.uuid4().hex)
        try:
            result: Result = await self.reconciler.reconcile(req)
        except asyncio.CancelledError:
            raise
        except TerminalError as exc:
            queue.forget(req)
            if metrics:
                self._m_terminal.inc()
                self._m_errors.inc()
                self._m_total["error"].inc()
            log.error("terminal reconciler error: %s", describe_error(exc), exc_info=exc)
        except Waiting as exc:
            queue.add_rate_limited(req)
            if metrics:
                self._m_total["requeue"].inc()
            log.info("waiting: %s", describe_error(exc))
        except Exception as exc:
            queue.add_rate_limited(req)
            if metrics:
                self._m_errors.inc()
                self._m_total["error"].inc()
                if not isinstance(exc, EXPECTED_ERRORS):
                    # A programming error (KeyError, TypeError, ...) is our analogue of a recovered Go panic.
                    self._m_panics.inc()
            if isinstance(exc, EXPECTED_ERRORS):
                # An API-server outage fails every worker with these on every retry: a traceback (chained,
                # ~4.7 KB) per line flooded the log with nothing the error text does not say. The text
                # stays in the line and in the structured `error` field, as exc_info would put it there.
                text = describe_error(exc)
                log.error("reconciler error: %s", text, extra={"error": text})
            else:
                log.error("reconciler error: %s", describe_error(exc), exc_info=exc)
        else:
            queue.forget(req)
            if result.requeue_after and result.requeue_after > 0:
                queue.add_after(req, result.requeue_after)
                if metrics:
                    self._m_total["requeue_after"].inc()
            elif metrics:
                self._m_total["success"].inc()
        finally:
            token.reset()
            if metrics:
                self._m_time.observe(time.perf_counter() - start)
                self._m_active.dec()
