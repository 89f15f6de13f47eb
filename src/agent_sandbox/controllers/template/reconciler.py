"""SandboxTemplate reconciler (controllers spec §2): observe -> decide -> execute.

observe: the template and its `<template>-network-policy` from the informer cache; decide: `decide.py`;
execute: `execute.py`. A missing template ends the pass (the policy is garbage-collected with it). No
success path requeues; every failure is raised for backoff. No Events are emitted (§2).
"""

from __future__ import annotations

from agent_sandbox.api import constants as c
from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, Client, NotFound, Request, Result, Tracing

from .decide import TemplateSnapshot, decide, policy_name
from .execute import execute

__all__ = ["TemplateReconciler"]


class TemplateReconciler:
    """Keeps the shared NetworkPolicy and the ref-hash label of every SandboxTemplate in shape."""

    def __init__(self, client: Client, *, tracing: Tracing | None = None) -> None:
        """Args: client: reads from the cache, writes to the API; tracing: span factory (no-op default)."""
        self._client = client
        self._tracing = tracing or Tracing()

    async def observe(self, request: Request) -> TemplateSnapshot | None:
        """The template and its policy from the cache; None when the template is gone."""
        try:
            template = await self._client.get(SANDBOX_TEMPLATE, request.name, namespace=request.namespace)
        except NotFound:
            return None
        try:
            policy = await self._client.get(
                NETWORK_POLICY, policy_name(request.name), namespace=request.namespace
            )
        except NotFound:
            policy = None
        return TemplateSnapshot(template, policy)

    async def reconcile(self, request: Request) -> Result:
        snap = await self.observe(request)
        if snap is None:
            return Result()
        parent = (snap.template["metadata"].get("annotations") or {}).get(c.ANNOTATION_TRACE_CONTEXT)
        with self._tracing.start_span("ReconcileSandboxTemplate", parent=parent):
            await execute(decide(snap), self._client, namespace=request.namespace, template_name=request.name)
        return Result()
