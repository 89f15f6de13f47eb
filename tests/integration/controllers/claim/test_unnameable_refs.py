"""A claim whose pool (or its pool's template) has a name no object can have gets its terminal answer.

kube-apiserver refuses a GET by a name that is not a URL path segment (".", "..", anything with "%") with
400 BadRequest. The claim controller asked for such a pool or template uncached and retried the 400 with
backoff forever, leaving the claim with no status; an SDK waiting for Ready timed out. Such a name is
"not found" (controllers spec §4.4, §4.10), as upstream's cached lookup reports it.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import SANDBOX_CLAIM, SANDBOX_WARM_POOL, ApiClient
from tests.helpers import eventually
from tests.integration.controllers.builders import claim_body, pool_body

pytestmark = pytest.mark.integration

UNNAMEABLE = {"pct-dots": "%2e%2e", "dots": "..", "dot": ".", "bad-escape": "%zz"}


async def _ready(kube: ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    claim = await kube.get(SANDBOX_CLAIM, name, namespace=ns)
    for cond in (claim.get("status") or {}).get("conditions") or ():
        if cond["type"] == "Ready":
            found: dict[str, Any] = cond
            return found
    return None


async def test_unnameable_pool_and_template_refs_are_not_found(
    kube: ApiClient, namespace: str, controller: Started
) -> None:
    ns = namespace
    for claim_name, pool in UNNAMEABLE.items():
        await kube.create(SANDBOX_CLAIM, claim_body(claim_name, pool=pool), namespace=ns)
    await kube.create(SANDBOX_WARM_POOL, pool_body("pool", replicas=0, template="%2e%2e"), namespace=ns)
    await kube.create(SANDBOX_CLAIM, claim_body("via-pool", pool="pool"), namespace=ns)

    for claim_name, pool in UNNAMEABLE.items():
        ready = await eventually(lambda n=claim_name: _ready(kube, ns, n), f"{claim_name}: a Ready condition")
        assert (ready["status"], ready["reason"], ready["message"]) == (
            "False",
            c.REASON_WARM_POOL_NOT_FOUND,
            f'SandboxWarmPool "{pool}" not found',
        )
    ready = await eventually(lambda: _ready(kube, ns, "via-pool"), "via-pool: a Ready condition")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        c.REASON_TEMPLATE_NOT_FOUND,
        'SandboxTemplate "%2e%2e" not found',
    )
    # No retry loop behind the answer: the controller logged no error for these claims.
    errors = [
        line
        for line in controller.log.read_text(errors="replace").splitlines()
        if '"level":"error"' in line and f'"namespace":"{ns}"' in line
    ]
    assert errors == []
