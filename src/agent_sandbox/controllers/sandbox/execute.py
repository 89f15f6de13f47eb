"""Thin executor of Sandbox plans: one API call per action (controllers spec §1.3-§1.11).

Owns: running a step's actions in order and stopping the step at its first failure (later steps still
run), translating API errors into the step's error text, the expectation bookkeeping around creates and
Pod deletes, the one place where execution feeds back into decision (a Pod create answered AlreadyExists:
read the Pod live and let `decide.plan_existing_pod` handle it, §1.5.1), Events, and the status write.

Does not own any decision: what to write comes from `decide`/`conclude`. NotFound on a delete is success;
so is a UID-precondition Conflict (the object we meant to delete is already gone, a namesake replaced it).
NotFound on a write to the Sandbox itself ends the pass (`SandboxGone`); so does a child create refused
because the namespace is being deleted (`NamespaceTerminating`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent_sandbox.api.constants import EVENT_FAILED_CREATE
from agent_sandbox.api.errortext import describe_error
from agent_sandbox.kube import (
    POD,
    SANDBOX,
    AlreadyExists,
    Conflict,
    EventSink,
    KubeError,
    NotFound,
    Object,
    PatchType,
    PropagationPolicy,
    ResourceKind,
    error_text,
)
from agent_sandbox.kube.errors import is_namespace_terminating

from .children import FIELD_MANAGER
from .expectations import ChildExpectations
from .plan import (
    Action,
    CreateObject,
    DeleteObject,
    DeleteSandbox,
    EmitEvent,
    PatchObject,
    PatchSandboxMetadata,
    PodPlan,
    StepPlan,
    StepResult,
)

__all__ = ["Executor", "NamespaceTerminating", "SandboxGone", "SandboxWriter", "error_text"]

log = logging.getLogger("agent_sandbox.controllers.sandbox")


class SandboxGone(Exception):
    """A write to the Sandbox itself answered NotFound: it was deleted mid-pass, so the pass has nothing
    left to do (its children go with it by owner reference). Not a reconcile error, as a status patch's
    NotFound is not one; the reconciler ends the pass as if the cache had not shown the Sandbox."""


class NamespaceTerminating(Exception):
    """A child create was refused because the Sandbox's namespace is being deleted.

    Nothing to do, as for a ReplicaSet: the Sandbox and its children go with the namespace, every further
    create would be refused the same way. The reconciler ends the pass quietly (no FailedCreate Event, no
    status write, no retry); the Sandbox's deletion brings the pass that forgets it."""


