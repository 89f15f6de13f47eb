"""A warmPoolRef (or the pool's sandboxTemplateRef) no object can be named is "not found", not an error.

The API server refuses a GET whose name is not a valid path segment (".", "..", or containing "/" or "%":
apimachinery's `IsValidPathSegmentName`) with 400 BadRequest, before looking anything up. No object can
have such a name, so the claim gets the terminal WarmPoolNotFound / TemplateNotFound its author needs
(controllers spec §4.4, §4.10), as upstream's cached lookup gives, instead of no status and a retry loop.
The in-memory API here answers such GETs with the API server's 400.
"""

from __future__ import annotations

import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.kube import SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, BadRequest, ResourceKind
from tests.unit.controllers.claim.builders import NS, T0, World, claim, claim_ready, pool

pytestmark = pytest.mark.unit

UNNAMEABLE = [".", "..", "%2e%2e", "%zz", "a%2Fb", "a/b"]


def refuse_like_the_api_server(world: World, kind: ResourceKind, name: str) -> None:
    """GETs of `name` answer what kube-apiserver answers for a name that is not a path segment."""
    world.fake.inject_error(
        "get",
        BadRequest(400, "BadRequest", f"Name parameter invalid: {name!r}"),
        kind=kind,
        name=name,
        times=100,
    )


def gets(world: World, kind: ResourceKind) -> list[str | None]:
    return [n for v, k, _ns, n in world.fake.actions if v == "get" and k == kind.kind]


@pytest.mark.parametrize("name", UNNAMEABLE)
async def test_a_warm_pool_ref_no_object_can_have_is_warm_pool_not_found(name: str) -> None:
    world = World((SANDBOX_CLAIM, claim(pool_name=name)))
    world.observed.record(NS, "c1", "c1-uid", T0)
    refuse_like_the_api_server(world, SANDBOX_WARM_POOL, name)
    result = await world.reconcile()
    assert result.requeue_after == 60.0
    ready = claim_ready(world.get(SANDBOX_CLAIM, "c1"))
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", c.REASON_WARM_POOL_NOT_FOUND)
    assert ready["message"] == f'SandboxWarmPool "{name}" not found'
    assert gets(world, SANDBOX_WARM_POOL) == []  # known without asking


@pytest.mark.parametrize("name", UNNAMEABLE)
async def test_a_template_ref_no_object_can_have_is_template_not_found(name: str) -> None:
    world = World((SANDBOX_WARM_POOL, pool(tmpl=name)), (SANDBOX_CLAIM, claim()))
    world.observed.record(NS, "c1", "c1-uid", T0)
    refuse_like_the_api_server(world, SANDBOX_TEMPLATE, name)
    result = await world.reconcile()
    assert result.requeue_after == 60.0
    ready = claim_ready(world.get(SANDBOX_CLAIM, "c1"))
    assert ready is not None
    assert (ready["status"], ready["reason"]) == ("False", c.REASON_TEMPLATE_NOT_FOUND)
    assert ready["message"] == f'SandboxTemplate "{name}" not found'
    assert gets(world, SANDBOX_TEMPLATE) == []


async def test_an_ordinary_missing_name_is_still_asked_for() -> None:
    """The cache-lag lookup stays for names that can exist (a claim may beat its pool's watch event)."""
    world = World((SANDBOX_CLAIM, claim(pool_name="later")))
    world.observed.record(NS, "c1", "c1-uid", T0)
    await world.reconcile()
    assert gets(world, SANDBOX_WARM_POOL) == ["later"]
    assert claim_ready(world.get(SANDBOX_CLAIM, "c1"))["reason"] == c.REASON_WARM_POOL_NOT_FOUND  # type: ignore[index]
