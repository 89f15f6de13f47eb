"""A hibernated Sandbox whose SandboxTemplate (which asked for `auto-resume`) was deleted while it slept is still
restored on request through the router, with its data, on the real control plane: the lifecycle controller
records the template's `auto-resume` on the archive when it archives. Until December 7 the request got
upstream's 502 "Could not connect" and nothing was restored, while the claim's `SandboxHibernated` condition
said a request through the router restores it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import hibernate
from agent_sandbox.kube import SANDBOX, SANDBOX_TEMPLATE, ApiClient
from agent_sandbox.router import Router
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import get_or_none, ready_ip, runtime_template, through
from tests.integration.lifecycle.test_hibernate import archived, pvc_sandbox

pytestmark = pytest.mark.integration

StartRouter = Callable[..., Awaitable[Router]]


async def test_restored_on_request_after_its_template_was_deleted(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    template = runtime_template("tp", annotations={lc.ANNOTATION_AUTO_RESUME: "true"})
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    # As the claim controller makes it: the Sandbox names its template, and inherits its settings.
    body = pvc_sandbox("kept", {c.ANNOTATION_SANDBOX_TEMPLATE_REF: "tp"})
    await kube.create(SANDBOX, body, namespace=namespace)
    ip = await ready_ip(kube, namespace, "kept")
    async with http.put(f"http://{ip}:8080/v1/files/keep.txt", data=b"kept") as resp:
        assert resp.status == 204
    await hibernate(kube, "kept", namespace)
    archive = await archived(kube, namespace, "kept")
    assert archive["metadata"]["annotations"][lc.ANNOTATION_TEMPLATE_AUTO_RESUME] == "true"
    await kube.delete(SANDBOX_TEMPLATE, "tp", namespace=namespace)

    async def router_sees_it_hibernated_without_its_template() -> bool:
        assert router.lifecycle is not None
        state = router.lifecycle.state
        key = (namespace, "kept")
        return (
            key in state.archives and key not in state.sandboxes and (namespace, "tp") not in state.templates
        )

    await eventually(router_sees_it_hibernated_without_its_template, "the router seeing the template gone")
    status, body = await through(http, router, "kept", namespace, command="cat keep.txt")
    assert (status, body.get("stdout")) == (200, "kept"), body
    restored = await get_or_none(kube, SANDBOX, "kept", namespace)
    assert restored is not None
    assert restored["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
