"""The warm half of claim resolution: take a candidate from the queue and take it over (spec §4.5.2, §4.6).

Owns the loop around the single guarded write of a warm claim: `WarmQueue.take` (atomic pick + reservation,
judged by `adoption.judge_candidate`), the takeover JSON patch, and the settling of a takeover whose guard
failed or that got no answer:

| takeover result | meaning | action |
|---|---|---|
| 200 | ours | drop the key, remember the response, bind, Event, counter |
| 422 / 404 / 409 | our view was stale; the patch did not apply | authoritative GET: ours -> done without a write; still a free member of our pool -> one retry on the fresh object; otherwise drop the key and take the next candidate |
| no answer (timeout, transport) | unknown | keep the key out of the queue, mark the claim "uncertain" (the next pass reads first), raise |

After `attempts` lost candidates the pass reports `AdoptionConflict` (backoff). Decisions stay in
`decide.resolve`; this module only sequences the calls.

`before_takeover` (the reconciler's claim intent patch: `sandbox-name` = the candidate, first-observed time)
runs concurrently with each candidate's takeover and is awaited before the outcome is returned, so the
claim's status - written after this returns - never names a Sandbox the claim's metadata does not.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import claim_pool_name, is_ready, pool_update_strategy, sandbox_pool_name
from agent_sandbox.kube import (
    SANDBOX,
    Client,
    Conflict,
    EventSink,
    Invalid,
    KubeError,
    NotFound,
    Object,
    Reader,
)

from ..blueprint import blueprint_hash
from . import execute as ex
from .adoption import (
    Contest,
    RecreateGuard,
    adoption_patch,
    judge_candidate,
    settle_contest,
)
from .decide import Adopt, Failed, NeedCandidate, Resolution, Snapshot, bound_to_sandbox, resolve
from .errors import AdoptionConflict, ClaimError
from .observability import ClaimMetrics, template_of
from .queue import WarmQueue
from .store import Freshest

__all__ = ["WarmPath"]


class WarmPath:
    """Warm candidate selection and takeover for one controller; see the module docstring."""

    def __init__(
        self,
        *,
        api: Client,
        authoritative: Reader,
        queue: WarmQueue,
        fresh: Freshest,
        events: EventSink,
        metrics: ClaimMetrics,
        sandbox: Callable[[str, str], Object | None],
        attempts: int = 3,
        before_takeover: Callable[[Mapping[str, Any], Mapping[str, Any]], Awaitable[None]] | None = None,
    ) -> None:
        """Args:
        sandbox: the freshest view of a Sandbox by (namespace, name) (cache + our own writes).
        attempts: candidates tried per pass before reporting AdoptionConflict.
        before_takeover: `(claim, candidate)` write sent alongside each takeover (module docstring).
        """
        self.api = api
        self.authoritative = authoritative
        self.queue = queue
        self.fresh = fresh
        self.events = events
        self.metrics = metrics
        self._sandbox = sandbox
        self.attempts = attempts
        self.before_takeover = before_takeover
        self._hashes: dict[tuple[str, str], str] = {}

    async def resolve(self, snap: Snapshot, first: NeedCandidate | Adopt) -> Resolution:
        """Take candidates until one is ours (or none is left): the bound result, or what to do instead.

        `first` is `NeedCandidate` (take from the queue) or `Adopt` (an assignment record names a member).
        """
        step: Resolution = first
        queue_name = first.queue if isinstance(first, NeedCandidate) else ""
        for _ in range(self.attempts):
            taken: str | None = None
            if isinstance(step, NeedCandidate):
                queue_name = step.queue
                take = self.queue.take(queue_name, self._judge(snap))
                taken = take.name
                candidate = self._sandbox(snap.claim["metadata"]["namespace"], taken) if taken else None
                snap = replace(snap, warm_consulted=True, candidate=candidate, pending=take.pending)
                step = resolve(snap)
            if not isinstance(step, Adopt):
                if taken:  # e.g. a metadata conflict: the candidate stays available to others
                    self.queue.release(queue_name, taken, requeue=True)
                return step
            outcome = await self._take_over(snap, step, queue_name)
            if outcome is not None:
                return outcome
            # Lost the candidate to someone else: the patch did not apply, so trying another is safe.
            step = NeedCandidate(queue_name, drop_reference=step.drop_reference)
            snap = replace(snap, warm_consulted=False, candidate=None, pending=0)
        return Failed(
            AdoptionConflict(f"warm pool candidates kept changing hands ({self.attempts} attempts)")
        )

    def _judge(self, snap: Snapshot) -> Callable[[str], Any]:
        claim = snap.claim
        ns = claim["metadata"]["namespace"]
        pool_name = claim_pool_name(claim)
        recreate: RecreateGuard | None = None
        unresolved = snap.pool is None
        if snap.pool is not None and pool_update_strategy(snap.pool) == c.UpdateStrategyType.RECREATE:
            if snap.template is None:
                unresolved = True
            else:
                recreate = RecreateGuard(snap.template.get("spec") or {}, self._blueprint_hash(snap.template))

        def judge(name: str) -> Any:
            return judge_candidate(
                self._sandbox(ns, name),
                namespace=ns,
                pool_name=pool_name,
                recreate=recreate,
                recreate_unresolved=unresolved,
            )

        return judge

    def _blueprint_hash(self, template: Mapping[str, Any]) -> str:
        key = (template["metadata"].get("uid", ""), template["metadata"].get("resourceVersion", ""))
        value = self._hashes.get(key)
        if value is None:
            if len(self._hashes) > 256:
                self._hashes.clear()
            value = self._hashes[key] = blueprint_hash(template.get("spec") or {})
        return value

    async def _take_over(self, snap: Snapshot, adopt: Adopt, queue_name: str) -> Resolution | None:
        """Run one candidate's takeover to a verdict, with `before_takeover` alongside it."""
        if self.before_takeover is None:
            return await self._take_over_alone(snap, adopt, queue_name)
        intent = asyncio.ensure_future(self.before_takeover(snap.claim, adopt.sandbox))
        try:
            outcome = await self._take_over_alone(snap, adopt, queue_name)
        except BaseException:
            intent.cancel()  # the pass fails anyway; whether the intent landed does not matter
            with contextlib.suppress(BaseException):
                await intent
            raise
        # A failed intent fails the pass: a won takeover is remembered (`Freshest.bind`), so the retry
        # finds the Sandbox by ownership and writes the intent again before any status. A claim deleted
        # meanwhile (`intent.ClaimGone`) ends the pass in the reconciler, quietly.
        await intent
        return outcome

    async def _take_over_alone(self, snap: Snapshot, adopt: Adopt, queue_name: str) -> Resolution | None:
        """Run one candidate's takeover to a verdict: the bound result, or None when it was lost."""
        claim = snap.claim
        cmeta = claim["metadata"]
        candidate, ops = adopt.sandbox, adopt.ops
        name = candidate["metadata"]["name"]
        for _ in range(2):  # the first try, plus one retry on a fresh object if our view was stale
            try:
                adopted = await ex.take_over(self.api, candidate, ops)
                break
            except (Invalid, NotFound, Conflict):
                try:
                    fresh: Object | None = await self.authoritative.get(
                        SANDBOX, name, namespace=cmeta["namespace"]
                    )
                except NotFound:
                    fresh = None
                except KubeError:
                    self.queue.release(queue_name, name, requeue=True)
                    raise
                verdict = settle_contest(
                    fresh,
                    claim_uid=cmeta["uid"],
                    namespace=cmeta["namespace"],
                    pool_name=claim_pool_name(claim),
                )
                if verdict is Contest.OURS:
                    assert fresh is not None
                    adopted = fresh
                    break
                if verdict is Contest.LOST:
                    self.queue.release(queue_name, name, requeue=False)
                    return None
                assert fresh is not None
                candidate = fresh
                try:
                    ops = adoption_patch(claim, fresh, snap.template)
                except ClaimError as exc:
                    self.queue.release(queue_name, name, requeue=True)
                    return Failed(exc, drop_reference=adopt.drop_reference)
            except KubeError:
                # No answer: the patch may have applied. Keep the key out of the queue and let the next
                # pass ask the API server (observe) before doing anything else.
                self.queue.release(queue_name, name, requeue=False)
                self.fresh.mark_uncertain(cmeta["uid"], name)
                raise
        else:
            self.queue.release(queue_name, name, requeue=False)
            return Failed(AdoptionConflict(f'sandbox "{name}" changed during adoption'), adopt.drop_reference)
        self.queue.release(queue_name, name, requeue=False)
        self.fresh.remember(SANDBOX, adopted)
        self.fresh.bind(cmeta["uid"], name)
        self.events.event(
            dict(claim), "Normal", c.EVENT_SANDBOX_ADOPTED, "Adoption", f'Adopted warm pool Sandbox "{name}"'
        )
        self.metrics.count_creation(
            claim,
            adopted,
            launch_type=c.LAUNCH_TYPE_WARM,
            pool=sandbox_pool_name(candidate) or "none",
            ready=is_ready(candidate),
            template=template_of(adopted),
        )
        return bound_to_sandbox(
            replace(snap, status_sandbox=None),
            adopted,
            c.LAUNCH_TYPE_WARM,
            drop_reference=adopt.drop_reference,
        )
