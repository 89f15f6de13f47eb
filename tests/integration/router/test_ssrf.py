"""The router reaches sandboxes only: a pod that is not a Sandbox's is never a target (router SSRF).

Real control plane, real controller, the dev cluster's runner serving the runtime on each runtime pod's
127.x IP, and the real router with its Pod cache. Next to a real Sandbox stands an impostor: a bare Pod
running the same runtime image and wearing the `agents.x-k8s.io/sandbox-name-hash` label of a Sandbox
of its own name, but with no Sandbox owning it (any user allowed to create Pods can make one). Neither
naming it as a sandbox nor naming its address under a real sandbox's name reaches it.

The other SSRF refusals are covered elsewhere: metadata, loopback, link-local and multicast addresses in
`X-Sandbox-Pod-IP` (tests/integration/router/test_malformed.py, tests/unit/router/test_routing.py),
another sandbox's pod IP or UID and unknown names (test_cache.py::test_resolution_by_name_uid_and_pod_ip),
other namespaces with a scoped token (test_malformed.py::test_scoped_token_refusals).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from agent_sandbox.api import constants as c
from agent_sandbox.api.naming import name_hash
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox.kube import POD, SANDBOX, ApiClient, Object
from agent_sandbox.router import Router
from tests import helpers
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.router.conftest import with_identity
from tests.integration.router.test_cache import answered_by, controller, execute, sandbox_body, sandbox_pod

pytestmark = pytest.mark.integration

__all__ = ["controller"]  # the module-scoped controller fixture, used here through `cached_router`


@pytest.fixture
async def cached_router(
    start_router: Callable[..., Awaitable[Router]], cluster: DevCluster, controller: Started
) -> Router:
    return await start_router(*with_identity(cluster, "--cache-enabled"))


def impostor_body(name: str) -> Object:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {c.LABEL_SANDBOX_NAME_HASH: name_hash(name)}},
        "spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]},
    }


async def test_a_pod_that_is_no_sandboxs_is_never_a_target(
    cached_router: Router, kube: ApiClient, namespace: str
) -> None:
    ns = namespace
    await kube.create(SANDBOX, sandbox_body("alpha"), namespace=ns)
    await kube.create(POD, impostor_body("impostor"), namespace=ns)
    await sandbox_pod(kube, ns, "alpha")

    async def impostor_ip() -> str | None:
        pod = await kube.get(POD, "impostor", namespace=ns)
        ip = (pod.get("status") or {}).get("podIP")
        return str(ip) if helpers.is_ready(pod) and ip else None

    ip = await helpers.eventually(impostor_ip, "the impostor pod Ready with an IP", within=60)
    assert ip.startswith("127."), ip  # served by the runner: a request that reached it would succeed
    base = {"X-Sandbox-ID": "alpha", "X-Sandbox-Namespace": ns}

    async def alpha_by_name() -> bool:
        return await answered_by(cached_router, base) == "alpha"

    await helpers.eventually(alpha_by_name, "alpha by name through the cache")

    # By name: the impostor is not a sandbox, so it is not resolved (a connect failure, no DNS guess).
    status, body = await execute(cached_router, {"X-Sandbox-ID": "impostor", "X-Sandbox-Namespace": ns})
    assert (status, body) == (502, {"detail": "Could not connect to the backend sandbox: impostor"})
    # By address, under a real sandbox's name: refused before any connection.
    status, body = await execute(cached_router, {**base, "X-Sandbox-Pod-IP": ip})
    assert (status, body) == (
        403,
        {"detail": f"X-Sandbox-Pod-IP {ip} does not belong to sandbox {ns}/alpha."},
    )
    # By address, under its own name: it is no sandbox's address.
    status, body = await execute(cached_router, {"X-Sandbox-ID": "impostor", "X-Sandbox-Namespace": ns,
                                                 "X-Sandbox-Pod-IP": ip})  # fmt: skip
    assert (status, body) == (
        403,
        {"detail": f"X-Sandbox-Pod-IP {ip} does not belong to sandbox {ns}/impostor."},
    )
    # The impostor does answer when called directly: the refusals above are the router's doing.
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{ip}:8888/execute", json={"command": "sh -c 'echo $HOSTNAME'"}) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["stdout"].strip() == "impostor"
