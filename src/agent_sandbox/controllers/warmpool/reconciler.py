"""SandboxWarmPool reconciler (controllers spec §3.2-§3.3): observe -> decide -> gate -> execute.

1. observe: the pool, its members (index on the pool label), the template, the Pods of members that are
   past their grace period and not Ready, and which members have a deletion in flight - all from caches.
2. decide (`decide.py`, pure): clean-up actions, status, create/delete intents.
3. execute, in the order of §3.3: clean-up deletes and updates (never gated); the create intent through
   the replenish hold, the refill bucket and the expectations gate (`try_expect_creations`, atomic on
   the event loop, so overlapping passes can never both create); the excess deletes only when
   expectations are satisfied; the not-progressing events and (ours) the missing-template ones; the
   post-grace requeue.
4. Any failure is raised after all of that, *without* the status write (§3.2 step 4; a refused member
   create is also a Warning `FailedCreate` Event on the pool, ours: warmpool-quirks.md); otherwise the
   status subresource is merge-patched when it changed (NotFound: the pool was deleted mid-pass, done),
   and the smallest requested delay is returned.

In-memory state (expectations, hold, buckets, progress) is per pool and forgotten when the pool is
gone or being deleted.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.api.meta import is_ready, pool_key, pool_template_name, sandbox_pod_name
from agent_sandbox.kube import (
    POD,
    SANDBOX,
    SANDBOX_TEMPLATE,
    SANDBOX_WARM_POOL,
    Clock,
    EventSink,
    Expectations,
    NotFound,
    NullEventRecorder,
    Object,
    RealClock,
    Request,
    Result,
    RetryLater,
    error_text,
)

from ..claim_pressure import ClaimPressure
from ..indexes import INDEX_SANDBOX_WARM_POOL
from .config import EXPECTATIONS_PENDING_REQUEUE, WarmPoolConfig
from .decide import PoolPlan, PoolSnapshot, created_at, decide
from .execute import PoolClient, create_members, delete_excess, delete_members, patch_members
from .members import go_duration
from .shaping import ClaimYield, MissingTemplates, ProgressTracker, RefillBuckets, ReplenishHold

__all__ = ["TemplateLookupError", "WarmPoolReconciler"]

log = logging.getLogger("agent_sandbox.controllers.warmpool")

_KNOWN_STRATEGIES = frozenset(t.value for t in c.UpdateStrategyType)


class TemplateLookupError(RetryLater):
    """The pool's template could not be read for a reason other than NotFound."""


