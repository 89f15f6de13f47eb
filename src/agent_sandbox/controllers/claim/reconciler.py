"""SandboxClaim reconciler (controllers spec §4.3): observe -> decide -> execute, in three stages.

Per pass: read the claim and everything it refers to from the cache (plus our own not-yet-observed
writes, `store.Freshest`; `observe`); `decide_expiry`; `resolve` the binding and execute its single write
(warm takeover via `warm.WarmPath`, cold create, or a repair of the bound Sandbox; `apply`); make sure the
claim carries the metadata upstream has on it before its status names a Sandbox (`intent`: first-observed
time, assignment record); compute the status and write it (one guarded merge patch); then record the
latency metrics and stamp `claim-first-ready-at` (`stamps`). How the pass ends (requeue, retry) is
`result`'s.

Warm path write count (a Ready member, first pass): the claim's intent patch and the takeover patch, sent
together; then the status patch; then the first-ready stamp - four writes, two round trips before the
claim shows Ready. The intent patch always lands before the status write, because a CRD's `/status`
write ignores metadata: a client that sees the claim Ready reads its `sandbox-name` and
`controller-first-observed-at`, as with upstream (issue 11; docs/design/claim-priority.md).
docs/design/claim-adoption.md explains why the takeover itself needs no claim-side lock.

In the controller process (`detach_metadata_writes`) the first-ready stamp runs off the worker
(`stamps.FirstReadyStamps`; docs/performance.md).

A cold create refused because the namespace is being deleted ends the pass: done, no status (as a
ReplicaSet).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.errortext import describe_error
from agent_sandbox.api.meta import (
    claim_pool_name,
    find_condition,
    is_ready,
    normalize_created_by,
    pool_key,
    upsert_condition,
)
from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX_CLAIM,
    Client,
    EventSink,
    EventType,
    KubeError,
    Object,
    Reader,
    Request,
    Result,
    Tracing,
)

from ..claim_pressure import ClaimPressure
from . import execute as ex
from .apply import NamespaceTerminating, apply_resolution
from .decide import (
    Adopt,
    DeleteClaim,
    MarkExpired,
    NeedCandidate,
    Pending,
    Resolution,
    Snapshot,
    decide_expiry,
    decide_first_ready,
    legacy_policy_to_delete,
    resolve,
    resolve_expired,
)
from .intent import ClaimGone, ensure_intent, first_observed
from .observability import ClaimMetrics, ObservedTimes, ReadyStep, latencies, readiness_step
from .observe import observe, sandbox_view
from .queue import WarmQueue
from .result import EXPIRED_REQUEUE, pass_result
from .stamps import FirstReadyStamps
from .status import compute_status, expiry, invalid_reference_event
from .store import Freshest, Store
from .warm import WarmPath

__all__ = ["ClaimConfig", "ClaimReconciler"]

log = logging.getLogger("agent_sandbox.controllers.claim")

REPORTER = "sandboxclaim-controller"


@dataclass(frozen=True, slots=True)
class ClaimConfig:
    """Claim controller settings from the process flags (§5.1)."""

    allowed_label_domains: tuple[str, ...] = ()
    persist_observability: bool = True  # False: --disable-claim-observability-annotations
    takeover_attempts: int = 3


class ClaimReconciler:
    """Reconciles one SandboxClaim per call; see the module docstring."""

    def __init__(
        self,
        *,
        store: Store,
        api: Client,
        authoritative: Reader,
        queue: WarmQueue,
        observed: ObservedTimes,
        fresh: Freshest,
        events: EventSink,
        metrics: ClaimMetrics,
        config: ClaimConfig,
        tracing: Tracing | None = None,
        pressure: ClaimPressure | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Args:
        store: synchronous cache reads. api: writes. authoritative: uncached reads (settling contests).
        queue / observed / fresh: the controller's in-memory state. pressure: claim arrivals (a detached
        metadata patch waits behind them, bounded by its hold). now: wall clock (tests inject one).
        """
        self.store = store
        self.api = api
        self.authoritative = authoritative
        self.queue = queue
        self.observed = observed
        self.fresh = fresh
        self.events = events
        self.metrics = metrics
        self.config = config
        self.tracing = tracing or Tracing()
        self.pressure = pressure or ClaimPressure(0.0)
        self.now = now
        self.warm = WarmPath(
            api=api,
            authoritative=authoritative,
            queue=queue,
            fresh=fresh,
            events=events,
            metrics=metrics,
            sandbox=self._sandbox,
            attempts=config.takeover_attempts,
            before_takeover=self._intent_for_candidate,
        )
        self._stamps = FirstReadyStamps()

    def detach_metadata_writes(self, retry: Callable[[Request], None]) -> None:
        """Send the post-Ready claim metadata patch from a background task instead of the worker.

        `retry` re-enqueues a claim with backoff (the controller's `queue.add_rate_limited`); it is called
        when a detached patch fails. Without this call the patch is awaited in the pass (unit tests).
        """
        self._stamps.detach(retry)

    def held_writes(self) -> dict[str, int]:
        """`claim_pressure.HoldsWrites`: detached first-ready stamps not yet sent (most held behind claims)."""
        return self._stamps.held_writes()

    async def flush_held(self) -> None:
        """`claim_pressure.FlushesHeldWrites`: return once every detached stamp is done.

        Called on a graceful stop after `ClaimPressure.stop` ended their wait, while this process still
        holds the Lease: a successor would find these claims Ready without a stamp and write `unknown`.
        """
        await self._stamps.flush_held()

    def unwritten(self) -> dict[str, int]:
        """`claim_pressure.FlushesHeldWrites`: stamps in flight, plus failed ones no pass has retried yet."""
        return self._stamps.unwritten()

    @property
    def _stamping(self) -> dict[str, asyncio.Task[None]]:
        # The detached stamps in flight by claim UID; tests wait for (or cancel) them.
        return self._stamps.in_flight

    # ------------------------------------------------------------------ entry

    async def reconcile(self, request: Request) -> Result:
        self._stamps.retrying(request)  # the retry of a failed stamp: this pass backfills it if need be
        ns, name = request.namespace, request.name
        cached = self.store.get(SANDBOX_CLAIM, ns, name)
        if cached is None:
            self.observed.drain(ns, name)
            return Result()
        claim = self.fresh.view(SANDBOX_CLAIM, ns, name, cached) or cached
        ann = claim["metadata"].get("annotations") or {}
        created_by = (claim["metadata"].get("labels") or {}).get(c.LABEL_CREATED_BY)
        attrs = {c.LABEL_CREATED_BY: normalize_created_by(created_by)} if created_by else {}
        with self.tracing.start_span(
            "ReconcileSandboxClaim", parent=ann.get(c.ANNOTATION_TRACE_CONTEXT), attributes=attrs
        ):
            return await self._reconcile(claim)

    async def _reconcile(self, claim: Mapping[str, Any]) -> Result:
        meta = claim["metadata"]
        ns = meta["namespace"]
        await self._legacy_policy(claim)
        if meta.get("deletionTimestamp"):
            return Result()  # garbage collection removes the Sandbox
        now = self.now()
        step = decide_expiry(claim, now)
        if isinstance(step, MarkExpired):
            status = copy.deepcopy(dict(claim.get("status") or {}))
            conditions = list(status.get("conditions") or [])
            upsert_condition(conditions, step.ready, now)
            status["conditions"] = conditions
            current = await self._ensure_intent(claim, None)
            if current is None:
                return Result()  # the claim is gone
            self._remember_claim(await ex.write_status(self.api, current, status))
            self._event(claim, c.EVENT_CLAIM_EXPIRED, "Claim Expired", "Claim expired")
            return Result(EXPIRED_REQUEUE)
        if isinstance(step, DeleteClaim):
            uid = meta.get("uid", "")
            if self.fresh.deleted(uid):
                return Result()  # deleted by an earlier pass; the informer has not delivered it yet
            self._event(
                claim, c.EVENT_CLAIM_EXPIRED, "Deleting", f"Deleting Claim (ShutdownPolicy={step.policy})"
            )
            await ex.delete_claim(self.api, claim, step.propagation)
            self.fresh.mark_deleted(uid)
            return Result()

        snap = await observe(
            claim,
            now,
            store=self.store,
            fresh=self.fresh,
            authoritative=self.authoritative,
            queue=self.queue,
            allowed_domains=self.config.allowed_label_domains,
        )
        if step.expired:
            resolution: Resolution = resolve_expired(snap)
        else:
            try:
                resolution = await self._resolve_active(snap)
            except ClaimGone as gone:
                # Deleted while its warm takeover was in flight (a mass delete, a namespace delete): the
                # normal end of a pass, as the NotFound of any later claim write is. A member the takeover
                # already gave it is owned by the dead claim's UID, so garbage collection deletes it and
                # the pool refills (claim-quirks.md #23). No error line, no error metric, no requeue.
                log.debug("claim %s/%s: gone during its warm takeover: %s", ns, meta["name"], gone)
                return Result()
        if isinstance(resolution, Pending):
            # No status write: the claim is only waiting for a member's Pod IP (≤ 2 s); a member getting
            # networked wakes it sooner than the timer.
            self.queue.wait(pool_key(ns, claim_pool_name(claim)), _request(claim))
            return Result(resolution.delay)
        try:
            sandbox, error, drop = await apply_resolution(
                snap,
                resolution,
                api=self.api,
                store=self.store,
                fresh=self.fresh,
                events=self.events,
                metrics=self.metrics,
            )
        except NamespaceTerminating as going:
            # As a ReplicaSet: the namespace is being deleted and the claim with it. No status, no Event,
            # no retry; an error line per pass would only flood the log until the claim is gone.
            log.debug("claim %s/%s: not creating a Sandbox: %s", ns, meta["name"], going.__cause__)
            return Result()

        new_status = compute_status(claim, sandbox, error, expired=step.expired, now=now)
        if new_status is None:
            return pass_result(step.time_left, step.expired, error, None)
        current = await self._ensure_intent(claim, sandbox, drop_reference=drop)
        if current is None:
            return Result()  # the claim is gone
        time_left = step.time_left
        if not step.expired:
            # A Finished condition mirrored just now may start a TTL: schedule it, or, if it is already
            # over, mark the claim expired in this very pass (§4.3 steps 12 and 15).
            late = expiry({**claim, "status": new_status}, now)
            time_left = late.time_left
            ready = find_condition(new_status.get("conditions"), c.CONDITION_READY) or {}
            if late.expired and ready.get("reason") != c.REASON_CLAIM_EXPIRED:
                expired_status = compute_status(claim, sandbox, error, expired=True, now=now)
                assert expired_status is not None
                written = await ex.write_status(self.api, current, expired_status)
                self._remember_claim(written)
                self._event(claim, c.EVENT_CLAIM_EXPIRED, "Claim Expired", "Claim expired")
                return Result(EXPIRED_REQUEUE)

        written = await ex.write_status(self.api, current, new_status)
        self._remember_claim(written)
        warning = invalid_reference_event(claim, error)
        if warning is not None and written.sent and written.authoritative:
            # Once per episode: the condition now stored is what the next pass compares against (a lost
            # write - 409 - emits nothing; the pass that lands it does).
            self._event(claim, warning[0], "Binding", warning[1], "Warning")
        metrics_error: Exception | None = None
        if written.authoritative:
            metrics_error = await self._finalize(claim, written.claim, new_status, sandbox)
        return pass_result(time_left, step.expired, error, metrics_error)

    def _sandbox(self, ns: str, name: str) -> Object | None:
        return sandbox_view(self.store, self.fresh, ns, name)

    async def _resolve_active(self, snap: Snapshot) -> Resolution:
        resolution = resolve(snap)
        if isinstance(resolution, NeedCandidate | Adopt):
            return await self.warm.resolve(snap, resolution)
        return resolution

    # ------------------------------------------------------------------ before the status write

    async def _ensure_intent(
        self,
        claim: Mapping[str, Any],
        sandbox: Mapping[str, Any] | None,
        *,
        drop_reference: bool = False,
    ) -> Mapping[str, Any] | None:
        """`intent.ensure_intent` with this reconciler's clients and settings."""
        return await ensure_intent(
            claim,
            sandbox,
            drop_reference=drop_reference,
            api=self.api,
            store=self.store,
            fresh=self.fresh,
            observed=self.observed,
            now=self.now,
            persist_observed=self.config.persist_observability,
            tracing=self.tracing,
        )

    async def _intent_for_candidate(self, claim: Mapping[str, Any], candidate: Mapping[str, Any]) -> None:
        """`WarmPath` hook: record the candidate on the claim while its takeover is in flight.

        Raises:
            ClaimGone: the claim was deleted meanwhile (its intent patch answered NotFound).
        """
        if await self._ensure_intent(claim, candidate) is None:
            raise ClaimGone(f'sandboxclaims "{claim["metadata"]["name"]}" not found')

    # ------------------------------------------------------------------ after the status write

    async def _finalize(
        self,
        before: Mapping[str, Any],
        stored: Mapping[str, Any],
        new_status: Mapping[str, Any],
        sandbox: Mapping[str, Any] | None,
    ) -> Exception | None:
        """Readiness metrics and the first-ready stamp (§4.13); returns a stamp failure, if any."""
        meta = stored["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        old_ready = is_ready(before)
        new_ready = is_ready({"status": new_status})
        ann = meta.get("annotations") or {}
        step = readiness_step(
            old_ready=old_ready,
            new_ready=new_ready,
            first_ready_stamped=bool(ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT)),
        )
        now = self.now()
        observed_at = first_observed(self.observed, stored, self.now)
        if step is ReadyStep.RECORD:
            self.metrics.record_ready(
                stored, sandbox, latencies(stored, sandbox, now=now, first_observed=observed_at)
            )
        if step is not ReadyStep.NOTHING:
            self.observed.drain(ns, name, uid)
        patch = decide_first_ready(stored, ready_step=step, now=now)
        if patch.empty:
            return None
        return await self._stamps.write(
            stored, patch, api=self.api, store=self.store, fresh=self.fresh, pressure=self.pressure
        )

    # ------------------------------------------------------------------ helpers

    async def _legacy_policy(self, claim: Mapping[str, Any]) -> None:
        """§4.3 step 2 (best effort): delete `<claim>-network-policy` if this claim controls it."""
        meta = claim["metadata"]
        policy = self.store.get(NETWORK_POLICY, meta["namespace"], f"{meta['name']}-network-policy")
        if legacy_policy_to_delete(claim, policy):
            assert policy is not None
            try:
                await ex.delete_policy(self.api, policy)
            except KubeError as exc:
                log.info("deleting legacy network policy failed: %s", describe_error(exc))

    def _remember_claim(self, written: ex.StatusWrite) -> None:
        if (
            written.sent
            and written.authoritative
            and written.claim.get("metadata", {}).get("resourceVersion")
        ):
            self.fresh.remember(SANDBOX_CLAIM, dict(written.claim))

    def _event(
        self, claim: Mapping[str, Any], reason: str, action: str, note: str, type_: EventType = "Normal"
    ) -> None:
        self.events.event(dict(claim), type_, reason, action, note)


def _request(claim: Mapping[str, Any]) -> Request:
    return Request(claim["metadata"]["namespace"], claim["metadata"]["name"])
