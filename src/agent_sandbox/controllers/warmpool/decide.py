"""SandboxWarmPool decisions (controllers spec §3.3-§3.5, §3.8-§3.9): snapshot in, plan out, no I/O.

`decide(snapshot, now, config)` classifies the listed members (§3.4: terminating, pending deletion,
foreign, stale, relabel, adopt, active), applies the readiness grace (§3.5: keep young, hold
unschedulable, replace stuck), computes the status (§3.9) and the intents toward `spec.replicas`:
create `min(desired - total, batch)` members, or delete the `min(current - desired, batch)` least
valuable ones (not-Ready first, then newest).

The plan assumes every clean-up action it asks for succeeds (a failed one is reported as an error by
the executor and the pass is retried with backoff, without a status write). The admission gates that
depend on in-memory state shared between passes - replenish hold, refill tokens, expectations - are
applied by the reconciler at execution time, because they must be atomic with the writes they guard.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.api.meta import (
    controlled_by,
    controller_ref,
    is_ready,
    new_controller_ref,
    parse_time,
    pool_update_strategy,
    sandbox_pod_name,
)
from agent_sandbox.kube import Object

from ..blueprint import blueprint_hash, pod_template_hash
from .config import GRACE_REQUEUE_SLACK, WarmPoolConfig
from .members import (
    StalenessChecker,
    build_member,
    pod_unschedulable,
)

__all__ = [
    "CreateMembers",
    "DeleteMember",
    "PoolPlan",
    "PoolSnapshot",
    "created_at",
    "decide",
    "pool_status",
]


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """What one pass observed (all from the informer cache plus the expectations record).

    Attributes:
        pool: the SandboxWarmPool.
        members: Sandboxes in the pool's namespace carrying its `warm-pool-sandbox` label.
        template: the referenced SandboxTemplate, None when it could not be read.
        template_missing: the template does not exist (not an error: nothing is created or judged stale).
        template_error: any other failure reading it (reported as an error of the pass).
        pods: backing Pods of the not-Ready members, by Pod name (absent: not in the cache).
        pending_deletions: UIDs of members this controller deleted whose deletion is not yet observed.
    """

    pool: Object
    members: tuple[Object, ...]
    template: Object | None
    template_missing: bool = False
    template_error: str | None = None
    pods: Mapping[str, Object] = field(default_factory=dict)
    pending_deletions: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class DeleteMember:
    """Delete one member; `owned` members get a deletion expectation (orphans do not, §3.4 step 4)."""

    name: str
    uid: str
    resource_version: str
    owned: bool
    reason: Literal["stale", "stuck", "excess"]


@dataclass(frozen=True, slots=True)
class PatchMember:
    """Merge-patch a member: add `launch-type=warm`, or adopt an orphan (controller reference).

    The adoption patch carries the cached resourceVersion (optimistic lock, like the full update of
    §3.4), so an owner set concurrently by someone else is never overwritten.
    """

    name: str
    patch: Object
    reason: Literal["launch-type", "adopt"]


@dataclass(frozen=True, slots=True)
class CreateMembers:
    """Create up to `want` copies of `body` (subject to the hold, refill tokens and expectations)."""

    want: int
    body: Object


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pass's intents and the counts that the gates and the status need."""

    desired: int
    current: int
    terminating: int
    unschedulable: int
    status: dict[str, Any]
    status_changed: bool
    gc: tuple[DeleteMember, ...] = ()
    updates: tuple[PatchMember, ...] = ()
    create: CreateMembers | None = None
    excess: tuple[DeleteMember, ...] = ()
    grace_requeue: float = 0.0
    """Seconds until the earliest not-Ready member leaves its grace period, plus slack (0 = none)."""
    template_ok: bool = False
    """The template was read (creates and staleness checks were possible)."""
    template_missing: bool = False
    """The template does not exist (not an error, §3.3 step 12; the reconciler says so in an Event)."""
    template_error: str | None = None

    @property
    def total(self) -> int:
        """Live population: active plus terminating (creates are gated on this, §3.3 step 5)."""
        return self.current + self.terminating


def created_at(obj: Object) -> float | None:
    """`metadata.creationTimestamp` as epoch seconds, None when absent or malformed."""
    created = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return None if created is None else created.timestamp()


def pool_status(pool: Object, active: list[Object]) -> dict[str, Any]:
    """The four status fields of §3.3 step 6 (zero values included, so they are written)."""
    return {
        "replicas": len(active),
        "readyReplicas": sum(1 for sb in active if is_ready(sb)),
        "selector": naming.warm_pool_selector(pool["metadata"]["name"]),
        "observedGeneration": pool["metadata"].get("generation", 0),
    }


def _delete(sb: Object, *, owned: bool, reason: Literal["stale", "stuck", "excess"]) -> DeleteMember:
    meta = sb["metadata"]
    return DeleteMember(meta["name"], meta.get("uid", ""), meta.get("resourceVersion", ""), owned, reason)


_WARM_LABEL: Final = {c.LABEL_LAUNCH_TYPE: c.LAUNCH_TYPE_WARM}


def _relabel(sb: Object) -> PatchMember:
    return PatchMember(sb["metadata"]["name"], {"metadata": {"labels": dict(_WARM_LABEL)}}, "launch-type")