class WarmPoolReconciler:
    """Keeps every SandboxWarmPool at `spec.replicas` members built from its template."""

    def __init__(
        self,
        client: PoolClient,
        *,
        config: WarmPoolConfig | None = None,
        expectations: Expectations | None = None,
        events: EventSink | None = None,
        clock: Clock | None = None,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        pressure: ClaimPressure | None = None,
    ) -> None:
        """Create the reconciler.

        Args:
            client: reads from the informer cache (with the pool-label index), writes to the API.
            config: tunables (flags); defaults are upstream's.
            expectations: shared with the Sandbox watch handler, which lowers it (see `watches.py`).
            events: recorder reporting as `sandboxwarmpool-controller`.
            clock: monotonic time for the hold and the refill bucket.
            wall_clock: epoch seconds, compared with members' creationTimestamps.
            rng: jitter source in [0, 1).
            pressure: claim arrivals; refill (`shaping.ClaimYield`) and passes yield to them (None: never).
        """
        clock = clock or RealClock()
        self.client = client
        self.config = config or WarmPoolConfig()
        self.expectations = expectations or Expectations(clock=clock)
        self.events = events or NullEventRecorder()
        self._clock = clock
        self._wall = wall_clock
        self._rng = rng
        self.hold = ReplenishHold(self.config.replenish_delay)
        self.claim_yield = ClaimYield(pressure or ClaimPressure(0.0))
        self.buckets = RefillBuckets(self.config.max_refill_rate)
        self.progress = ProgressTracker()
        self.missing_templates = MissingTemplates()

    def held_writes(self) -> dict[str, int]:
        """`claim_pressure.HoldsWrites`: pools whose refill waits behind claims."""
        return {"pool_refill": len(self.claim_yield.held())}

    def forget(self, key: str) -> None:
        """Drop every per-pool record (pool deleted or being deleted)."""
        self.expectations.forget(key)
        self.hold.forget(key)
        self.claim_yield.forget(key)
        self.buckets.forget(key)
        self.progress.forget(key)
        self.missing_templates.forget(key)

    # ------------------------------------------------------------------ observe

    async def observe(self, pool: Object, key: str, now: float) -> PoolSnapshot:
        """Everything `decide` needs, read from the caches."""
        meta = pool["metadata"]
        ns = meta["namespace"]
        members = tuple(
            await self.client.list_by_index(
                SANDBOX, INDEX_SANDBOX_WARM_POOL, naming.name_hash(meta["name"]), namespace=ns
            )
        )
        template: Object | None = None
        missing, error = False, None
        try:
            template = await self.client.get(SANDBOX_TEMPLATE, pool_template_name(pool), namespace=ns)
        except NotFound:
            missing = True
        except Exception as exc:
            error = f"failed to get sandbox template {pool_template_name(pool)!r}: {exc}"
        grace = self.config.readiness_grace_period
        pods: dict[str, Object] = {}
        pending: set[str] = set()
        for sb in members:
            uid = sb["metadata"].get("uid", "")
            if self.expectations.is_pending_deletion(key, uid):
                pending.add(uid)
            created = created_at(sb)
            # Only members past their grace period need their Pod looked at (§3.5).
            if created is not None and now - created > grace and not is_ready(sb):
                name = sandbox_pod_name(sb)
                with contextlib.suppress(NotFound):
                    pods[name] = await self.client.get(POD, name, namespace=ns)
        return PoolSnapshot(pool, members, template, missing, error, pods, frozenset(pending))

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, request: Request) -> Result:
        key = pool_key(request.namespace, request.name)
        try:
            pool = await self.client.get(SANDBOX_WARM_POOL, request.name, namespace=request.namespace)
        except NotFound:
            self.forget(key)
            return Result()
        if pool["metadata"].get("deletionTimestamp"):
            self.forget(key)  # members go away by garbage collection
            return Result()
        strategy = ((pool.get("spec") or {}).get("updateStrategy") or {}).get("type")
        if strategy and strategy not in _KNOWN_STRATEGIES:
            log.info("pool %s: unknown update strategy %r, using OnReplenish", key, strategy)
        throttled = self.claim_yield.pass_wait(key)
        if throttled > 0:
            return Result(requeue_after=throttled)  # claims are arriving: coalesce member events
        self.claim_yield.passed(key)
        now = self._wall()
        plan = decide(await self.observe(pool, key, now), now, self.config)
        return await self.execute(pool, key, plan)

    async def execute(self, pool: Object, key: str, plan: PoolPlan) -> Result:
        """Apply `plan` through the gates; raise the first failure, else write status and return the delay."""
        ns = pool["metadata"]["namespace"]
        exp = self.expectations
        errors: list[BaseException] = []
        delays: list[float] = []
        if plan.gc:
            errors += await delete_members(self.client, exp, key, ns, plan.gc)
        if plan.updates:
            errors += await patch_members(self.client, ns, plan.updates)

        now = self._clock.now()
        hold = self.hold.observe(key, plan.current, plan.desired, now)
        ready = int(plan.status.get("readyReplicas") or 0)
        claim_wait, cap = self.claim_yield.observe(
            key, current=plan.current, ready=ready, desired=plan.desired
        )
        hold = max(hold, claim_wait)
        if hold > 0 and plan.current < plan.desired and plan.template_ok:
            delays.append(hold)  # members just left (claims): let that burst have the API first
        elif plan.create is not None and cap != 0:
            want = plan.create.want if cap is None else min(plan.create.want, cap)
            granted, token_wait = self.buckets.take(key, want, now)
            if granted == 0:
                delays.append(token_wait)
            elif not exp.try_expect_creations(key, granted):
                # Earlier creates/deletes are not in the cache yet: this count may be stale.
                self.buckets.refund(key, granted)
                delays.append(EXPECTATIONS_PENDING_REQUEUE)
            else:
                created, err = await create_members(self.client, exp, key, ns, plan.create.body, granted)
                self.hold.note_creates(key, created)
                self.claim_yield.note_created(key, created)
                if err is not None:
                    errors.append(err)
                    # Ours (upstream says it only in its log): a ReplicaSet's `FailedCreate` Warning, so
                    # `kubectl describe sandboxwarmpool` says why members are missing (quota, admission,
                    # validation); repeats aggregate into the event's series. A refusal because the
                    # namespace is being deleted is no error (`create_members` returns None): no event.
                    note = f"failed to create sandbox: {error_text(err)}"
                    self.events.event(pool, "Warning", c.EVENT_FAILED_CREATE, "Creating", note)
            next_due = self.claim_yield.next_due(key)
            if next_due > 0:
                delays.append(next_due)  # further replacements are held behind the claims

        if plan.excess:
            if not exp.satisfied(key):
                delays.append(EXPECTATIONS_PENDING_REQUEUE)  # a stale list could show a phantom surplus
            else:
                err = await delete_excess(self.client, exp, key, ns, plan.excess)
                if err is not None:
                    errors.append(err)

        self._signal_progress(pool, key, plan, delays)
        self._signal_template(pool, key, plan)
        if plan.grace_requeue > 0:
            jitter = self.config.grace_jitter
            delays.append(
                plan.grace_requeue * (1 + self._rng() * jitter) if jitter > 0 else plan.grace_requeue
            )
        if plan.template_error is not None:
            errors.append(TemplateLookupError(plan.template_error))

        if errors:
            if len(errors) > 1:
                log.error(
                    "pool %s: %d errors, first retried: %s", key, len(errors), "; ".join(map(str, errors))
                )
            raise errors[0]
        if plan.status_changed:
            # Never held behind claims (issue 11): a client must see `readyReplicas` drop when a claim takes
            # a member, before its replacement is Ready, as with upstream. While claims arrive, passes (and
            # so these writes) are at most one per PASS_INTERVAL_WHILE_HOT.
            try:
                await self.client.patch_status(
                    SANDBOX_WARM_POOL, pool["metadata"]["name"], {"status": plan.status}, namespace=ns
                )
            except NotFound:
                # Deleted during the pass (by a user, or with its namespace): as if the pass had not found
                # it. Members go by garbage collection; an error would only retry a pool that is gone.
                self.forget(key)
                return Result()
        positive = [d for d in delays if d > 0]
        return Result(requeue_after=min(positive)) if positive else Result()

    def _signal_progress(self, pool: Object, key: str, plan: PoolPlan, delays: list[float]) -> None:
        """Events on entering/leaving the not-progressing state (§3.10); recheck while holding."""
        if plan.unschedulable > 0:
            delays.append(self.config.unschedulable_recheck_interval)
            if self.progress.set(key, True):
                note = (
                    f"{plan.unschedulable}/{plan.desired} sandboxes are unschedulable past the "
                    f"{go_duration(self.config.readiness_grace_period)} readiness grace period; holding them "
                    "instead of replacing (replacements would be equally unschedulable)"
                )
                self.events.event(pool, "Warning", c.EVENT_WARM_POOL_NOT_PROGRESSING, "Reconciling", note)
        elif self.progress.set(key, False):
            self.events.event(
                pool, "Normal", c.EVENT_WARM_POOL_PROGRESSING, "Reconciling", "Warm pool is progressing again"
            )

    def _signal_template(self, pool: Object, key: str, plan: PoolPlan) -> None:
        """Ours: a Warning when the pool starts waiting for a template that does not exist, a Normal one
        when it shows up (warmpool-quirks.md). A missing template is no error (§3.3 step 12, the template
        watch re-triggers the pool), and the schema has no conditions: without these the pool just sits at
        zero replicas and says nothing. Once per episode (in memory: a restart may say it once more)."""
        template = pool_template_name(pool)
        ns, uid = pool["metadata"]["namespace"], str(pool["metadata"].get("uid", ""))
        if plan.template_missing:
            if self.missing_templates.missing(key, template, uid=uid):
                note = (
                    f'SandboxTemplate "{template}" not found in namespace "{ns}"; '
                    "no sandboxes are created until it exists"
                )
                log.info("pool %s: %s", key, note)
                self.events.event(pool, "Warning", c.EVENT_SANDBOX_TEMPLATE_NOT_FOUND, "Reconciling", note)
        elif plan.template_ok:
            waited = self.missing_templates.found(key, uid=uid)
            if waited is not None:
                note = f'SandboxTemplate "{template}" found in namespace "{ns}"'
                log.info("pool %s: %s", key, note)
                self.events.event(pool, "Normal", c.EVENT_SANDBOX_TEMPLATE_FOUND, "Reconciling", note)