class SandboxWriter(Protocol):
    """The API calls the executor makes (`kube.ApiClient` and `kube.testing.FakeClient` satisfy it)."""

    async def get(self, kind: ResourceKind, name: str, *, namespace: str | None = None) -> Object: ...

    async def create(
        self,
        kind: ResourceKind,
        obj: Object,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
    ) -> Object: ...

    async def patch(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object: ...

    async def delete(
        self,
        kind: ResourceKind,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: PropagationPolicy | None = None,
        uid: str | None = None,
    ) -> Object: ...

    async def patch_status(
        self,
        kind: ResourceKind,
        name: str,
        patch: Object | Sequence[Object],
        *,
        namespace: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object: ...


@dataclass(slots=True)
class Executor:
    """Executes the steps of one Sandbox's plan.

    Attributes:
        writer: the API client.
        sandbox: the Sandbox (cached object; only its identity is used).
        expectations: creation/deletion records (None: not tracked, e.g. in executor unit tests).
        events: where `EmitEvent` actions go.
        sandbox_writes: the API's answers to this pass's writes of the Sandbox itself, in order (fresher
            than the cache; the reconciler reads its own writes from them).
    """

    writer: SandboxWriter
    sandbox: Object
    expectations: ChildExpectations | None = None
    events: EventSink | None = None
    sandbox_writes: list[Object] = field(default_factory=list)

    @property
    def _ns(self) -> str:
        ns: str = self.sandbox["metadata"].get("namespace") or ""
        return ns

    @property
    def _name(self) -> str:
        name: str = self.sandbox["metadata"]["name"]
        return name

    async def run_step(
        self, step: StepPlan, *, on_pod_exists: Callable[[Object], PodPlan] | None = None
    ) -> StepResult:
        """Run `step`'s actions in order; the first failure ends the step.

        Args:
            step: the step.
            on_pod_exists: called with the live Pod when a Pod create returns AlreadyExists; the returned
                plan replaces the rest of the step (§1.5.1 "treat it as an existing Pod").
        """
        self._expect_creations(step.actions)
        created: Object | None = None
        for index, action in enumerate(step.actions):
            try:
                answer = await self._run(action)
            except AlreadyExists as exc:
                self._abandon_creations(step.actions[index:])
                if on_pod_exists is None or not isinstance(action, CreateObject) or action.kind != POD:
                    return StepResult(index, f"{action.what}: {error_text(exc)}")
                return await self._existing_pod(index, action, on_pod_exists)
            except KubeError as exc:
                self._abandon_creations(step.actions[index:])
                if isinstance(action, CreateObject) and is_namespace_terminating(exc):
                    raise NamespaceTerminating(f"{action.what}: {error_text(exc)}") from exc
                log.info("sandbox %s/%s: %s: %s", self._ns, self._name, action.what, describe_error(exc))
                if isinstance(action, CreateObject) and self.events is not None:
                    # Ours (upstream says it only in the Ready condition): the Warning a ReplicaSet or a
                    # StatefulSet gives for a child it cannot create, for `kubectl describe` and `get events`;
                    # repeats aggregate into the event's series.
                    note = f"{action.what}: {error_text(exc)}"
                    self.events.event(self.sandbox, "Warning", EVENT_FAILED_CREATE, "Creating", note)
                return StepResult(index, f"{action.what}: {error_text(exc)}")
            if isinstance(action, CreateObject):
                created = answer
        return StepResult(created=created)

    async def _existing_pod(
        self, index: int, action: CreateObject, on_pod_exists: Callable[[Object], PodPlan]
    ) -> StepResult:
        name = action.obj["metadata"]["name"]
        try:
            # Live read: the cache did not show this Pod, which is why we tried to create it.
            pod = await self.writer.get(POD, name, namespace=self._ns)
        except KubeError as exc:
            return StepResult(index, f"pod already exists but failed to fetch: {error_text(exc)}")
        replan = on_pod_exists(pod)
        result = await self.run_step(replan)
        return StepResult(result.failed_at, result.error, result.created, replanned=replan)

    def _expect_creations(self, actions: Sequence[Action]) -> None:
        if self.expectations is None:
            return
        counts: dict[ResourceKind, int] = {}
        for action in actions:
            if isinstance(action, CreateObject):
                counts[action.kind] = counts.get(action.kind, 0) + 1
        for kind, count in counts.items():
            self.expectations.expect_creations(kind, self._ns, self._name, count)

    def _abandon_creations(self, actions: Sequence[Action]) -> None:
        if self.expectations is None:
            return
        for action in actions:
            if isinstance(action, CreateObject):
                self.expectations.creations_abandoned(action.kind, self._ns, self._name, 1)

    async def _run(self, action: Action) -> Object | None:
        ns, writer = self._ns, self.writer
        if isinstance(action, CreateObject):
            return await writer.create(action.kind, action.obj, namespace=ns, field_manager=FIELD_MANAGER)
        if isinstance(action, PatchObject):
            return await writer.patch(action.kind, action.name, action.patch, namespace=ns)
        if isinstance(action, PatchSandboxMetadata):
            try:
                answer = await writer.patch(SANDBOX, self._name, action.patch, namespace=ns)
            except NotFound as exc:
                raise SandboxGone(f"{action.what}: {error_text(exc)}") from exc
            self._record_sandbox(answer)
            return answer
        if isinstance(action, DeleteObject):
            return await self._delete(action)
        if isinstance(action, DeleteSandbox):
            try:
                return await writer.delete(SANDBOX, self._name, namespace=ns, uid=action.uid or None)
            except NotFound:
                return None
        if isinstance(action, EmitEvent):
            if self.events is not None:
                self.events.event(self.sandbox, action.type_, action.reason, action.action, action.note)
            return None
        raise TypeError(f"unknown action {action!r}")

    async def _delete(self, action: DeleteObject) -> Object | None:
        track = self.expectations is not None and action.kind == POD
        if track:
            assert self.expectations is not None
            self.expectations.expect_deletion(POD, self._ns, self._name, action.uid)
        try:
            return await self.writer.delete(
                action.kind, action.name, namespace=self._ns, uid=action.uid or None
            )
        except (NotFound, Conflict):
            # Gone already (or replaced by a namesake we must not touch): nothing left to delete.
            if track:
                assert self.expectations is not None
                self.expectations.deletion_abandoned(POD, self._ns, self._name, action.uid)
            return None
        except KubeError:
            if track:
                assert self.expectations is not None
                self.expectations.deletion_abandoned(POD, self._ns, self._name, action.uid)
            raise

    async def write_status(self, patch: Object) -> None:
        """Merge-patch the status subresource without a resourceVersion precondition (§1.11).

        This controller is the only status writer and keys are never reconciled concurrently, so the
        patch is not optimistic. NotFound (Sandbox deleted mid-pass) is ignored.
        """
        try:
            answer = await self.writer.patch_status(SANDBOX, self._name, patch, namespace=self._ns)
        except NotFound:
            return
        self._record_sandbox(answer)

    def _record_sandbox(self, answer: Object) -> None:
        if isinstance(answer, dict) and answer.get("kind") == SANDBOX.kind and answer.get("metadata"):
            self.sandbox_writes.append(answer)