def _adopt(sb: Object, pool: Object) -> PatchMember:
    """The pool as controller owner (other owner references kept) and `launch-type=warm`."""
    meta = pool["metadata"]
    refs = [copy.deepcopy(r) for r in sb["metadata"].get("ownerReferences") or () if not r.get("controller")]
    refs.append(
        new_controller_ref(
            api_version=c.EXTENSIONS_API_VERSION,
            kind=c.KIND_SANDBOX_WARM_POOL,
            name=meta["name"],
            uid=meta["uid"],
        )
    )
    patch = {
        "metadata": {
            "resourceVersion": sb["metadata"].get("resourceVersion"),
            "ownerReferences": refs,  # a merge patch replaces the list as a whole
            "labels": dict(_WARM_LABEL),
        }
    }
    return PatchMember(sb["metadata"]["name"], patch, "adopt")


def _excess(active: list[Object], count: int) -> tuple[DeleteMember, ...]:
    # Newest first, then (stable) not-Ready before Ready: the least valuable members go first.
    newest_first = sorted(
        active, key=lambda sb: str(sb["metadata"].get("creationTimestamp", "")), reverse=True
    )
    ordered = sorted(newest_first, key=is_ready)
    return tuple(_delete(sb, owned=True, reason="excess") for sb in ordered[:count])


def decide(snap: PoolSnapshot, now: float, config: WarmPoolConfig) -> PoolPlan:
    """The plan of one pass. `now` is wall-clock epoch seconds (member ages come from creationTimestamps)."""
    pool = snap.pool
    pool_uid = pool["metadata"].get("uid", "")
    template_ok = snap.template is not None and not snap.template_missing and snap.template_error is None
    checker: StalenessChecker | None = None
    bp_hash = ""
    if template_ok:
        assert snap.template is not None
        bp_hash = blueprint_hash(snap.template.get("spec") or {})
        checker = StalenessChecker(snap.template, bp_hash)
    recreate = pool_update_strategy(pool) == c.UpdateStrategyType.RECREATE

    gc: list[DeleteMember] = []
    updates: list[PatchMember] = []
    classified: list[Object] = []
    terminating = 0
    for sb in snap.members:
        meta = sb["metadata"]
        orphan = controller_ref(meta) is None
        owned = controlled_by(sb, uid=pool_uid)
        if meta.get("deletionTimestamp"):
            terminating += owned
            continue
        if owned and meta.get("uid") in snap.pending_deletions:
            terminating += 1  # deleted by us, the cache has not caught up
            continue
        if not orphan and not owned:
            continue  # claimed or otherwise foreign: never touched
        if checker is not None and (recreate or orphan) and checker.is_stale(sb, orphan=orphan):
            gc.append(_delete(sb, owned=owned, reason="stale"))
            terminating += owned  # orphans never counted against the target
            continue
        if orphan:
            updates.append(_adopt(sb, pool))
        elif (meta.get("labels") or {}).get(c.LABEL_LAUNCH_TYPE) != c.LAUNCH_TYPE_WARM:
            updates.append(_relabel(sb))
        classified.append(sb)

    # Readiness grace (§3.5).
    grace = config.readiness_grace_period
    active: list[Object] = []
    unschedulable = 0
    grace_requeue = 0.0
    for sb in classified:
        created = created_at(sb)
        if is_ready(sb) or created is None:
            active.append(sb)
            continue
        age = now - created
        if age <= grace:
            remaining = grace - age + GRACE_REQUEUE_SLACK
            grace_requeue = remaining if grace_requeue == 0 else min(grace_requeue, remaining)
            active.append(sb)
        elif pod_unschedulable(snap.pods.get(sandbox_pod_name(sb))):
            unschedulable += 1  # a replacement would be just as unschedulable: hold it
            active.append(sb)
        else:
            gc.append(_delete(sb, owned=True, reason="stuck"))
            terminating += 1

    desired_raw = (pool.get("spec") or {}).get("replicas")
    desired = 1 if desired_raw is None else int(desired_raw)
    current = len(active)
    status = pool_status(pool, active)
    old = pool.get("status") or {}
    status_changed = any(old.get(k) != v for k, v in status.items())

    create: CreateMembers | None = None
    if template_ok and current + terminating < desired:
        assert snap.template is not None
        body = build_member(
            pool,
            snap.template,
            pod_template_hash=pod_template_hash(snap.template.get("spec") or {}),
            blueprint_hash=bp_hash,
            enable_eviction=config.enable_eviction,
        )
        create = CreateMembers(min(desired - current - terminating, config.max_batch_size), body)
    excess: tuple[DeleteMember, ...] = ()
    if current > desired:
        excess = _excess(active, min(current - desired, config.max_batch_size))
    return PoolPlan(
        desired=desired,
        current=current,
        terminating=terminating,
        unschedulable=unschedulable,
        status=status,
        status_changed=status_changed,
        gc=tuple(gc),
        updates=tuple(updates),
        create=create,
        excess=excess,
        grace_requeue=grace_requeue,
        template_ok=template_ok,
        template_missing=snap.template_missing and snap.template_error is None,
        template_error=snap.template_error,
    )
