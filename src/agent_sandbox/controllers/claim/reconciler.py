"""SandboxClaim reconciler (controllers spec §4.3): observe -> decide -> execute, in three stages.

Per pass: read the claim and everything it refers to from the cache (plus our own not-yet-observed
writes, `store.Freshest`); `decide_expiry`; `resolve` the binding and execute its single write (warm
takeover via `warm.WarmPath`, cold create, or a repair of the bound Sandbox); make sure the claim carries
the metadata upstream has on it before its status names a Sandbox (`decide_claim_intent`: first-observed
time, assignment record); compute the status and write it (one guarded merge patch); then record the
latency metrics and stamp `claim-first-ready-at`.

Warm path write count (a Ready member, first pass): the claim's intent patch and the takeover patch, sent
together; then the status patch; then the first-ready stamp - four writes, two round trips before the
claim shows Ready. The intent patch always lands before the status write, because a CRD's `/status`
write ignores metadata: a client that sees the claim Ready reads its `sandbox-name` and
`controller-first-observed-at`, as with upstream (issue 11; docs/design/claim-priority.md).
docs/design/claim-adoption.md explains why the takeover itself needs no claim-side lock.

In the controller process (`detach_metadata_writes`) the first-ready stamp runs off the worker: the
worker is free after the status write, so under a slow API server a worker serves a claim in two round
trips instead of three (docs/performance.md). One stamp per claim is in flight at a time; a failure
re-enqueues the claim with backoff, and that pass backfills exactly as a failed synchronous stamp would.
A graceful stop sends the stamps still held before the Lease is released (`flush_held`); a stamp that
fails then, or whose retry pass never ran (the queue shuts down first), is lost and counted
(`unwritten`), so the manager's stop warning names it.

Result mapping (§4.3 step 16): pool/template missing -> requeue 1 min; cold-create cache lag -> 200 ms;
suppressed spec errors -> no retry; a cold create refused because the namespace is being deleted -> done,
no status (as a ReplicaSet); anything else -> raise (backoff).
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
    claim_sandbox_name,
    controlled_by,
    find_condition,
    is_ready,
    normalize_created_by,
    parse_time,
    pool_key,
    pool_template_name,
    sandbox_pool_name,
    upsert_condition,
)
from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX,
    SANDBOX_CLAIM,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    AlreadyExists,
    Client,
    EventSink,
    EventType,
    KubeError,
    NotFound,
    Object,
    Reader,
    Request,
    ResourceKind,
    Result,
    RetryLater,
    Tracing,
)
from agent_sandbox.kube.errors import is_namespace_terminating

from ..claim_pressure import ClaimPressure
from ..indexes import INDEX_SANDBOX_CLAIM_UID
from . import execute as ex
from .adoption import (
    is_adoptable,
)
from .decide import (
    Adopt,
    Bound,
    Create,
    DeleteClaim,
    Failed,
    MarkExpired,
    NeedCandidate,
    Pending,
    Resolution,
    SandboxWrite,
    Snapshot,
    assigned_name,
    decide_claim_intent,
    decide_expiry,
    decide_first_ready,
    legacy_policy_to_delete,
    resolve,
    resolve_expired,
)
from .errors import (
    ClaimError,
    ReconcilerError,
    SandboxCreatePending,
    TemplateNotFound,
    WarmPoolNotFound,
)
from .observability import ClaimMetrics, ObservedTimes, ReadyStep, latencies, readiness_step, template_of
from .queue import WarmQueue
from .status import compute_status, expiry, status_equal
from .store import Freshest, Store
from .warm import WarmPath

__all__ = ["ClaimConfig", "ClaimReconciler", "ClaimRetry"]

log = logging.getLogger("agent_sandbox.controllers.claim")

REPORTER = "sandboxclaim-controller"
_MISSING_REQUEUE = 60.0
_CREATE_PENDING_REQUEUE = 0.2
_EXPIRED_REQUEUE = 0.001


class ClaimRetry(RetryLater):
    """A claim error that must be retried with backoff (wraps the `ClaimError`)."""


class _NamespaceTerminating(Exception):
    """The cold create was refused because the claim's namespace is being deleted (`__cause__`)."""


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
        self._retry: Callable[[Request], None] | None = None
        self._stamping: dict[str, asyncio.Task[None]] = {}  # claim UID -> its in-flight metadata patch
        # Claims whose detached stamp failed and whose retry pass has not run yet: the controller's queue
        # drops the retry once it shuts down (or the stop outlasts its backoff), so a stop counts them.
        self._unstamped: set[Request] = set()

    def detach_metadata_writes(self, retry: Callable[[Request], None]) -> None:
        """Send the post-Ready claim metadata patch from a background task instead of the worker.

        `retry` re-enqueues a claim with backoff (the controller's `queue.add_rate_limited`); it is called
        when a detached patch fails. Without this call the patch is awaited in the pass (unit tests).
        """
        self._retry = retry

    def held_writes(self) -> dict[str, int]:
        """`claim_pressure.HoldsWrites`: detached first-ready stamps not yet sent (most held behind claims)."""
        return {"claim_stamp": len(self._stamping)}

    async def flush_held(self) -> None:
        """`claim_pressure.FlushesHeldWrites`: return once every detached stamp is done.

        Called on a graceful stop after `ClaimPressure.stop` ended their wait, while this process still
        holds the Lease: a successor would find these claims Ready without a stamp and write `unknown`.
        """
        while pending := [t for t in self._stamping.values() if not t.done()]:
            await asyncio.wait(pending)

    def unwritten(self) -> dict[str, int]:
        """`claim_pressure.FlushesHeldWrites`: stamps in flight, plus failed ones no pass has retried yet."""
        return {"claim_stamp": len(self._stamping) + len(self._unstamped)}

    # ------------------------------------------------------------------ entry

    async def reconcile(self, request: Request) -> Result:
        self._unstamped.discard(request)  # the retry of a failed stamp: this pass backfills it if need be
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
            return Result(_EXPIRED_REQUEUE)
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

        snap = await self._observe(claim, now)
        if step.expired:
            resolution: Resolution = resolve_expired(snap)
        else:
            resolution = await self._resolve_active(snap)
        if isinstance(resolution, Pending):
            # No status write: the claim is only waiting for a member's Pod IP (≤ 2 s); a member getting
            # networked wakes it sooner than the timer.
            self.queue.wait(pool_key(ns, claim_pool_name(claim)), _request(claim))
            return Result(resolution.delay)
        try:
            sandbox, error, drop = await self._apply(snap, resolution)
        except _NamespaceTerminating as going:
            # As a ReplicaSet: the namespace is being deleted and the claim with it. No status, no Event,
            # no retry; an error line per pass would only flood the log until the claim is gone.
            log.debug("claim %s/%s: not creating a Sandbox: %s", ns, meta["name"], going.__cause__)
            return Result()

        new_status = compute_status(claim, sandbox, error, expired=step.expired, now=now)
        if new_status is None:
            return self._result(step.time_left, step.expired, error, None)
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
                return Result(_EXPIRED_REQUEUE)

        written = await ex.write_status(self.api, current, new_status)
        self._remember_claim(written)
        metrics_error: Exception | None = None
        if written.authoritative:
            metrics_error = await self._finalize(claim, written.claim, new_status, sandbox)
        return self._result(time_left, step.expired, error, metrics_error)

    # ------------------------------------------------------------------ observe

    async def _observe(self, claim: Mapping[str, Any], now: datetime) -> Snapshot:
        meta = claim["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        status_name = claim_sandbox_name(claim)
        assigned, _ = assigned_name(claim)
        owned = {
            o["metadata"]["name"]: o for o in self.store.by_index(SANDBOX, INDEX_SANDBOX_CLAIM_UID, uid, ns)
        }
        for sname in self.fresh.bound_to(uid):
            view = self._sandbox(ns, sname)
            if controlled_by(view, SANDBOX_CLAIM, uid):
                assert view is not None
                owned[sname] = view
        uncertain = self.fresh.take_uncertain(uid)
        if uncertain and uncertain not in owned:
            # A takeover ended without an answer: ask the API server whether it applied.
            try:
                fresh = await self.authoritative.get(SANDBOX, uncertain, namespace=ns)
            except NotFound:
                fresh = None
            if controlled_by(fresh, SANDBOX_CLAIM, uid):
                assert fresh is not None
                self.fresh.remember(SANDBOX, fresh)
                owned[uncertain] = fresh
            elif fresh is not None and is_adoptable(fresh):
                # It did not apply: the member is still free, give it back to its queue.
                node = (fresh.get("status") or {}).get("nodeName") or ""
                self.queue.add(pool_key(ns, sandbox_pool_name(fresh) or ""), uncertain, node)
        owned = {k: (self._sandbox(ns, k) or v) for k, v in owned.items()}
        pool_name = claim_pool_name(claim)
        pool = self.store.get(SANDBOX_WARM_POOL, ns, pool_name) if pool_name else None
        if pool_name and pool is None:
            pool = await self._uncached(SANDBOX_WARM_POOL, ns, pool_name)
        template_name = pool_template_name(pool) if pool is not None else ""
        template = self.store.get(SANDBOX_TEMPLATE, ns, template_name) if template_name else None
        if template_name and template is None:
            template = await self._uncached(SANDBOX_TEMPLATE, ns, template_name)
        return Snapshot(
            claim=claim,
            now=now,
            status_sandbox=self._sandbox(ns, status_name) if status_name else None,
            assigned=self._sandbox(ns, assigned) if assigned else None,
            owned=tuple(owned.values()),
            same_name=self._sandbox(ns, meta["name"]),
            pool=pool,
            template=template,
            allowed_domains=self.config.allowed_label_domains,
        )

    def _sandbox(self, ns: str, name: str) -> Object | None:
        return self.fresh.view(SANDBOX, ns, name, self.store.get(SANDBOX, ns, name))

    async def _uncached(self, kind: ResourceKind, ns: str, name: str) -> Object | None:
        """A pool or template the cache lacks, asked of the API server before the claim is told it is missing.

        A claim POSTed right after its pool and template can reach this controller before their watch events
        do; `WarmPoolNotFound` / `TemplateNotFound` would then be a false terminal condition (clients stop
        waiting on it). One uncached GET, only on this miss path; None when it really is not there, or when
        no object can have that name (`_nameable`: asking would only get a 400 and retry it forever).
        """
        if not _nameable(name):
            return None
        try:
            return await self.authoritative.get(kind, name, namespace=ns)
        except NotFound:
            return None

    # ------------------------------------------------------------------ resolve (warm / cold)

    async def _resolve_active(self, snap: Snapshot) -> Resolution:
        resolution = resolve(snap)
        if isinstance(resolution, NeedCandidate | Adopt):
            return await self.warm.resolve(snap, resolution)
        return resolution

    # ------------------------------------------------------------------ apply the resolution

    async def _apply(
        self, snap: Snapshot, resolution: Resolution
    ) -> tuple[Object | Mapping[str, Any] | None, ClaimError | None, bool]:
        """Execute the resolution's write(s); returns (bound Sandbox, error for status, drop_reference)."""
        claim = snap.claim
        ns = claim["metadata"]["namespace"]
        if isinstance(resolution, Create):
            try:
                created = await ex.create_sandbox(self.api, resolution.body)
            except AlreadyExists:
                return None, SandboxCreatePending(), resolution.drop_reference
            except KubeError as exc:
                if is_namespace_terminating(exc):
                    raise _NamespaceTerminating from exc
                # Ours (upstream says it only in Ready): a ReplicaSet's `FailedCreate` Warning, so `kubectl
                # describe sandboxclaim` says why no Sandbox appears (quota, admission, validation).
                self._event(
                    claim, c.EVENT_FAILED_CREATE, "Creating", f"sandbox create error: {exc}", "Warning"
                )
                return None, ReconcilerError(f"sandbox create error: {exc}"), resolution.drop_reference
            self.fresh.remember(SANDBOX, created)
            self.fresh.bind(claim["metadata"]["uid"], created["metadata"]["name"])
            self._event(
                claim,
                c.EVENT_SANDBOX_PROVISIONED,
                "Provisioning",
                f'Created Sandbox "{created["metadata"]["name"]}"',
            )
            self.metrics.count_creation(
                claim,
                created,
                launch_type=c.LAUNCH_TYPE_COLD,
                pool=claim_pool_name(claim),
                ready=False,
                template=template_of(created),
            )
            return created, None, resolution.drop_reference
        if isinstance(resolution, Failed):
            return None, resolution.error, resolution.drop_reference
        if isinstance(resolution, Bound):
            sandbox: Mapping[str, Any] = resolution.sandbox
            error = resolution.error
            for write in resolution.writes:
                error = await self._sandbox_write(ns, write, error)
                if write.patch is not None and write.name == sandbox["metadata"]["name"]:
                    sandbox = self._sandbox(ns, write.name) or sandbox
            return sandbox, error, resolution.drop_reference
        raise AssertionError(f"unexpected resolution {resolution!r}")  # NeedCandidate/Adopt/Pending handled

    async def _sandbox_write(
        self, ns: str, write: SandboxWrite, error: ClaimError | None
    ) -> ClaimError | None:
        try:
            if write.delete_uid is not None:
                await ex.delete_sandbox(self.api, ns, write.name, write.delete_uid)
            elif write.patch is not None:
                self.fresh.remember(SANDBOX, await ex.patch_sandbox(self.api, ns, write.name, write.patch))
        except KubeError as exc:
            # The binding stays (status keeps the Sandbox); the error shows and is retried.
            return error or ReconcilerError(f'failed to update sandbox "{write.name}": {exc}')
        return error

    # ------------------------------------------------------------------ before the status write

    async def _ensure_intent(
        self,
        claim: Mapping[str, Any],
        sandbox: Mapping[str, Any] | None,
        *,
        drop_reference: bool = False,
    ) -> Mapping[str, Any] | None:
        """Write the claim's intent metadata (`decide_claim_intent`) unless it is there; never deferred.

        Returns the claim to base the status write on: the patch's answer while it carries the status this
        pass decided from (so the status write's resourceVersion guard still catches anyone else's status
        write), else `claim`. None: the claim is gone.
        """
        meta = claim["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        view = self.fresh.view(SANDBOX_CLAIM, ns, name, self.store.get(SANDBOX_CLAIM, ns, name))
        if view is None or view["metadata"].get("uid") != uid:
            view = dict(claim)
        patch = decide_claim_intent(
            view,
            sandbox=sandbox,
            first_observed=self._first_observed(view),
            persist_observed=self.config.persist_observability,
            trace_context=self.tracing.current_context_annotation() if self.tracing.enabled else "",
            drop_reference=drop_reference,
        )
        if not patch.empty:
            body = patch.body()
            body["metadata"]["uid"] = uid  # never lands on a recreated claim of the same name (422)
            updated = await ex.patch_claim_metadata(self.api, view, body)
            if updated is None:
                return None
            self.fresh.remember(SANDBOX_CLAIM, updated)
            view = updated
        if view is claim or not status_equal(view.get("status") or {}, claim.get("status") or {}):
            return claim
        return view

    async def _intent_for_candidate(self, claim: Mapping[str, Any], candidate: Mapping[str, Any]) -> None:
        """`WarmPath` hook: record the candidate on the claim while its takeover is in flight."""
        if await self._ensure_intent(claim, candidate) is None:
            raise NotFound(404, "NotFound", f'sandboxclaims "{claim["metadata"]["name"]}" not found')

    def _first_observed(self, claim: Mapping[str, Any]) -> datetime:
        meta = claim["metadata"]
        ann = meta.get("annotations") or {}
        return (
            self.observed.get(meta["namespace"], meta["name"], meta["uid"])
            or parse_time(ann.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT))
            or self.now()
        )

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
        first_observed = self._first_observed(stored)
        if step is ReadyStep.RECORD:
            self.metrics.record_ready(
                stored, sandbox, latencies(stored, sandbox, now=now, first_observed=first_observed)
            )
        if step is not ReadyStep.NOTHING:
            self.observed.drain(ns, name, uid)
        patch = decide_first_ready(stored, ready_step=step, now=now)
        if patch.empty:
            return None
        if self._retry is not None:
            if uid not in self._stamping:  # else: the write in flight carries it; its event re-runs us
                # The UID makes a stamp that waited (claim pressure) fail on a deleted-and-recreated claim
                # (422 "field is immutable") instead of stamping the new one; its retry pass settles it.
                body = patch.body()
                body["metadata"]["uid"] = uid
                task = asyncio.create_task(self._detached_stamp(stored, body, Request(ns, name)))
                self._stamping[uid] = task
            return None
        try:
            updated = await ex.patch_claim_metadata(self.api, stored, patch.body())
        except KubeError as exc:
            return exc
        if updated is not None:
            self.fresh.remember(SANDBOX_CLAIM, updated)
        return None

    async def _detached_stamp(
        self, stored: Mapping[str, Any], body: Mapping[str, Any], request: Request
    ) -> None:
        uid = stored["metadata"]["uid"]
        failed: KubeError | None = None
        # Bookkeeping only (the claim is Ready already): let claims still arriving have the API server first.
        await self.pressure.wait_calm(self.pressure.hold)
        current = self.store.get(SANDBOX_CLAIM, request.namespace, request.name)
        if (
            current is None
            or current["metadata"].get("uid") != uid
            or current["metadata"].get("deletionTimestamp")
        ):
            # Deleted while the stamp waited (short-lived claims often are): nothing left to stamp.
            self._stamping.pop(uid, None)
            return
        try:
            updated = await ex.patch_claim_metadata(self.api, stored, body)
            if updated is not None:
                self.fresh.remember(SANDBOX_CLAIM, updated)
        except KubeError as exc:
            failed = exc
        finally:
            self._stamping.pop(uid, None)
        if failed is not None and self._retry is not None:
            self._unstamped.add(request)
            if self.pressure.stopped:
                # The graceful stop's flush: the controller's queue is shut down, a retry would vanish.
                log.info(
                    "claim %s/%s: first-ready stamp failed while stopping, not retried: %s",
                    request.namespace,
                    request.name,
                    describe_error(failed),
                )
                return
            log.info(
                "claim %s/%s: metadata write failed, retrying: %s", request.namespace, request.name, failed
            )
            self._retry(request)

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

    @staticmethod
    def _result(
        time_left: float | None, expired: bool, error: ClaimError | None, metrics_error: Exception | None
    ) -> Result:
        requeue = max(time_left, _EXPIRED_REQUEUE) if (time_left is not None and not expired) else None
        if isinstance(error, WarmPoolNotFound | TemplateNotFound):
            if metrics_error is not None:
                log.info("claim metadata write failed: %s", metrics_error)
            return Result(min(_MISSING_REQUEUE, requeue) if requeue else _MISSING_REQUEUE)
        if isinstance(error, SandboxCreatePending):
            return Result(min(_CREATE_PENDING_REQUEUE, requeue) if requeue else _CREATE_PENDING_REQUEUE)
        if error is not None and not error.suppressed:
            raise ClaimRetry(f"{error.reason}: {error}") from error
        if metrics_error is not None:
            raise metrics_error
        return Result(requeue)


def _nameable(name: str) -> bool:
    """Whether an object could have `name` as far as a GET by name goes: a valid URL path segment.

    kube-apiserver refuses a GET whose name is ".", ".." or contains "/" or "%" (apimachinery's
    `IsValidPathSegmentName`) with 400 BadRequest before any lookup, and no object is ever created with
    such a name. A claim's `warmPoolRef` and a pool's `sandboxTemplateRef` are free text, so these names
    are "not found" (WarmPoolNotFound / TemplateNotFound, as upstream's cached lookup reports them), known
    without a request. Other invalid names ("Bad_Name") the server answers with an ordinary 404.
    """
    return name not in (".", "..") and "/" not in name and "%" not in name


def _request(claim: Mapping[str, Any]) -> Request:
    return Request(claim["metadata"]["namespace"], claim["metadata"]["name"])
