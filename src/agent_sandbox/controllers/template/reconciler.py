"""SandboxTemplate reconciler (controllers spec §2): observe -> decide -> execute.

observe: the template and its `<template>-network-policy` from the informer cache, overlaid with the
answers of this reconciler's own writes (`kube.OwnWrites`); decide: `decide.py`; execute: `execute.py`.
A missing template ends the pass (the policy is garbage-collected with it). Upstream emits no Events (§2);
ours emit one: a Warning `FailedCreate` on the template when its NetworkPolicy create is refused (quota,
admission), so `kubectl describe sandboxtemplate` says why its Sandboxes run without their default-deny
policy (warmpool-quirks.md, difference 14).

Why the overlay: the ref-hash label patch (§2 step 3) re-queues the template at once, and that second
pass usually runs before the informer has delivered the NetworkPolicy the first pass created. Read from
the cache alone it would create the policy again (a 409 `AlreadyExists`, once logged as a reconcile
error with a stack trace for most new templates). With the overlay it sees the created policy and
writes nothing. While the overlay stands in for a policy the cache does not show yet, the pass requeues
after `CACHE_LAG_REQUEUE` seconds: the overlay cannot tell "not delivered yet" from "delivered and
deleted since", so a policy deleted in that window is recreated once the overlay expires
(`OVERLAY_TTL`) instead of waiting for an unrelated event.

Cache lag the overlay does not cover (a restart between the create and its watch event, another
writer) still ends in a 409; `execute` reports it as `Outcome.CACHE_LAG` and the pass requeues quietly
(no error log, `result="requeue_after"`), as the Sandbox and claim controllers do for their creates.
Every other failure is raised for backoff.
"""

from __future__ import annotations

from typing import Final

from agent_sandbox.api import constants as c
from agent_sandbox.api.meta import controlled_by
from agent_sandbox.kube import (
    NETWORK_POLICY,
    SANDBOX_TEMPLATE,
    Client,
    EventSink,
    NotFound,
    NullEventRecorder,
    Object,
    OwnWrites,
    Request,
    Result,
    Tracing,
)

from .decide import TemplateSnapshot, decide, policy_name
from .execute import Outcome, execute

__all__ = ["CACHE_LAG_REQUEUE", "OVERLAY_TTL", "TemplateReconciler"]

CACHE_LAG_REQUEUE: Final = 0.5
"""Seconds until the next look while the cache is behind this controller's writes (no error)."""
OVERLAY_TTL: Final = 5.0
"""Seconds a write's answer may stand in for the cache: far above the informer's usual lag (milliseconds),
short enough that a policy deleted before its creation reached the cache is recreated soon."""


class TemplateReconciler:
    """Keeps the shared NetworkPolicy and the ref-hash label of every SandboxTemplate in shape."""

    def __init__(
        self, client: Client, *, tracing: Tracing | None = None, events: EventSink | None = None
    ) -> None:
        """Args: client: reads from the cache, writes to the API; tracing: span factory (no-op default);
        events: recorder reporting as `sandboxtemplate-controller` (default: discard)."""
        self._client = client
        self._events = events or NullEventRecorder()
        self._tracing = tracing or Tracing()
        self._own_writes = OwnWrites(ttl=OVERLAY_TTL)

    async def observe(self, request: Request) -> TemplateSnapshot | None:
        """The template and its policy (cache, or our newer write); None when the template is gone."""
        ns, name = request.namespace, request.name
        try:
            cached = await self._client.get(SANDBOX_TEMPLATE, name, namespace=ns)
        except NotFound:
            self._own_writes.forget(SANDBOX_TEMPLATE, ns, name)
            self._own_writes.forget(NETWORK_POLICY, ns, policy_name(name))
            return None
        template = self._own_writes.view(SANDBOX_TEMPLATE, ns, name, cached) or cached
        try:
            cached_policy: Object | None = await self._client.get(
                NETWORK_POLICY, policy_name(name), namespace=ns
            )
        except NotFound:
            cached_policy = None
        policy = self._own_writes.view(NETWORK_POLICY, ns, policy_name(name), cached_policy)
        if policy is not cached_policy and not controlled_by(policy, uid=template["metadata"].get("uid", "")):
            # Written for an earlier template of this name (deleted and recreated since): not ours now.
            self._own_writes.forget(NETWORK_POLICY, ns, policy_name(name))
            policy = cached_policy
        return TemplateSnapshot(
            template, policy, policy_uncached=cached_policy is None and policy is not None
        )

    async def reconcile(self, request: Request) -> Result:
        snap = await self.observe(request)
        if snap is None:
            return Result()
        parent = (snap.template["metadata"].get("annotations") or {}).get(c.ANNOTATION_TRACE_CONTEXT)
        with self._tracing.start_span("ReconcileSandboxTemplate", parent=parent):
            outcome = await execute(
                decide(snap),
                self._client,
                namespace=request.namespace,
                template_name=request.name,
                own_writes=self._own_writes,
                on_refused_create=lambda note: self._events.event(
                    snap.template, "Warning", c.EVENT_FAILED_CREATE, "Creating", note
                ),
            )
        if outcome is Outcome.CACHE_LAG or snap.policy_uncached:
            return Result(requeue_after=CACHE_LAG_REQUEUE)
        return Result()
