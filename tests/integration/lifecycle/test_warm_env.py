"""Warm claims that keep per-claim env, on the real control plane with the real controller and runner.

A template that projects `runtime.agents.x-k8s.io/claim-env` (downward API) keeps claims with env warm: the
claim adopts a pool member (no new Pod), the env reaches the runtime through the pod annotation, and the
very first command already sees it (the runtime waits for its delivery). The same claim on a template
without the projection is cold-started, as upstream does. What differs from a cold start: the container's
own process environment (the pod spec) does not carry the claim's variables.
"""

from __future__ import annotations

import aiohttp
import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.lifecycle import ANNOTATION_CLAIM_ENV
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_CLAIM, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from tests.helpers import eventually, is_ready
from tests.integration.lifecycle.helpers import (
    claim_body,
    execute,
    get_or_none,
    pool_body,
    ready_ip,
    runtime_template,
)

pytestmark = pytest.mark.integration

ENV = [{"name": "API_KEY", "value": "k-123"}, {"name": "MODE", "value": "fast mode"}]


async def _ready_pool_member(kube: ApiClient, ns: str, pool: str) -> str:
    async def probe() -> str | None:
        for sb in await kube.list(SANDBOX, namespace=ns):
            owners = sb["metadata"].get("ownerReferences") or []
            if any(o.get("name") == pool for o in owners) and is_ready(sb):
                return str(sb["metadata"]["name"])
        return None

    return await eventually(probe, f"a Ready member of pool {pool}", within=90)


async def _bound(kube: ApiClient, ns: str, claim: str) -> str:
    async def probe() -> str | None:
        cl = await get_or_none(kube, SANDBOX_CLAIM, claim, ns)
        name = (((cl or {}).get("status") or {}).get("sandbox") or {}).get("name")
        return str(name) if cl is not None and is_ready(cl) and name else None

    return await eventually(probe, f"claim {claim} Ready", within=90)


async def test_claim_with_env_stays_warm_and_every_command_sees_it(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(
        SANDBOX_TEMPLATE,
        runtime_template("env", claim_env=True, envVarsInjectionPolicy="Allowed"),
        namespace=namespace,
    )
    await kube.create(SANDBOX_WARM_POOL, pool_body("env-pool", "env", 1), namespace=namespace)
    member = await _ready_pool_member(kube, namespace, "env-pool")
    member_pod = await kube.get(POD, member, namespace=namespace)

    await kube.create(SANDBOX_CLAIM, claim_body("warm", "env-pool", env=ENV), namespace=namespace)
    bound = await _bound(kube, namespace, "warm")
    assert bound == member  # adopted, not created
    sandbox = await kube.get(SANDBOX, bound, namespace=namespace)
    assert sandbox["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == c.LAUNCH_TYPE_WARM
    ip = await ready_ip(kube, namespace, bound)
    # Straight after Ready: the runtime holds the command until the env has arrived, never runs it without.
    body = await execute(http, ip, "sh -c 'echo $API_KEY/$MODE'")
    assert body["stdout"] == "k-123/fast mode\n"
    pod = await kube.get(POD, bound, namespace=namespace)
    assert pod["metadata"]["uid"] == member_pod["metadata"]["uid"]  # the same Pod: no restart
    assert pod["metadata"]["annotations"][ANNOTATION_CLAIM_ENV] == '{"API_KEY":"k-123","MODE":"fast mode"}'
    # What differs from a cold start: the container's own environment (pod spec) is the template's.
    runtime = pod["spec"]["containers"][0] if "containers" in pod["spec"] else {}
    assert not any(v.get("name") == "API_KEY" for v in runtime.get("env") or [])


async def test_same_claim_on_a_template_without_the_projection_is_cold(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    await kube.create(
        SANDBOX_TEMPLATE, runtime_template("plain", envVarsInjectionPolicy="Allowed"), namespace=namespace
    )
    await kube.create(SANDBOX_WARM_POOL, pool_body("plain-pool", "plain", 1), namespace=namespace)
    member = await _ready_pool_member(kube, namespace, "plain-pool")
    await kube.create(SANDBOX_CLAIM, claim_body("cold", "plain-pool", env=ENV), namespace=namespace)
    bound = await _bound(kube, namespace, "cold")
    assert bound == "cold"
    assert bound != member
    sandbox = await kube.get(SANDBOX, bound, namespace=namespace)
    assert sandbox["metadata"]["labels"][c.LABEL_LAUNCH_TYPE] == c.LAUNCH_TYPE_COLD
    assert ANNOTATION_CLAIM_ENV not in (sandbox["spec"]["podTemplate"]["metadata"].get("annotations") or {})
    body = await execute(http, await ready_ip(kube, namespace, bound), "sh -c 'echo $API_KEY'")
    assert body["stdout"] == "k-123\n"  # upstream's way: in the container's environment


async def test_an_env_edit_of_a_bound_claim_obeys_the_templates_policy(
    kube: ApiClient, namespace: str, controller: Started, http: aiohttp.ClientSession
) -> None:
    """Until December 6 a bound claim's env edit reached the Pod (and every later command) whatever the
    template's envVarsInjectionPolicy said: `Disallowed` ran the injected variable. Now the edit is refused
    with the policy's reason and the Pod keeps the env it had."""
    await kube.create(
        SANDBOX_TEMPLATE,
        runtime_template("deny", claim_env=True, envVarsInjectionPolicy="Disallowed"),
        namespace=namespace,
    )
    await kube.create(SANDBOX_WARM_POOL, pool_body("deny-pool", "deny", 1), namespace=namespace)
    await _ready_pool_member(kube, namespace, "deny-pool")
    await kube.create(SANDBOX_CLAIM, claim_body("edited", "deny-pool"), namespace=namespace)
    bound = await _bound(kube, namespace, "edited")
    ip = await ready_ip(kube, namespace, bound)
    await kube.patch(
        SANDBOX_CLAIM,
        "edited",
        {"spec": {"env": [{"name": "INJECTED", "value": "yes"}]}},
        namespace=namespace,
    )

    async def refused() -> str | None:
        cl = await kube.get(SANDBOX_CLAIM, "edited", namespace=namespace)
        ready = next(
            (x for x in (cl.get("status") or {}).get("conditions") or [] if x["type"] == "Ready"), {}
        )
        return str(ready["reason"]) if ready.get("reason") == "EnvVarsInjectionRejected" else None

    assert await eventually(refused, "the env edit refused", within=30) == "EnvVarsInjectionRejected"
    pod = await kube.get(POD, bound, namespace=namespace)
    assert pod["metadata"]["annotations"][ANNOTATION_CLAIM_ENV] == "{}"
    body = await execute(http, ip, "sh -c 'echo [$INJECTED]'")
    assert body["stdout"] == "[]\n"
