"""SandboxTemplate controller vs. its own informer lag (controllers spec §2 steps 3 and 8), on a real control plane.

The ref-hash label patch of a new template re-queues it; that second pass often runs before the informer
has delivered the NetworkPolicy the first pass created. It must not try to create the policy again (or,
when it does, must treat the `AlreadyExists` as cache lag): no reconcile error, no error-level log line.
This module has its own controller process (the `controller` fixture is per module), so its error
counter starts at zero.

Unrelated NetworkPolicies are patched in a loop meanwhile: a busy NetworkPolicy watch delays the
policy's event behind the template's, as a loaded API server does. Without it the race shows on a quiet
local control plane only now and then; with it the old code logged an AlreadyExists for most templates.
"""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import naming
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import NETWORK_POLICY, SANDBOX_TEMPLATE, ApiClient, NotFound, Object
from tests.helpers import controller_metrics, eventually
from tests.integration.controllers.builders import template_body

pytestmark = pytest.mark.integration

TEMPLATES = 30


def sample(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        have = dict(kv.split("=", 1) for kv in line[len(name) + 1 : line.rindex("}")].split(",") if "=" in kv)
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def unrelated_policy(name: str) -> Object:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {"podSelector": {"matchLabels": {"unrelated": name}}, "policyTypes": ["Ingress"]},
    }


async def test_new_templates_reconcile_without_errors(
    kube: ApiClient, namespace: str, cluster: DevCluster, controller: Started
) -> None:
    ns = namespace
    names = [f"t-{i}" for i in range(TEMPLATES)]
    busy = [await kube.create(NETWORK_POLICY, unrelated_policy(f"busy-{i}"), namespace=ns) for i in range(4)]
    stop_flood = asyncio.Event()

    async def flood(name: str) -> None:
        n = 0
        while not stop_flood.is_set():
            n += 1
            patch = {"metadata": {"annotations": {"bump": str(n)}}}
            await kube.patch(NETWORK_POLICY, name, patch, namespace=ns)

    floods = [asyncio.create_task(flood(p["metadata"]["name"])) for p in busy]
    try:
        for name in names:
            await kube.create(SANDBOX_TEMPLATE, template_body(name), namespace=ns)
            await asyncio.sleep(0.05)
    finally:
        stop_flood.set()
        await asyncio.gather(*floods)

    async def converged() -> bool:
        for name in names:
            tmpl = await kube.get(SANDBOX_TEMPLATE, name, namespace=ns)
            labels = tmpl["metadata"].get("labels") or {}
            if labels.get(c.LABEL_SANDBOX_TEMPLATE_REF_HASH) != naming.name_hash(name):
                return False
            try:
                await kube.get(NETWORK_POLICY, f"{name}-network-policy", namespace=ns)
            except NotFound:
                return False
        return True

    await eventually(converged, "every template labelled with its NetworkPolicy")

    def settled() -> str | None:
        # Every pass has ended (nothing active) and the label patch's own events were processed.
        text = controller_metrics(cluster)
        active = sample(text, "controller_runtime_active_workers", controller="sandboxtemplate")
        return text if active == 0 else None

    async def quiet() -> str | None:
        return await asyncio.to_thread(settled)

    await asyncio.sleep(1)  # the second passes (label-patch events) run within this
    text = await eventually(quiet, "the template controller idle", within=10)
    assert sample(text, "controller_runtime_reconcile_errors_total", controller="sandboxtemplate") == 0
    assert (
        sample(text, "controller_runtime_reconcile_total", controller="sandboxtemplate", result="error") == 0
    )
    assert sample(text, "controller_runtime_reconcile_total", controller="sandboxtemplate") >= TEMPLATES
