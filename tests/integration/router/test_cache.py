"""The Pod cache on a real control plane: resolution by name and UID, warm-pool members, suspend/resume,
sandbox-membership of `X-Sandbox-Pod-IP`, and TokenReview against the real API server.

The real `agent-sandbox-controller --extensions` turns Sandboxes and warm pools into Pods, kwok makes them
Ready on 127.x addresses, and each test binds a real HTTP server to a pod's address as the sandbox's
runtime (until the dev cluster's local runner serves them). The router is in-process, with its cache
watching the cluster through the real API server.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient, Object
from agent_sandbox.router import Router
from tests import helpers

from .conftest import Backend, raw_request, request_bytes

pytestmark = pytest.mark.integration

EXT = "extensions.agents.x-k8s.io/v1beta1"
PORT = 8888
eventually = functools.partial(helpers.eventually, within=60.0)


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    started = start_controller(cluster)
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture
async def cached_router(
    start_router: Callable[..., Awaitable[Router]], cluster: DevCluster, controller: Started
) -> Router:
    return await start_router(
        "--cache-enabled",
        f"--kubeconfig={cluster.kubeconfig}",
        "--upstream-retry-initial-delay=50ms",
        "--upstream-retry-max-delay=100ms",
    )


def sandbox_body(name: str) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "runtime"}]}}},
    }


async def sandbox_pod(kube: ApiClient, ns: str, sandbox: str, *, not_ip: str | None = None) -> Object:
    """The Ready pod of a Sandbox (optionally: one whose IP differs from `not_ip`)."""

    async def probe() -> Object | None:
        for pod in await kube.list(POD, namespace=ns):
            owners = pod["metadata"].get("ownerReferences") or []
            ip = (pod.get("status") or {}).get("podIP")
            if (
                any(o.get("name") == sandbox for o in owners)
                and helpers.is_ready(pod)
                and ip
                and ip != not_ip
            ):
                return pod
        return None

    return await eventually(probe, f"a Ready pod of {sandbox}")


async def call(router: Router, headers: dict[str, str], path: str = "/hello") -> tuple[int, Any]:
    resp = await raw_request(router.http_port or 0, request_bytes("GET", path, headers))
    try:
        body: Any = json.loads(resp.body)
    except ValueError:
        body = resp.body
    return resp.status, body


async def test_resolution_by_name_uid_and_pod_ip(
    cached_router: Router,
    kube: ApiClient,
    namespace: str,
    start_backend: Callable[..., Awaitable[Backend]],
) -> None:
    await kube.create(SANDBOX, sandbox_body("alpha"), namespace=namespace)
    await kube.create(SANDBOX, sandbox_body("beta"), namespace=namespace)
    alpha, beta = await sandbox_pod(kube, namespace, "alpha"), await sandbox_pod(kube, namespace, "beta")
    alpha_ip, beta_ip = alpha["status"]["podIP"], beta["status"]["podIP"]
    assert alpha_ip.startswith("127.")
    assert alpha_ip != beta_ip
    alpha_backend = await start_backend(alpha_ip, PORT)
    await start_backend(beta_ip, PORT)
    uid = next(o["uid"] for o in alpha["metadata"]["ownerReferences"] if o["kind"] == "Sandbox")
    base = {"X-Sandbox-ID": "alpha", "X-Sandbox-Namespace": namespace}

    async def reaches_alpha(headers: dict[str, str]) -> bool:
        status, body = await call(cached_router, headers)
        return status == 200 and body["headers"] and dict(body["headers"])["Host"] == f"{alpha_ip}:{PORT}"

    await eventually(lambda: reaches_alpha(base), "alpha by name through the cache")
    assert await reaches_alpha({**base, "X-Sandbox-UID": uid})
    assert await reaches_alpha({**base, "X-Sandbox-Pod-IP": alpha_ip})
    assert len(alpha_backend.seen) >= 3
    # Another sandbox's pod IP, or its UID, under alpha's name: refused, not proxied.
    assert await call(cached_router, {**base, "X-Sandbox-Pod-IP": beta_ip}) == (
        403,
        {"detail": f"X-Sandbox-Pod-IP {beta_ip} does not belong to sandbox {namespace}/alpha."},
    )
    beta_uid = next(o["uid"] for o in beta["metadata"]["ownerReferences"] if o["kind"] == "Sandbox")
    status, body = await call(cached_router, {**base, "X-Sandbox-UID": beta_uid})
    assert (status, body["detail"]) == (
        403,
        f"X-Sandbox-UID {beta_uid} does not belong to sandbox {namespace}/alpha.",
    )
    # A loopback address that is no sandbox's (the API server's, say) is refused even though
    # --allow-loopback-pod-ip is on: with the cache, loopback pod IPs are accepted only as a sandbox's.
    status, body = await call(cached_router, {**base, "X-Sandbox-Pod-IP": "127.0.0.1"})
    assert (status, body) == (
        403,
        {"detail": f"X-Sandbox-Pod-IP 127.0.0.1 does not belong to sandbox {namespace}/alpha."},
    )
    assert len(alpha_backend.seen) == 3
    # Unknown sandboxes are a connect failure, never a DNS lookup of some other Service.
    assert await call(
        cached_router,
        {"X-Sandbox-ID": "kubernetes", "X-Sandbox-Namespace": "default", "X-Sandbox-Port": "443"},
    ) == (
        502,
        {"detail": "Could not connect to the backend sandbox: kubernetes"},
    )


async def test_suspend_and_resume_re_resolve(
    cached_router: Router,
    kube: ApiClient,
    namespace: str,
    start_backend: Callable[..., Awaitable[Backend]],
) -> None:
    await kube.create(SANDBOX, sandbox_body("gamma"), namespace=namespace)
    old = await sandbox_pod(kube, namespace, "gamma")
    old_ip = old["status"]["podIP"]
    await start_backend(old_ip, PORT)
    headers = {"X-Sandbox-ID": "gamma", "X-Sandbox-Namespace": namespace}

    async def status_of(h: dict[str, str]) -> int:
        return (await call(cached_router, h))[0]

    await eventually(lambda: _eq(status_of(headers), 200), "gamma reachable")
    # Suspend: the pod goes away; by name it is now a connect failure (after retries), not a stale dial.
    await kube.patch(SANDBOX, "gamma", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)
    await eventually(lambda: _eq(status_of(headers), 502), "suspended gamma unreachable")
    # kwok hands a freed address out again at once; a plain pod (no sandbox's) takes it, so the resumed
    # pod gets a new one and the old address is held by something the router must never dial.
    placeholder = {"metadata": {"name": "placeholder"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    await kube.create(POD, placeholder, namespace=namespace)

    async def placeholder_ip() -> str | None:
        ip: str | None = (
            (await kube.get(POD, "placeholder", namespace=namespace)).get("status", {}).get("podIP")
        )
        return ip

    held = await eventually(placeholder_ip, "placeholder pod IP")
    await kube.patch(SANDBOX, "gamma", {"spec": {"operatingMode": "Running"}}, namespace=namespace)
    new = await sandbox_pod(kube, namespace, "gamma", not_ip=old_ip)
    new_ip = new["status"]["podIP"]
    new_backend = await start_backend(new_ip, PORT)
    await eventually(lambda: _eq(status_of(headers), 200), "resumed gamma reachable by name")
    # A client still holding the old pod IP is re-resolved to the resumed pod, never sent to the old address.
    assert held == old_ip, "kwok did not reuse the freed address; the stale-IP case is not exercised"
    status, body = await call(cached_router, {**headers, "X-Sandbox-Pod-IP": old_ip})
    assert status == 200
    assert dict(body["headers"])["Host"] == f"{new_ip}:{PORT}"
    assert new_backend.seen


async def _eq(value: Awaitable[int], want: int) -> bool:
    return await value == want


async def test_warm_pool_members_by_uid_only(
    cached_router: Router,
    kube: ApiClient,
    namespace: str,
    start_backend: Callable[..., Awaitable[Backend]],
) -> None:
    template = {
        "apiVersion": EXT,
        "kind": "SandboxTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "runtime"}]}}},
    }
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    pool = {
        "apiVersion": EXT,
        "kind": "SandboxWarmPool",
        "metadata": {"name": "pool"},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "tmpl"}},
    }
    await kube.create(SANDBOX_WARM_POOL, pool, namespace=namespace)

    async def member_pod() -> Object | None:
        for pod in await kube.list(POD, namespace=namespace):
            labels = pod["metadata"].get("labels") or {}
            if (
                "agents.x-k8s.io/warm-pool-sandbox" in labels
                and helpers.is_ready(pod)
                and pod["status"].get("podIP")
            ):
                return pod
        return None

    pod = await eventually(member_pod, "a Ready warm-pool member pod")
    owner = next(o for o in pod["metadata"]["ownerReferences"] if o["kind"] == "Sandbox")
    backend = await start_backend(pod["status"]["podIP"], PORT)
    by_uid = {"X-Sandbox-ID": owner["name"], "X-Sandbox-Namespace": namespace, "X-Sandbox-UID": owner["uid"]}
    await eventually(lambda: _eq(_status(cached_router, by_uid), 200), "pool member reachable by UID")
    by_name = {"X-Sandbox-ID": owner["name"], "X-Sandbox-Namespace": namespace}
    assert (await call(cached_router, by_name))[0] == 502  # unclaimed members are not reachable by name
    assert backend.seen


async def _status(router: Router, headers: dict[str, str]) -> int:
    return (await call(router, headers))[0]


async def test_tokenreview_against_the_api_server(
    start_router: Callable[..., Awaitable[Router]],
    cluster: DevCluster,
    kube: ApiClient,
    namespace: str,
    backend: Backend,
) -> None:
    router = await start_router(
        "--authz-mode=tokenreview",
        "--authz-tokenreview-audiences=sandbox-router",
        "--authz-tokenreview-require-token",
        f"--kubeconfig={cluster.kubeconfig}",
    )
    admin = cluster.admin()
    status, _ = admin.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "caller"}}
    )
    assert status == 201

    def token(audience: str) -> str:
        status, body = admin.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/caller/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": [audience], "expirationSeconds": 600},
            },
        )
        assert status == 201, body
        value: str = body["status"]["token"]
        return value

    good, wrong_audience = token("sandbox-router"), token("someone-else")
    assert (await call(router, backend.headers(Authorization=f"Bearer {good}")))[0] == 200
    assert await call(router, backend.headers(Authorization=f"Bearer {wrong_audience}")) == (
        401,
        {"detail": "unauthenticated"},
    )
    assert await call(router, backend.headers(Authorization="Bearer not-a-token")) == (
        401,
        {"detail": "unauthenticated"},
    )
    assert await call(router, backend.headers()) == (401, {"detail": "unauthenticated"})
    reviews = router.proxy.authorizer.reviews  # type: ignore[union-attr]
    for _ in range(3):
        assert (await call(router, backend.headers(Authorization=f"Bearer {good}")))[0] == 200
    assert router.proxy.authorizer.reviews == reviews  # type: ignore[union-attr]  # verdicts are cached
