"""`LifecycleReconciler`: observe -> decide -> execute for one name (a Sandbox and/or its SandboxArchive).

Observe (`observe`) reads the cache only (Sandbox, archive, template, claim, PVCs, Service), plus the
runtime's activity when `decide` asks for it (`Probe`, then decide again). Execute (`execute`,
`execute_archive`, `execute_restore`) makes one API call per step, in the order the plan gives; a step that
is already done is not in the plan, so a pass interrupted anywhere (crash, conflict, restart) is finished by
the next one. Conflicts (409: someone changed the object since we read it) and NotFound are expected: the
pass ends and the object's next event (or a short requeue) decides again. Everything else is raised for
backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from agent_sandbox.kube import Client, Conflict, EventSink, Request, Result

from .decide import (
    AbandonArchive,
    ArchiveSteps,
    DropHibernate,
    ExpireArchive,
    MarkArchiveExpired,
    Nothing,
    Plan,
    Probe,
    RestoreSteps,
    Snapshot,
    Suspend,
    decide,
)
from .execute import RETRY_SOON, Executor, ProblemReports, drop_hibernate, suspend_sandbox
from .execute_archive import abandon_archive, archive_sandbox, expire_archive, mark_archive_expired
from .execute_restore import restore_sandbox
from .metrics import LifecycleMetrics
from .observe import observe
from .probe import ActivityProbe

__all__ = ["LifecycleReconciler"]


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class LifecycleReconciler:
    """The lifecycle controller's `Reconciler` (name `sandboxlifecycle`)."""

    def __init__(
        self,
        client: Client,
        *,
        probe: ActivityProbe | None,
        events: EventSink,
        metrics: LifecycleMetrics,
        extensions: bool = True,
        now: Callable[[], datetime] = _wall_clock,
        authoritative: Client | None = None,
    ) -> None:
        """Args:
        client: reads from the cache, writes to the API server.
        probe: asks runtimes for their activity before an idle suspend (None: never asked).
        events: Events on Sandboxes (suspended, hibernated, restored, bad settings).
        metrics: counters and timers.
        extensions: templates and claims are cached (`--extensions`); without, neither is read.
        now: wall clock.
        authoritative: uncached reads (the manager's API client), to confirm that a restored Sandbox the
            cache no longer shows is really gone before its archive is deleted; default `client`.
        """
        self._client = client
        self._probe = probe
        self.metrics = metrics
        self._extensions = extensions
        self._now = now
        self._executor = Executor(
            client=client, authoritative=authoritative or client, events=events, metrics=metrics
        )
        self._reports = ProblemReports(events)

    @property
    def reported(self) -> int:
        """Sandboxes (or archives) whose current problem set has been reported as an Event."""
        return len(self._reports)

    async def reconcile(self, request: Request) -> Result:
        snap = await self._observe(request)
        if snap.sandbox is None:  # gone (deleted, or hibernated into its archive): nothing left to report on
            self._reports.forget(request.namespace, request.name)
        plan = decide(snap)
        if isinstance(plan, Probe):
            assert self._probe is not None
            activity = await self._probe.ask(plan.ip)
            result = "unreachable" if not activity.reachable else "busy" if activity.busy else "idle"
            self.metrics.probes.labels(result).inc()
            plan = decide(replace(snap, activity=activity))
        try:
            return await self._execute(request, snap, plan)
        except Conflict:
            return Result(requeue_after=RETRY_SOON)  # someone wrote first: decide again on fresh data

    async def _observe(self, request: Request) -> Snapshot:
        return await observe(
            self._client,
            request,
            extensions=self._extensions,
            probe_enabled=self._probe is not None,
            now=self._now,
        )

    async def _execute(self, request: Request, snap: Snapshot, plan: Plan) -> Result:
        ex = self._executor
        if isinstance(plan, Nothing):
            self._reports.report(snap, plan)
            return Result(requeue_after=plan.requeue_after)
        if isinstance(plan, Suspend):
            return await suspend_sandbox(ex, request, snap, plan)
        if isinstance(plan, DropHibernate):
            return await drop_hibernate(ex, request, plan)
        if isinstance(plan, ArchiveSteps):
            return await archive_sandbox(ex, request, snap, plan)
        if isinstance(plan, AbandonArchive):
            return await abandon_archive(ex, request, snap, plan)
        if isinstance(plan, MarkArchiveExpired):
            return await mark_archive_expired(ex, request, snap)
        if isinstance(plan, RestoreSteps):
            return await restore_sandbox(ex, request, snap, plan)
        if isinstance(plan, ExpireArchive):
            return await expire_archive(ex, request, snap, plan)
        raise AssertionError(f"unexpected plan {plan!r}")
