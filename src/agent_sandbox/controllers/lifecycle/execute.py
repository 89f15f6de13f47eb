"""The lifecycle controller's executor: what every step needs (`Executor`), and the steps on a live Sandbox.

`decide` returns one typed plan per pass; the reconciler hands it to one function here, in
`execute_archive` (into and out of an archive) or in `execute_restore`. Each makes one API call per step, in
the order the plan gives, and decides nothing beyond what a write's answer tells: a step already done is not
in the plan, so a pass interrupted anywhere is finished by the next one.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.kube import SANDBOX, SANDBOX_CLAIM, Client, EventSink, NotFound, Request, Result

from .decide import DropHibernate, Nothing, Snapshot, Suspend
from .metrics import LifecycleMetrics

__all__ = ["RETRY_SOON", "Executor", "ProblemReports", "drop_hibernate", "end_archive", "suspend_sandbox"]

log = logging.getLogger("agent_sandbox.controllers.lifecycle")

RETRY_SOON = 0.2


@dataclass(frozen=True, slots=True)
class Executor:
    """Where the steps write and report.

    client: reads from the cache, writes to the API server. authoritative: uncached reads, for the few
    answers the cache may have wrong at the moment they matter (see each use).
    """

    client: Client
    authoritative: Client
    events: EventSink
    metrics: LifecycleMetrics


class ProblemReports:
    """Carries out `Nothing`'s problems: one Warning Event per distinct problem set of a Sandbox (not again
    on every pass)."""

    def __init__(self, events: EventSink) -> None:
        self._events = events
        # (namespace, name) -> (uid, problem set) last reported; pruned once the Sandbox is gone, so deleted
        # Sandboxes do not pile up here (keyed by name: the request of a deleted object carries no UID).
        self._reported: dict[tuple[str, str], tuple[str, frozenset[str]]] = {}

    def __len__(self) -> int:
        return len(self._reported)

    def forget(self, namespace: str, name: str) -> None:
        """The Sandbox is gone: its next problem set (a new Sandbox of the name) is reported afresh."""
        self._reported.pop((namespace, name), None)

    def report(self, snap: Snapshot, plan: Nothing) -> None:
        """Send the Events for `plan`'s problems unless this problem set was the last one reported."""
        subject = snap.sandbox
        if subject is None:
            return
        meta = subject["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        uid = str(meta.get("uid") or "")
        problems = frozenset((*plan.problems, plan.conflict) if plan.conflict else plan.problems)
        if self._reported.get(key, (uid, frozenset())) == (uid, problems):
            return
        self._reported[key] = (uid, problems)
        # One Event per reason with every problem in its note: Events of one object, reason and action are one
        # series whose first note is kept (as client-go's recorder), so one Event per problem named only the
        # first unusable annotation (until December 6).
        invalid = "; ".join(sorted(p for p in problems if p != plan.conflict))
        if invalid:
            self._events.event(dict(subject), "Warning", "InvalidLifecycleSettings", "Lifecycle", invalid)
        if plan.conflict:
            self._events.event(dict(subject), "Warning", "HibernationConflict", "Lifecycle", plan.conflict)


async def suspend_sandbox(ex: Executor, request: Request, snap: Snapshot, plan: Suspend) -> Result:
    """`Suspend`: suspend the Sandbox (idle, or to be hibernated)."""
    assert snap.sandbox is not None
    patch = lc.suspend_patch(plan.cause, snap.now, plan.resource_version)
    await ex.client.patch(SANDBOX, request.name, patch, namespace=request.namespace)
    ex.metrics.suspends.labels(str(plan.cause)).inc()
    note = (
        f"Suspended after {plan.idle_for:.0f}s without activity"
        if plan.idle_for is not None
        else "Suspended to be hibernated"
    )
    ex.events.event(dict(snap.sandbox), "Normal", "Suspended", "Suspend", note)
    log.info("suspended %s (%s)", request, plan.cause)
    return Result()


async def drop_hibernate(ex: Executor, request: Request, plan: DropHibernate) -> Result:
    """`DropHibernate`: take the hibernate request off a warm-pool member."""
    patch = {
        "metadata": {
            "resourceVersion": plan.resource_version,
            "annotations": {lc.ANNOTATION_HIBERNATE: None},
        }
    }
    with contextlib.suppress(NotFound):
        await ex.client.patch(SANDBOX, request.name, patch, namespace=request.namespace)
    log.info("dropped a hibernate request from warm-pool member %s", request)
    return Result()


async def end_archive(ex: Executor, request: Request, claim_name: str | None, archive_uid: str) -> None:
    """The archive is over (given up, or its restore finished): the claim stops saying hibernated, then the
    archive goes (by UID: never a newer archive of the name)."""
    ns = request.namespace
    if claim_name:
        unmark = {"metadata": {"annotations": {lc.ANNOTATION_HIBERNATED_SANDBOX: None}}}
        with contextlib.suppress(NotFound):
            await ex.client.patch(SANDBOX_CLAIM, claim_name, unmark, namespace=ns)
    with contextlib.suppress(NotFound):
        await ex.client.delete(lc.ARCHIVE, request.name, namespace=ns, uid=archive_uid)
