"""SandboxClaim decisions (controllers spec §4.3-§4.5, §4.9, §4.13): pure functions from a snapshot to plans.

A pass has three decision points, each followed by execution, because what to write next depends on
what the previous write achieved (a lost takeover, an AlreadyExists, a conflicting status write):

1. `decide_expiry` - mark an expired claim, delete it (Delete/DeleteForeground), or go on (§4.3 steps 7-8).
2. `resolve` - which Sandbox the claim is bound to, and the one write that binds it: nothing (already
   bound, maybe with a metadata fix), a warm takeover, a cold create, or a failure (§4.4, §4.5, §4.9).
   When a warm candidate is needed, `resolve` says so (`NeedCandidate`); the reconciler takes one from
   the queue atomically and calls `resolve` again with it.
3. `decide_claim_intent` - before the status write, the claim's own metadata upstream has in place by
   then, in one merge patch: first-observed time, trace context, the warm assignment record, legacy-label
   migration (§4.3 step 5, §4.5 step 2, §4.6 step 2); `decide_first_ready` - after it, the first-ready
   stamp (§4.13).

Nothing here awaits, reads a clock or calls a client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeAlias

from agent_sandbox.api import constants as c
from agent_sandbox.api.kinds import SANDBOX_CLAIM, SANDBOX_WARM_POOL
from agent_sandbox.api.meta import (
    ReadOnlyObject,
    claim_pool_name,
    claim_sandbox_name,
    controlled_by,
    format_rfc3339nano,
    new_condition,
    parse_time,
    pool_key,
    pool_template_name,
    reset_managed_fields,
    server_side_applied,
    status_condition,
)
from agent_sandbox.api.naming import template_ref_hash
from agent_sandbox.kube import create_merge_patch

from ..blueprint import semantic_equal
from .adoption import adoption_patch, candidate_problem
from .errors import (
    ClaimError,
    ReconcilerError,
    SandboxNotOwned,
    TemplateNotFound,
    WarmPoolNotFound,
)
from .hibernated import SandboxHibernated, hibernated_sandbox
from .metadata import has_additional_metadata, validate_additional_metadata
from .observability import ReadyStep
from .shape import build_cold_sandbox, claim_created_by, desired_pod_metadata
from .status import CLAIM_EXPIRED_MESSAGE, expiry
from .warmenv import warm_env_possible

__all__ = [
    "WARM_GRACE_SECONDS",
    "Adopt",
    "Bound",
    "ClaimMetadataPatch",
    "Continue",
    "Create",
    "DeleteClaim",
    "Failed",
    "MarkExpired",
    "NeedCandidate",
    "Pending",
    "Resolution",
    "SandboxWrite",
    "Snapshot",
    "assigned_name",
    "bound_to_sandbox",
    "decide_claim_intent",
    "decide_expiry",
    "decide_first_ready",
    "legacy_policy_to_delete",
    "resolve",
    "resolve_expired",
]

WARM_GRACE_SECONDS = 2.0
"""A claim younger than this waits (<= 500 ms at a time) for warm candidates to get Pod IPs (§4.5 step 5)."""
_PENDING_POLL = 0.5


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one pass observed; Sandbox views are the freshest known (cache or our own write)."""

    claim: ReadOnlyObject
    now: datetime
    status_sandbox: ReadOnlyObject | None = None  # named by status.sandbox.name
    assigned: ReadOnlyObject | None = None  # named by the assignment annotation (or legacy label)
    owned: tuple[ReadOnlyObject, ...] = ()  # controlled by this claim's UID
    same_name: ReadOnlyObject | None = None  # named like the claim
    pool: ReadOnlyObject | None = None
    template: ReadOnlyObject | None = None
    allowed_domains: tuple[str, ...] = ()
    warm_consulted: bool = False  # the queue was asked (candidate / pending below are meaningful)
    candidate: ReadOnlyObject | None = None  # the reserved warm candidate
    pending: int = 0  # warm candidates skipped for lack of Pod IPs


# --------------------------------------------------------------------------- small readers


def assigned_name(claim: ReadOnlyObject) -> tuple[str, bool]:
    """(name, from_legacy_label): the assignment annotation, else the deprecated label of the same key."""
    meta = claim.get("metadata") or {}
    name = (meta.get("annotations") or {}).get(c.ANNOTATION_SANDBOX_NAME, "")
    if name:
        return name, False
    legacy = (meta.get("labels") or {}).get(c.LABEL_SANDBOX_NAME_LEGACY, "")
    return legacy, bool(legacy)


