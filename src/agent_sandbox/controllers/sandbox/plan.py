"""Value types of the Sandbox controller's observe -> decide -> execute loop (controllers spec §1).

Owns: `Snapshot` (everything one pass reads, taken from the informer caches plus in-memory bookkeeping),
the typed actions a plan is made of (each one API call, or one Event), the per-step plans (`StepPlan`,
`PodPlan`, `ServicePlan`), `Plan`, and `StepResult` (what executing one step produced). All frozen; no
logic beyond trivial properties lives here.

Failure semantics are encoded in the data: actions run in order within a step and the first failure
skips the rest of that step (upstream's "error -> return"), while later steps still run. `keeps_pod` on a
Pod-step action says whether status still reports the Pod when that action fails (a failed delete while
suspending keeps it, a failed adoption patch does not).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, TypeAlias

from agent_sandbox.kube import Object, ResourceKind

__all__ = [
    "Action",
    "CreateObject",
    "DeleteObject",
    "DeleteSandbox",
    "EmitEvent",
    "PatchObject",
    "PatchSandboxMetadata",
    "Plan",
    "PlanMode",
    "PodPlan",
    "Results",
    "ServiceFields",
    "ServicePlan",
    "Snapshot",
    "StepPlan",
    "StepResult",
]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The observed state one pass decides from (read-only; objects are shared with the cache).

    Attributes:
        sandbox: the cached Sandbox.
        pods: Pods listed through the tracking-label index (candidates; ownership decides).
        tracked_pod: the cached Pod named by the pod-name annotation (or the Sandbox name); None: absent.
        service: the cached Service named like the Sandbox; None: absent.
        pvcs: cached PVCs by name (only those named after this Sandbox's volumeClaimTemplates).
        cluster_domain: `--cluster-domain`, suffix of `status.serviceFQDN`.
        trace_context: the current span's trace-context annotation ("" when tracing is off).
        deleting_pod_uids: Pods whose delete this controller issued but the cache does not show yet.
        awaiting_cache: set while creates/deletes this controller issued are not yet visible in the cache:
            seconds after which they are no longer waited for (expectations TTL); None: nothing pending.
        write_behind_window: effective write-behind window in seconds (0 = synchronous, §1.12); while
            claims are arriving, the claim-priority hold (`claim_pressure`).
        deferral_since: first time a Pod metadata write of this Sandbox was deferred (write-behind clock).
        yield_to_claims: claims are arriving: an observedGeneration-only status write is deferred too
            (same clock and window as the Pod metadata patch).
        boot_hold: how long a booting pool member's status may wait for its Ready write, on the same
            clock (0: never; off with the claim-priority hold, docs/design/boot-status-hold.md).
    """

    sandbox: Object
    pods: tuple[Object, ...] = ()
    tracked_pod: Object | None = None
    service: Object | None = None
    pvcs: Mapping[str, Object] = field(default_factory=dict)
    cluster_domain: str = "cluster.local"
    trace_context: str = ""
    deleting_pod_uids: frozenset[str] = frozenset()
    awaiting_cache: float | None = None
    write_behind_window: float = 0.0
    deferral_since: datetime | None = None
    yield_to_claims: bool = False
    boot_hold: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class _Base:
    what: str = ""
    """Error prefix naming the operation, e.g. "failed to patch pod"."""
    keeps_pod: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateObject(_Base):
    """Create a child (field manager `sandbox-controller`); raises a creation expectation."""

    kind: ResourceKind
    obj: Object


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchObject(_Base):
    """JSON merge patch of a child's metadata/spec (a resourceVersion inside makes it optimistic)."""

    kind: ResourceKind
    name: str
    patch: Object


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteObject(_Base):
    """Delete a child, guarded by its UID; NotFound counts as success."""

    kind: ResourceKind
    name: str
    uid: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PatchSandboxMetadata(_Base):
    """Merge patch of the Sandbox's own metadata (pod-name / trace-context annotations only, §1.13)."""

    patch: Object


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSandbox(_Base):
    """Delete the Sandbox itself (expiry with `shutdownPolicy: Delete`); NotFound counts as success."""

    uid: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EmitEvent(_Base):
    """A Kubernetes Event on the Sandbox (fire-and-forget, never fails the pass)."""

    type_: Literal["Normal", "Warning"]
    reason: str
    action: str
    note: str


