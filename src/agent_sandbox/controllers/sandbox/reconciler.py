"""`SandboxReconciler`: observe -> decide -> execute -> conclude for one Sandbox (controllers spec §1.2).

Owns the pass's I/O skeleton and the little state that must outlive a pass: the write-behind clock of
§1.12 (first time a deferral was observed, per Sandbox), the child expectations (`expectations`) and the
Sandbox's read-your-writes overlay (`kube.OwnWrites`). Reads come
from the informer cache (`IndexedReader`), writes go to the API server (`SandboxWriter`).

Flow of one pass:

1. read the Sandbox from the cache (NotFound, or later a write to it answering NotFound: drop its in-memory
   state, done); if the cache still shows a version older than this controller's own last write of it,
   use that write's answer (`kube.OwnWrites`);
2. open the `ReconcileSandbox` span (continuing the trace in the Sandbox's annotation);
3. observe the children into a `Snapshot` (cache reads only, plus expectations and the write-behind clock);
4. `decide` -> `Plan`; run its steps: trace annotation (failure aborts), PVCs, Pod, Service or the expiry
   teardown, each step stopping at its first failing call while later steps still run (a child create
   refused because the namespace is being deleted ends the pass quietly: `NamespaceTerminating`);
5. `conclude` at the post-execution time -> status patch, requeue and errors; write the status even when
   there are errors; raise `SandboxReconcileError` with all error texts (-> rate-limited retry) or return
   `Result(requeue_after)`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from agent_sandbox.api.constants import LABEL_CREATED_BY
from agent_sandbox.api.meta import normalize_created_by, sandbox_pod_name
from agent_sandbox.api.naming import name_hash
from agent_sandbox.kube import (
    POD,
    PVC,
    SANDBOX,
    SERVICE,
    EventSink,
    IndexedReader,
    KubeError,
    NotFound,
    Object,
    OwnWrites,
    Request,
    ResourceKind,
    Result,
    RetryLater,
    Tracing,
    Waiting,
)

from ..claim_pressure import ClaimPressure
from ..indexes import INDEX_POD_NAME_HASH
from .children import pvc_name
from .decide import decide, plan_existing_pod
from .execute import Executor, NamespaceTerminating, SandboxGone, SandboxWriter, error_text
from .expectations import ChildExpectations
from .plan import Plan, PlanMode, Results, Snapshot, StepPlan, StepResult
from .status import BOOT_HOLD, conclude

__all__ = ["WRITE_BEHIND_BOUND", "SandboxReconcileError", "SandboxReconciler", "SandboxWaiting"]

log = logging.getLogger("agent_sandbox.controllers.sandbox")

WRITE_BEHIND_BOUND = 1.0
"""Upper bound of the effective write-behind window (§1.12: limits how long safe-to-evict may linger)."""

_CHILD_KINDS: tuple[ResourceKind, ...] = (POD, PVC, SERVICE)


class SandboxReconcileError(RetryLater):
    """A pass ended with errors (API failures or refused children); retried with backoff."""


class SandboxWaiting(SandboxReconcileError, Waiting):
    """A pass whose only errors are children of a deleted namesake still going away; logged at info."""


def _wall_clock() -> datetime:
    return datetime.now(UTC)


class SandboxReconciler:
    """The Sandbox controller's `Reconciler` (name `sandbox`, §0.5)."""

    def __init__(
        self,
        reader: IndexedReader,
        writer: SandboxWriter,
        *,
        cluster_domain: str = "cluster.local",
        write_behind_window: float = 0.0,
        expectations: ChildExpectations | None = None,
        events: EventSink | None = None,
        tracing: Tracing | None = None,
        pressure: ClaimPressure | None = None,
        now: Callable[[], datetime] = _wall_clock,
    ) -> None:
        """Create the reconciler.

        Args:
            reader: cache reader with the `INDEX_POD_NAME_HASH` index on Pods.
            writer: API client for writes (and the live read of §1.5.1).
            cluster_domain: `--cluster-domain`.
            write_behind_window: `--sandbox-write-behind-window` seconds (bounded by 1 s, §1.12).
            expectations: shared with the informer handlers (see `watches.setup`); None: a private set.
            events: Event sink reporting as `sandbox-controller`.
            tracing: span factory (None: tracing off).
            pressure: claim arrivals; while they last, the Pod metadata patch and an observedGeneration-only
                status write are deferred for up to its hold (None: never). With a hold > 0 a booting
                pool member's status also waits for its Ready write (`BOOT_HOLD`), claims or not.
            now: wall clock (tests inject a fixed time).
        """
        self.reader = reader
        self.writer = writer
        self.cluster_domain = cluster_domain
        self.window = min(max(write_behind_window, 0.0), WRITE_BEHIND_BOUND)
        self.expectations = expectations or ChildExpectations()
        self.events = events
        self.tracing = tracing or Tracing()
        self.pressure = pressure or ClaimPressure(0.0)
        self.now = now
        self._deferrals: dict[Request, datetime] = {}
        self._write_behind: set[Request] = set()  # whose last pass held a write on the clock (not boot holds)
        self._own_writes = OwnWrites()

    def deferred(self) -> list[Request]:
        """Sandboxes holding a write deferred behind claims (re-enqueued when claim pressure ends).

        Judged by each Sandbox's last pass (`Conclusion.write_behind`), not by its write-behind clock entry:
        a booting pool member's held status waits for its Pod, not for the claims (its own requeue ends the
        hold), and a pass that fails keeps the clock running without holding anything.
        """
        return list(self._write_behind)

    def held_writes(self) -> dict[str, int]:
        """`claim_pressure.HoldsWrites`: Sandboxes whose Pod metadata or status write waits behind claims."""
        return {"sandbox": len(self.deferred())}

    async def reconcile(self, request: Request) -> Result:
        """One pass over the Sandbox `request` names (see module docstring)."""
        try:
            cached = await self.reader.get(SANDBOX, request.name, namespace=request.namespace)
        except NotFound:
            return self._gone(request)
        sandbox = self._own_writes.view(SANDBOX, request.namespace, request.name, cached) or cached
        labels = sandbox["metadata"].get("labels") or {}
        attributes = {"sandbox.name": request.name, "sandbox.namespace": request.namespace}
        if LABEL_CREATED_BY in labels:
            attributes[LABEL_CREATED_BY] = normalize_created_by(labels[LABEL_CREATED_BY])
        parent = (sandbox["metadata"].get("annotations") or {}).get("opentelemetry.io/trace-context")
        with self.tracing.start_span("ReconcileSandbox", parent=parent, attributes=attributes):
            return await self._pass(request, sandbox)

    def _gone(self, request: Request) -> Result:
        self._deferrals.pop(request, None)
        self._write_behind.discard(request)
        self._own_writes.forget(SANDBOX, request.namespace, request.name)
        self.expectations.forget(_CHILD_KINDS, request.namespace, request.name)
        return Result()

    async def observe(self, sandbox: Object, request: Request) -> Snapshot:
        """Read everything `decide` needs from the cache and the in-memory bookkeeping."""
        ns, name = request.namespace, request.name
        pods = tuple(await self.reader.list_by_index(POD, INDEX_POD_NAME_HASH, name_hash(name), namespace=ns))
        tracked = await self._cached(POD, sandbox_pod_name(sandbox), ns)
        service = await self._cached(SERVICE, name, ns)
        pvcs: dict[str, Object] = {}
        for template in (sandbox.get("spec") or {}).get("volumeClaimTemplates") or ():
            claim = pvc_name(template, name)
            pvc = await self._cached(PVC, claim, ns)
            if pvc is not None:
                pvcs[claim] = pvc
        uids = {p["metadata"].get("uid", "") for p in (*pods, *((tracked,) if tracked else ()))}
        pending = self.expectations.pending(_CHILD_KINDS, ns, name)
        hot = self.pressure.hot()
        return Snapshot(
            sandbox=sandbox,
            pods=pods,
            tracked_pod=tracked,
            service=service,
            pvcs=pvcs,
            cluster_domain=self.cluster_domain,
            trace_context=self.tracing.current_context_annotation(),
            deleting_pod_uids=self.expectations.deleting(POD, ns, name, uids),
            awaiting_cache=self.expectations.ttl if pending else None,
            write_behind_window=max(self.window, self.pressure.hold) if hot else self.window,
            deferral_since=self._deferrals.get(request),
            yield_to_claims=hot,
            boot_hold=BOOT_HOLD if self.pressure.enabled else 0.0,
        )

    async def _cached(self, kind: ResourceKind, name: str, namespace: str) -> Object | None:
        try:
            return await self.reader.get(kind, name, namespace=namespace)
        except NotFound:
            return None

    async def _pass(self, request: Request, sandbox: Object) -> Result:
        snapshot = await self.observe(sandbox, request)
        now = self.now()
        plan = decide(snapshot, now)
        if plan.defer_since is not None:
            self._deferrals[request] = plan.defer_since
        executor = Executor(self.writer, sandbox, self.expectations, self.events)
        try:
            return await self._run(request, snapshot, plan, executor, now)
        except SandboxGone as gone:
            log.info("sandbox %s/%s deleted mid-pass (%s)", request.namespace, request.name, gone)
            executor.sandbox_writes.clear()
            return self._gone(request)
        except NamespaceTerminating as going:
            # Not an error (as for a ReplicaSet): the namespace and this Sandbox are being deleted.
            log.debug("sandbox %s/%s: namespace being deleted (%s)", request.namespace, request.name, going)
            return Result()
        finally:
            if executor.sandbox_writes:
                self._own_writes.remember(SANDBOX, executor.sandbox_writes[-1])

    async def _run(
        self, request: Request, snapshot: Snapshot, plan: Plan, executor: Executor, now: datetime
    ) -> Result:
        trace = await executor.run_step(plan.trace)
        if not trace.ok:
            raise SandboxReconcileError(trace.error or "failed to set trace context annotation")
        results = await self._execute(plan, executor, snapshot, now)
        replanned = results.pod.replanned
        if replanned is not None and replanned.deferred_wait is not None:
            self._deferrals.setdefault(request, now)  # the AlreadyExists replan deferred a Pod patch
        conclusion = conclude(snapshot, plan, results, self.now())
        if conclusion.clear_deferral:
            self._deferrals.pop(request, None)
        elif conclusion.status_deferred:
            self._deferrals.setdefault(request, now)
        if conclusion.write_behind:
            self._write_behind.add(request)
        else:
            self._write_behind.discard(request)
        errors = list(conclusion.errors)
        if conclusion.status_patch is not None and not conclusion.sandbox_deleted:
            try:
                await executor.write_status(conclusion.status_patch)
            except KubeError as exc:
                errors.append(f"failed to patch sandbox status: {error_text(exc)}")
        if errors:
            if conclusion.retry_after is not None and len(errors) == len(conclusion.errors):
                # Reported in the status already; what ends it is no event of ours (`StepPlan.retry_after`).
                log.info(
                    "sandbox %s: %s; looked at again in %gs",
                    request,
                    "; ".join(errors),
                    conclusion.retry_after,
                )
                return Result(requeue_after=conclusion.retry_after)
            if conclusion.waiting and len(errors) == len(conclusion.errors):
                raise SandboxWaiting("\n".join(errors))
            raise SandboxReconcileError("\n".join(errors))
        return Result(requeue_after=conclusion.requeue_after)

    async def _execute(self, plan: Plan, executor: Executor, snapshot: Snapshot, now: datetime) -> Results:
        if plan.mode is PlanMode.EXPIRE_TEARDOWN:
            return Results(teardown=tuple([await executor.run_step(step) for step in plan.teardown]))
        if plan.mode is not PlanMode.RECONCILE:
            return Results()
        with self.tracing.start_span("reconcilePVCs"):
            pvcs = await executor.run_step(plan.pvcs)
        with self.tracing.start_span("reconcilePod"):
            pod = await executor.run_step(
                plan.pod, on_pod_exists=lambda existing: plan_existing_pod(snapshot, existing, now)
            )
        if plan.events:
            await executor.run_step(StepPlan(plan.events))
        service = await executor.run_step(plan.service) if plan.service is not None else StepResult()
        return Results(pvcs=pvcs, pod=pod, service=service)