# --------------------------------------------------------------------------- stage 1: expiry (§4.3 steps 7-8)


@dataclass(frozen=True, slots=True)
class MarkExpired:
    """Write Ready=False/ClaimExpired, emit `ClaimExpired`, requeue at once (the action is next pass)."""

    ready: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeleteClaim:
    """Delete the claim (Delete: background; DeleteForeground: foreground), after an Event."""

    policy: str

    @property
    def propagation(self) -> str:
        return "Foreground" if self.policy == c.ClaimShutdownPolicy.DELETE_FOREGROUND else "Background"


@dataclass(frozen=True, slots=True)
class Continue:
    """Go on with the pass; `expired` selects the Retain teardown instead of the active path."""

    expired: bool
    time_left: float | None


def decide_expiry(claim: ReadOnlyObject, now: datetime) -> MarkExpired | DeleteClaim | Continue:
    exp = expiry(claim, now)
    if not exp.expired:
        return Continue(False, exp.time_left)
    ready = status_condition(claim, c.CONDITION_READY)
    if ready is None or ready.get("reason") != c.REASON_CLAIM_EXPIRED:
        gen = (claim.get("metadata") or {}).get("generation")
        false = c.ConditionStatus.FALSE.value
        return MarkExpired(
            new_condition(c.CONDITION_READY, false, c.REASON_CLAIM_EXPIRED, CLAIM_EXPIRED_MESSAGE, gen)
        )
    policy = ((claim.get("spec") or {}).get("lifecycle") or {}).get(
        "shutdownPolicy"
    ) or c.ClaimShutdownPolicy.RETAIN
    if policy in (c.ClaimShutdownPolicy.DELETE, c.ClaimShutdownPolicy.DELETE_FOREGROUND):
        return DeleteClaim(str(policy))
    return Continue(True, exp.time_left)


def legacy_policy_to_delete(claim: ReadOnlyObject, policy: ReadOnlyObject | None) -> bool:
    """§4.3 step 2: the legacy per-claim NetworkPolicy is deleted only if this claim controls it."""
    return controlled_by(policy, SANDBOX_CLAIM, claim["metadata"].get("uid") or "")


# --------------------------------------------------------------------------- stage 2: resolution (§4.4-§4.5, §4.9)


@dataclass(frozen=True, slots=True)
class SandboxWrite:
    """A follow-up write on the bound Sandbox: a metadata merge patch, or deleting a stray extra."""

    name: str
    patch: dict[str, Any] | None = None
    delete_uid: str | None = None


@dataclass(frozen=True, slots=True)
class Bound:
    """The claim has its Sandbox; `writes` repair it; `error` (if any) still shows in status."""

    sandbox: ReadOnlyObject
    writes: tuple[SandboxWrite, ...] = ()
    error: ClaimError | None = None
    drop_reference: bool = False


@dataclass(frozen=True, slots=True)
class NeedCandidate:
    """Ask the warm queue `queue` for a candidate, then resolve again."""

    queue: str
    drop_reference: bool = False


@dataclass(frozen=True, slots=True)
class Adopt:
    """Take over `sandbox` (a pool member) with the guarded JSON patch `ops`."""

    sandbox: ReadOnlyObject
    ops: list[dict[str, Any]]
    drop_reference: bool = False


@dataclass(frozen=True, slots=True)
class Create:
    """Cold start: create `body` (named like the claim)."""

    body: dict[str, Any]
    drop_reference: bool = False


@dataclass(frozen=True, slots=True)
class Pending:
    """Warm candidates exist but have no Pod IPs yet: requeue after `delay`, write no status."""

    delay: float


@dataclass(frozen=True, slots=True)
class Failed:
    """No Sandbox is bound this pass; `error` None means "none exists" (Ready=SandboxMissing)."""

    error: ClaimError | None
    drop_reference: bool = False


Resolution: TypeAlias = Bound | NeedCandidate | Adopt | Create | Pending | Failed


def _lookup_error(s: Snapshot, prefix: str = "") -> ClaimError:
    if s.pool is None:
        err: ClaimError = WarmPoolNotFound(claim_pool_name(s.claim))
    else:
        err = TemplateNotFound(pool_template_name(s.pool))
    if prefix:
        err.args = (f"{prefix}{err}",)
    return err