Action: TypeAlias = (
    CreateObject | PatchObject | DeleteObject | PatchSandboxMetadata | DeleteSandbox | EmitEvent
)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Actions of one step plus an error decided without I/O (e.g. a foreign owner).

    `waiting`: the error is a wait on a deleted namesake's child going away (`owned_by_predecessor`),
    expected in normal operation; the status reports it all the same.
    `retry_after`: the error ends by a change no watch of this controller sees (a hibernated Sandbox's
    archive deleted, its PVC collected: `children.archive_refusal`): the pass is tried again after this
    many seconds instead of with the error backoff (up to 1000 s); the status reports it all the same.
    """

    actions: tuple[Action, ...] = ()
    error: str | None = None
    waiting: bool = False
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class PodPlan(StepPlan):
    """The Pod step (§1.5-§1.7): actions, and the Pod status should report if they all succeed.

    Attributes:
        pod: the Pod after the step (cached, or the manifest about to be created); None: absent.
        owned: the Pod is controlled by this Sandbox once the step's actions succeeded.
        multiple: the step stopped on the multiple-owned-Pods invariant (§1.5 step 5).
        deferred_wait: seconds until a deferred Pod metadata patch is due (write-behind); None: not deferred.
    """

    pod: Object | None = None
    owned: bool = False
    multiple: bool = False
    deferred_wait: float | None = None


class ServiceFields(enum.StrEnum):
    """What happens to `status.service` / `status.serviceFQDN`."""

    SET = "set"
    CLEAR = "clear"
    KEEP = "keep"


@dataclass(frozen=True, slots=True)
class ServicePlan(StepPlan):
    """The Service step (§1.8): actions, the Service it results in, and the status-field effect."""

    service: Object | None = None
    fields: ServiceFields = ServiceFields.CLEAR


class PlanMode(enum.StrEnum):
    """Which branch of §1.2 a pass takes."""

    IGNORE = "ignore"  # being deleted: nothing to do
    WAIT = "wait"  # our own creations are not in the cache yet: act on the next event
    EXPIRE_MARK = "expire-mark"  # §1.10 pass 1
    EXPIRE_TEARDOWN = "expire-teardown"  # §1.10 pass 2
    RECONCILE = "reconcile"  # §1.3-§1.9


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one pass; `conclude` turns it plus the `StepResult`s into status and requeue.

    Attributes:
        mode: the branch taken.
        trace: stamp the trace-context annotation first (§1.2 step 4); its failure aborts the pass.
        pvcs / pod / service: the RECONCILE steps (`service` None: skipped, Pod mapping ambiguous).
        events: Events to emit.
        teardown: EXPIRE_TEARDOWN steps, each independent (a failure never skips the others).
        requeue_after: for WAIT and EXPIRE_MARK.
        defer_since: start of a new write-behind deferral to record (None: keep the clock as is).
    """

    mode: PlanMode
    trace: StepPlan = StepPlan()
    pvcs: StepPlan = StepPlan()
    pod: PodPlan = PodPlan()
    service: ServicePlan | None = None
    events: tuple[EmitEvent, ...] = ()
    teardown: tuple[StepPlan, ...] = ()
    requeue_after: float | None = None
    defer_since: datetime | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of executing one step.

    Attributes:
        failed_at: index of the action that failed (the rest of the step was skipped); None: all succeeded.
        error: that failure's message.
        created: the API's answer to the step's successful create, if any.
        replanned: a replacement Pod plan (create hit AlreadyExists and the existing Pod was handled).
    """

    failed_at: int | None = None
    error: str | None = None
    created: Object | None = None
    replanned: PodPlan | None = None

    @property
    def ok(self) -> bool:
        return self.failed_at is None


@dataclass(frozen=True, slots=True)
class Results:
    """What executing a plan's steps produced (defaults: every step succeeded, nothing created)."""

    trace: StepResult = StepResult()
    pvcs: StepResult = StepResult()
    pod: StepResult = StepResult()
    service: StepResult = StepResult()
    teardown: tuple[StepResult, ...] = ()
