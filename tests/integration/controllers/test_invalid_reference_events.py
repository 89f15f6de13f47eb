"""An invalid reference is a condition reason (claims) and an Event (pools and claims): additive quirks.

Real control plane and the real `agent-sandbox-controller --extensions` process. A probe (tenant10) found a
pool whose `sandboxTemplateRef` names no template silent (replicas 0, no Event, no log line: the schema has no
conditions), and a claim whose pool does not exist showing `Ready=False/WarmPoolNotFound` but nothing under
Events. Upstream emits neither Event (controllers spec §5.10); docs/design/warmpool-quirks.md and
claim-quirks.md list them. Both are once per episode: the claim's retry passes add nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import EVENT, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient, Object
from tests.helpers import controller_metrics, eventually
from tests.integration.controllers.builders import claim_body, pool_body, pool_members, template_body

pytestmark = pytest.mark.integration


async def _events(kube: ApiClient, ns: str, name: str, reporter: str, reason: str) -> list[Object]:
    return [
        e
        for e in await kube.list(EVENT, namespace=ns)
        if (e.get("regarding") or {}).get("name") == name
        and e.get("reportingController") == reporter
        and e.get("reason") == reason
    ]


def _claim_passes(cluster: DevCluster) -> float:
    """Claim reconciles so far (any result), from the controller's /metrics."""
    total = 0.0
    for line in controller_metrics(cluster).splitlines():
        if line.startswith("controller_runtime_reconcile_total{") and 'controller="sandboxclaim"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_pool_whose_template_is_missing_says_so_once_and_again_when_it_appears(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    reporter = "sandboxwarmpool-controller"
    pool = await kube.create(SANDBOX_WARM_POOL, pool_body("pool", 1, "tmpl"), namespace=ns)

    async def warning() -> list[Object]:
        return await _events(kube, ns, "pool", reporter, "SandboxTemplateNotFound")

    (got,) = await eventually(warning, "a SandboxTemplateNotFound event on the pool", within=60)
    assert got["type"] == "Warning"
    assert got["action"] == "Reconciling"
    assert got["regarding"]["uid"] == pool["metadata"]["uid"]
    assert got["note"] == (
        f'SandboxTemplate "tmpl" not found in namespace "{ns}"; no sandboxes are created until it exists'
    )

    await kube.create(SANDBOX_TEMPLATE, template_body("tmpl"), namespace=ns)

    async def normal() -> list[Object]:
        return await _events(kube, ns, "pool", reporter, "SandboxTemplateFound")

    (found,) = await eventually(normal, "a SandboxTemplateFound event on the pool", within=60)
    assert found["type"] == "Normal"
    assert found["note"] == f'SandboxTemplate "tmpl" found in namespace "{ns}"'

    async def members() -> list[Object]:
        return await pool_members(kube, ns)

    await eventually(members, "the pool's member", within=60)
    # The pool's status writes re-ran it while the template was missing: still one Warning, no series.
    (again,) = await warning()
    assert not again.get("series"), again


async def test_a_claim_whose_pool_is_missing_has_one_warning_event_over_its_retries(
    kube: ApiClient, namespace: str, cluster: DevCluster, controller: Started
) -> None:
    ns = namespace
    reporter = "sandboxclaim-controller"
    claim = await kube.create(SANDBOX_CLAIM, claim_body("lost", pool="nopool"), namespace=ns)

    async def warning() -> list[Object]:
        return await _events(kube, ns, "lost", reporter, "WarmPoolNotFound")

    (got,) = await eventually(warning, "a WarmPoolNotFound event on the claim", within=60)
    assert got["type"] == "Warning"
    assert got["regarding"]["uid"] == claim["metadata"]["uid"]
    assert got["note"] == 'SandboxWarmPool "nopool" not found'

    # Retry passes: every claim update is one (the 1 min requeue would be too slow for a test).
    for i in range(3):
        before = await asyncio.to_thread(_claim_passes, cluster)
        patch = {"metadata": {"annotations": {"test/poke": str(i)}}}
        await kube.patch(SANDBOX_CLAIM, "lost", patch, namespace=ns)

        async def passed(before: float = before) -> bool:
            return await asyncio.to_thread(_claim_passes, cluster) > before

        await eventually(passed, f"claim pass {i + 1}", within=30)

    # A later, different invalid reference: once its Event is there, anything the retries emitted is too.
    await kube.create(SANDBOX_WARM_POOL, pool_body("nopool", 0, "notemplate"), namespace=ns)

    async def template_warning() -> list[Object]:
        return await _events(kube, ns, "lost", reporter, "TemplateNotFound")

    (tmpl,) = await eventually(template_warning, "a TemplateNotFound event on the claim", within=60)
    assert tmpl["type"] == "Warning"
    assert tmpl["note"] == 'SandboxTemplate "notemplate" not found'
    (once,) = await warning()
    assert not once.get("series"), once