def bound_to_sandbox(
    s: Snapshot, sandbox: ReadOnlyObject, launch: str, *, drop_reference: bool = False
) -> Bound:
    """A bound Sandbox plus its repairs: launch-type label, metadata sync (§4.4 step 3), stray extras."""
    meta = sandbox["metadata"]
    labels_patch: dict[str, Any] = {}
    labels = meta.get("labels") or {}
    if not labels.get(c.LABEL_LAUNCH_TYPE):
        labels_patch[c.LABEL_LAUNCH_TYPE] = launch  # never overwrite an existing value
    patch: dict[str, Any] = {}
    error: ClaimError | None = None
    if s.template is None:
        if has_additional_metadata(s.claim):
            error = _lookup_error(s, "failed to get template for metadata propagation: ")
    else:
        try:
            desired = desired_pod_metadata(s.claim, s.template)
        except ClaimError as exc:
            error = exc
        else:
            current = ((sandbox.get("spec") or {}).get("podTemplate") or {}).get("metadata") or {}
            if not semantic_equal(current, desired):
                patch["spec"] = {"podTemplate": {"metadata": create_merge_patch(current, desired)}}
            want_ref = template_ref_hash(s.template["metadata"]["name"])
            if labels.get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH) != want_ref:
                labels_patch[c.LABEL_SANDBOX_TEMPLATE_REF_HASH] = want_ref
            created_by = claim_created_by(s.claim)
            if labels.get(c.LABEL_CREATED_BY, "") != created_by:
                labels_patch[c.LABEL_CREATED_BY] = created_by or None
    if labels_patch:
        patch["metadata"] = {"labels": labels_patch}
    writes: list[SandboxWrite] = [SandboxWrite(meta["name"], patch=patch)] if patch else []
    uid = s.claim["metadata"]["uid"]
    if claim_sandbox_name(s.claim) == meta["name"]:
        # Only once the binding is persisted: any other Sandbox this claim controls is a stray from a
        # split-brain double adoption; release it so the pool (or the quota) gets the capacity back.
        writes.extend(
            SandboxWrite(o["metadata"]["name"], delete_uid=o["metadata"]["uid"])
            for o in s.owned
            if o["metadata"]["name"] != meta["name"] and controlled_by(o, SANDBOX_CLAIM, uid)
        )
    return Bound(sandbox, tuple(writes), error, drop_reference)


def _launch_of(sandbox: ReadOnlyObject, claim: ReadOnlyObject) -> str:
    value = ((sandbox.get("metadata") or {}).get("labels") or {}).get(c.LABEL_LAUNCH_TYPE)
    if value:
        return str(value)
    return (
        c.LAUNCH_TYPE_COLD if sandbox["metadata"]["name"] == claim["metadata"]["name"] else c.LAUNCH_TYPE_WARM
    )


def _preferred(owned: tuple[ReadOnlyObject, ...], claim: ReadOnlyObject) -> ReadOnlyObject:
    """Deterministic choice among several controlled Sandboxes: persisted binding, assignment, own name."""
    by_name = {o["metadata"]["name"]: o for o in owned}
    for name in (claim_sandbox_name(claim), assigned_name(claim)[0], claim["metadata"]["name"]):
        if name and name in by_name:
            return by_name[name]
    return by_name[min(by_name)]


def resolve(s: Snapshot) -> Resolution:
    """Which Sandbox backs the claim, and the single binding write if any (§4.4, §4.5)."""
    claim = s.claim
    cmeta = claim["metadata"]
    uid = cmeta["uid"]
    try:
        validate_additional_metadata(claim, s.allowed_domains)
    except ClaimError as exc:
        return Failed(exc)
    status_name = claim_sandbox_name(claim)
    assigned, _ = assigned_name(claim)
    # 1. Persisted binding.
    if status_name and controlled_by(s.status_sandbox, SANDBOX_CLAIM, uid):
        assert s.status_sandbox is not None
        warm = assigned == status_name or status_name != cmeta["name"]
        return bound_to_sandbox(s, s.status_sandbox, c.LAUNCH_TYPE_WARM if warm else c.LAUNCH_TYPE_COLD)
    # 2. Assignment record (written by upstream controllers before their takeover).
    drop = False
    if assigned:
        sb = s.assigned
        if controlled_by(sb, SANDBOX_CLAIM, uid):
            assert sb is not None
            return bound_to_sandbox(s, sb, c.LAUNCH_TYPE_WARM)
        if (
            sb is not None
            and controlled_by(sb, SANDBOX_WARM_POOL)
            and candidate_problem(sb, namespace=cmeta["namespace"], pool_name=claim_pool_name(claim)) is None
        ):
            return _adopt(s, sb)  # finish the recorded adoption
        drop = True  # gone, foreign, or no longer a valid candidate
    # 3. Sandboxes this claim already controls: recovery after a crash or during cache lag. This index
    #    lookup is what lets the takeover skip upstream's claim-side "intent" write.
    if s.owned:
        sb = _preferred(s.owned, claim)
        return bound_to_sandbox(s, sb, _launch_of(sb, claim), drop_reference=drop)
    # 4. A Sandbox named like the claim.
    if s.same_name is not None:
        if not controlled_by(s.same_name, SANDBOX_CLAIM, uid):
            return Failed(
                ReconcilerError(
                    f'sandbox "{cmeta["name"]}" is not controlled by claim "{cmeta["name"]}". '
                    "Please use a different claim name or delete the sandbox manually"
                ),
                drop_reference=drop,
            )
        return bound_to_sandbox(s, s.same_name, c.LAUNCH_TYPE_COLD, drop_reference=drop)
    # Ours: a hibernated Sandbox is neither replaced nor missing (`hibernated`).
    if hibernated_sandbox(claim):
        return Failed(SandboxHibernated(hibernated_sandbox(claim)), drop_reference=drop)
    spec = claim.get("spec") or {}
    # 5. env / volumeClaimTemplates force a cold start: a running warm Pod cannot take them (ours: env can
    #    when the template delivers it through the runtime, `warmenv`).
    if not spec.get("volumeClaimTemplates") and (not spec.get("env") or warm_env_possible(claim, s.template)):
        if not s.warm_consulted:
            return NeedCandidate(pool_key(cmeta["namespace"], claim_pool_name(claim)), drop_reference=drop)
        if s.candidate is not None:
            return _adopt(s, s.candidate, drop_reference=drop)
        age = _age(claim, s.now)
        if s.pending and age is not None and age < WARM_GRACE_SECONDS:
            return Pending(min(_PENDING_POLL, WARM_GRACE_SECONDS - age))
    # 6. Cold start from the pool's template.
    if s.pool is None or s.template is None:
        return Failed(_lookup_error(s), drop_reference=drop)
    try:
        return Create(build_cold_sandbox(claim, s.template), drop_reference=drop)
    except ClaimError as exc:
        return Failed(exc, drop_reference=drop)


def _adopt(s: Snapshot, sandbox: ReadOnlyObject, *, drop_reference: bool = False) -> Adopt | Failed:
    try:
        return Adopt(sandbox, adoption_patch(s.claim, sandbox, s.template), drop_reference)
    except ClaimError as exc:
        return Failed(exc, drop_reference=drop_reference)


def _age(claim: ReadOnlyObject, now: datetime) -> float | None:
    created = parse_time((claim.get("metadata") or {}).get("creationTimestamp"))
    return None if created is None else (now - created).total_seconds()


def resolve_expired(s: Snapshot) -> Failed | Bound:
    """Retain teardown (§4.9): delete the claim's Sandbox, keep the claim with Ready=ClaimExpired.

    The Sandbox stays bound in status while it terminates and is cleared once it is gone.
    """
    claim = s.claim
    target = claim_sandbox_name(claim) or claim["metadata"]["name"]
    sb = s.status_sandbox if claim_sandbox_name(claim) else s.same_name
    if sb is None:
        return Failed(None)  # already gone
    if not controlled_by(sb, SANDBOX_CLAIM, claim["metadata"]["uid"]):
        owner = claim["metadata"]["name"]
        return Failed(SandboxNotOwned(f'sandbox "{target}" is not owned by claim "{owner}"'))
    if sb["metadata"].get("deletionTimestamp"):
        return Bound(sb)
    return Bound(sb, (SandboxWrite(target, delete_uid=sb["metadata"]["uid"]),))


# --------------------------------------------------------------------------- stage 3: claim metadata (§4.13)


@dataclass(frozen=True, slots=True)
class ClaimMetadataPatch:
    """One merge patch of the claim's metadata (None values delete keys), plus the readiness step.

    `reset_managed_fields` rides along only when the patch is written anyway (`api.meta.reset_managed_fields`).
    """

    annotations: dict[str, str | None] = field(default_factory=dict)
    labels: dict[str, str | None] = field(default_factory=dict)
    ready_step: ReadyStep = ReadyStep.NOTHING
    reset_managed_fields: bool = False

    @property
    def empty(self) -> bool:
        return not self.annotations and not self.labels

    def body(self) -> dict[str, Any]:
        meta: dict[str, Any] = {}
        if self.annotations:
            meta["annotations"] = dict(sorted(self.annotations.items()))
        if self.labels:
            meta["labels"] = dict(sorted(self.labels.items()))
        if meta and self.reset_managed_fields:
            reset_managed_fields(meta)
        return {"metadata": meta}


def decide_claim_intent(
    claim: ReadOnlyObject,
    *,
    sandbox: ReadOnlyObject | None,
    first_observed: datetime,
    persist_observed: bool,
    trace_context: str = "",
    drop_reference: bool = False,
) -> ClaimMetadataPatch:
    """The claim's metadata upstream has in place before the claim's status names its Sandbox.

    Upstream stamps `controller-first-observed-at` (and the trace context) before any status write
    (§4.3 step 5) and records `sandbox-name` before it takes a warm Sandbox (§4.6 step 2); stale references
    and the legacy label are settled during resolution (§4.5 step 2), also before the status. A CRD's
    `/status` write ignores metadata, so this patch is its own write, sent before the status write (on the
    warm path alongside the takeover) and never deferred: a client reading a claim that shows a status
    (Ready or not) finds these keys, as with upstream.

    Unless someone server-side applied the claim, the patch also drops its `managedFields`: every later
    write and event of the claim (status, stamp, delete) then skips kube-apiserver's field tracking and
    carries half the bytes (docs/design/managed-fields.md).

    Args:
        claim: the freshest view of the claim.
        sandbox: the Sandbox the status is about to name (bound, or the warm candidate being taken).
        persist_observed: False with `--disable-claim-observability-annotations` (kept in memory only).
        trace_context: the pass's trace context annotation ("" when tracing is off).
        drop_reference: the assignment record names a Sandbox that is gone or not ours.
    """
    meta = claim.get("metadata") or {}
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    out_ann: dict[str, str | None] = {}
    out_labels: dict[str, str | None] = {}
    if persist_observed and not ann.get(c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT):
        out_ann[c.ANNOTATION_CONTROLLER_FIRST_OBSERVED_AT] = format_rfc3339nano(first_observed)
    if persist_observed and trace_context and not ann.get(c.ANNOTATION_TRACE_CONTEXT):
        out_ann[c.ANNOTATION_TRACE_CONTEXT] = trace_context
    # The warm assignment record (api spec §5.5).
    current = ann.get(c.ANNOTATION_SANDBOX_NAME, "")
    bound = sandbox["metadata"]["name"] if sandbox is not None else ""
    warm = sandbox is not None and (
        (sandbox["metadata"].get("labels") or {}).get(c.LABEL_LAUNCH_TYPE) == c.LAUNCH_TYPE_WARM
        or bound != meta.get("name")
    )
    if warm and current != bound:
        out_ann[c.ANNOTATION_SANDBOX_NAME] = bound
    elif current and (drop_reference or (sandbox is not None and current != bound)):
        out_ann[c.ANNOTATION_SANDBOX_NAME] = None
    if labels.get(c.LABEL_SANDBOX_NAME_LEGACY) and (drop_reference or sandbox is not None):
        # Deprecated label: migrated to the annotation above when it names the bound Sandbox, else stale.
        out_labels[c.LABEL_SANDBOX_NAME_LEGACY] = None
    return ClaimMetadataPatch(out_ann, out_labels, reset_managed_fields=not server_side_applied(claim))


def decide_first_ready(claim: ReadOnlyObject, *, ready_step: ReadyStep, now: datetime) -> ClaimMetadataPatch:
    """The `claim-first-ready-at` stamp due after an authoritative status write (§4.13).

    Upstream writes it after the status that made the claim Ready, so a claim is Ready before it carries
    the stamp; ours may wait behind arriving claims (docs/design/claim-priority.md).
    """
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    out: dict[str, str | None] = {}
    if ready_step is ReadyStep.RECORD and not ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT):
        out[c.ANNOTATION_CLAIM_FIRST_READY_AT] = format_rfc3339nano(now)
    elif ready_step is ReadyStep.DRAIN_BACKFILL and not ann.get(c.ANNOTATION_CLAIM_FIRST_READY_AT):
        out[c.ANNOTATION_CLAIM_FIRST_READY_AT] = c.CLAIM_FIRST_READY_UNKNOWN
    return ClaimMetadataPatch(out, {}, ready_step)
