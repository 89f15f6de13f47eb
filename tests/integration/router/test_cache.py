"""The Pod cache on a real control plane: resolution by name and UID, warm-pool members, suspend/resume,
sandbox-membership of `X-Sandbox-Pod-IP`, and TokenReview against the real API server.

The real `agent-sandbox-controller --extensions` turns Sandboxes and warm pools into Pods; the dev
cluster's local runner serves the project's runtime on each runtime pod's 127.x address (the pod is Ready
only once it answers). Requests go through the router (in-process, its cache watching the cluster through
the real API server) to the legacy runtime's `POST /execute` on port 8888; `$HOSTNAME` (the pod name)
says which pod answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_CLAIM, ApiClient, Object
from agent_sandbox.router import Router
from tests import helpers
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE, create_runtime_pool

from .conftest import Backend, raw_request, request_bytes, with_identity

pytestmark = pytest.mark.integration

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
        *with_identity(
            cluster,
            "--cache-enabled",
            "--upstream-retry-initial-delay=50ms",
            "--upstream-retry-max-delay=100ms",
        )
    )


def sandbox_body(name: str) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {"spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE}]}}},
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


def owner_uid(pod: Object) -> str:
    return str(next(o["uid"] for o in pod["metadata"]["ownerReferences"] if o["kind"] == "Sandbox"))


async def execute(
    router: Router, headers: dict[str, str], command: str = "sh -c 'echo $HOSTNAME'"
) -> tuple[int, Any]:
    """`POST /execute` through the router; (status, JSON body or raw bytes)."""
    body = json.dumps({"command": command}).encode()
    data = request_bytes("POST", "/execute", {**headers, "Content-Type": "application/json"}, body)
    resp = await raw_request(router.http_port or 0, data, within=30)
    try:
        parsed: Any = json.loads(resp.body)
    except ValueError:
        parsed = resp.body
    return resp.status, parsed


async def call(router: Router, headers: dict[str, str]) -> tuple[int, Any]:
    """`GET /hello` through the router; (status, JSON body)."""
    resp = await raw_request(router.http_port or 0, request_bytes("GET", "/hello", headers))
    return resp.status, json.loads(resp.body)


async def answered_by(router: Router, headers: dict[str, str]) -> str | None:
    """The pod name that ran the command, or None when the request did not reach a runtime."""
    status, body = await execute(router, headers)
    return body["stdout"].strip() if status == 200 else None


async def status_of(router: Router, headers: dict[str, str]) -> int:
    return (await execute(router, headers))[0]


async def test_resolution_by_name_uid_and_pod_ip(
    cached_router: Router, kube: ApiClient, namespace: str
) -> None:
    await kube.create(SANDBOX, sandbox_body("alpha"), namespace=namespace)
    await kube.create(SANDBOX, sandbox_body("beta"), namespace=namespace)
    alpha, beta = await sandbox_pod(kube, namespace, "alpha"), await sandbox_pod(kube, namespace, "beta")
    alpha_ip, beta_ip = alpha["status"]["podIP"], beta["status"]["podIP"]
    assert alpha_ip.startswith("127.")
    assert alpha_ip != beta_ip
    base = {"X-Sandbox-ID": "alpha", "X-Sandbox-Namespace": namespace}

    async def alpha_by_name() -> bool:
        return await answered_by(cached_router, base) == "alpha"

    await eventually(alpha_by_name, "alpha by name through the cache")
    status, result = await execute(cached_router, base, "echo hello")
    assert (status, result["stdout"], result["exit_code"]) == (200, "hello\n", 0)
    assert await answered_by(cached_router, {**base, "X-Sandbox-UID": owner_uid(alpha)}) == "alpha"
    assert await answered_by(cached_router, {**base, "X-Sandbox-Pod-IP": alpha_ip}) == "alpha"
    # Another sandbox's pod IP, or its UID, under alpha's name: refused, not proxied.
    assert await execute(cached_router, {**base, "X-Sandbox-Pod-IP": beta_ip}) == (
        403,
        {"detail": f"X-Sandbox-Pod-IP {beta_ip} does not belong to sandbox {namespace}/alpha."},
    )
    beta_uid = owner_uid(beta)
    assert await execute(cached_router, {**base, "X-Sandbox-UID": beta_uid}) == (
        403,
        {"detail": f"X-Sandbox-UID {beta_uid} does not belong to sandbox {namespace}/alpha."},
    )
    # A loopback address that is no sandbox's (the API server's, say) is refused even though
    # --allow-loopback-pod-ip is on: with the cache, loopback pod IPs are accepted only as a sandbox's.
    assert await execute(cached_router, {**base, "X-Sandbox-Pod-IP": "127.0.0.1"}) == (
        403,
        {"detail": f"X-Sandbox-Pod-IP 127.0.0.1 does not belong to sandbox {namespace}/alpha."},
    )
    # Unknown sandboxes are a connect failure, never a DNS lookup of some other Service.
    unknown = {"X-Sandbox-ID": "kubernetes", "X-Sandbox-Namespace": "default", "X-Sandbox-Port": "443"}
    assert await execute(cached_router, unknown) == (
        502,
        {"detail": "Could not connect to the backend sandbox: kubernetes"},
    )


async def test_suspend_and_resume_re_resolve(cached_router: Router, kube: ApiClient, namespace: str) -> None:
    await kube.create(SANDBOX, sandbox_body("gamma"), namespace=namespace)
    old = await sandbox_pod(kube, namespace, "gamma")
    old_ip = old["status"]["podIP"]
    headers = {"X-Sandbox-ID": "gamma", "X-Sandbox-Namespace": namespace}

    async def reachable() -> bool:
        return await status_of(cached_router, headers) == 200

    async def unreachable() -> bool:
        return await status_of(cached_router, headers) == 502

    await eventually(reachable, "gamma reachable")
    # kwok hands a freed address out again soon; plain pods (no sandbox's, no runtime) take addresses until
    # one holds the old one, so the resumed pod gets a new address and the old one answers nothing. Another
    # test's pod may take the address first and free it again before the resume (seen in the parallel
    # suite): then the resumed pod gets the old address back, and the cycle is repeated so the stale-IP case
    # below is always exercised.
    for attempt in range(3):
        # Suspend: the pod goes away; by name it is now a connect failure (after retries), not a stale dial.
        await kube.patch(SANDBOX, "gamma", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)
        await eventually(unreachable, "suspended gamma unreachable")
        await _hold_address(kube, namespace, old_ip, prefix=f"placeholder-{attempt}")
        await kube.patch(SANDBOX, "gamma", {"spec": {"operatingMode": "Running"}}, namespace=namespace)
        resumed = await sandbox_pod(kube, namespace, "gamma")
        if resumed["status"]["podIP"] != old_ip:
            break
    else:
        pytest.fail(f"the resumed pod got the old address {old_ip} back in 3 suspend/resume cycles")
    await eventually(reachable, "resumed gamma reachable by name")
    # A client still holding the old pod IP: while no sandbox holds that address it is re-resolved to the
    # resumed pod ("gamma" means the old address was not dialled); once another sandbox's pod holds it
    # (a parallel test's), it is refused as that sandbox's, never proxied to it.
    stale = {**headers, "X-Sandbox-Pod-IP": old_ip}
    if await _sandbox_holding(kube, old_ip):
        assert await execute(cached_router, stale) == (
            403,
            {"detail": f"X-Sandbox-Pod-IP {old_ip} does not belong to sandbox {namespace}/gamma."},
        )
    else:
        assert await answered_by(cached_router, stale) == "gamma"


async def _sandbox_holding(kube: ApiClient, ip: str) -> bool:
    """Whether a Sandbox's pod (in any namespace) has `ip` now."""
    return any(
        (pod.get("status") or {}).get("podIP") == ip
        and any(o.get("kind") == "Sandbox" for o in pod["metadata"].get("ownerReferences") or [])
        for pod in await kube.list(POD)
    )


async def _hold_address(
    kube: ApiClient, namespace: str, ip: str, attempts: int = 6, *, prefix: str = "placeholder"
) -> str | None:
    """Create plain pods until one gets `ip`; returns its name (None if another pod took the address)."""
    for i in range(attempts):
        name = f"{prefix}-{i}"
        spec = {"containers": [{"name": "c", "image": "busybox"}]}
        await kube.create(POD, {"metadata": {"name": name}, "spec": spec}, namespace=namespace)

        async def pod_ip(name: str = name) -> str | None:
            value: str | None = (
                (await kube.get(POD, name, namespace=namespace)).get("status", {}).get("podIP")
            )
            return value

        if await eventually(pod_ip, f"{name} pod IP") == ip:
            return name
    return None


async def test_warm_pool_members_by_uid_only(cached_router: Router, kube: ApiClient, namespace: str) -> None:
    await create_runtime_pool(kube, namespace, replicas=1)

    async def member_pod() -> Object | None:
        for pod in await kube.list(POD, namespace=namespace):
            labels = pod["metadata"].get("labels") or {}
            if "agents.x-k8s.io/warm-pool-sandbox" in labels and helpers.is_ready(pod):
                return pod
        return None

    pod = await eventually(member_pod, "a Ready warm-pool member pod")
    owner = next(o for o in pod["metadata"]["ownerReferences"] if o["kind"] == "Sandbox")
    by_uid = {"X-Sandbox-ID": owner["name"], "X-Sandbox-Namespace": namespace, "X-Sandbox-UID": owner["uid"]}

    async def reachable_by_uid() -> bool:
        return await answered_by(cached_router, by_uid) == pod["metadata"]["name"]

    await eventually(reachable_by_uid, "pool member reachable by UID")
    by_name = {"X-Sandbox-ID": owner["name"], "X-Sandbox-Namespace": namespace}
    assert await status_of(cached_router, by_name) == 502  # unclaimed members are not reachable by name


async def test_a_claimed_member_is_reachable_by_name_before_its_pod_is_relabelled(
    cached_router: Router, kube: ApiClient, namespace: str
) -> None:
    """While claims keep arriving the controller holds the Pod's relabel (claim-priority, up to 15 s), so a
    claimed member's Pod still carries the pool's label after the claim is Ready. By name (curl, a browser
    through `agent-sandbox proxy`: no `X-Sandbox-Pod-IP`) it was a 502 for as long as that lasted; the
    router now asks the API server whether the Sandbox was claimed. Unclaimed members stay unreachable by
    name (test_warm_pool_members_by_uid_only)."""
    await create_runtime_pool(kube, namespace, replicas=3)

    async def ready_members() -> bool:
        pods = await kube.list(POD, namespace=namespace)
        return sum(1 for p in pods if helpers.is_ready(p)) >= 3

    await eventually(ready_members, "3 Ready pool members")

    def claim(name: str, pool: str = "pool") -> Object:
        return {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": name},
            "spec": {"warmPoolRef": {"name": pool}},
        }

    async def keep_claiming() -> None:
        # Arrivals keep the controller "hot" (deferrable writes held); on a pool that does not exist, so
        # they take no member from the one the claim under test draws from.
        for i in range(200):
            await kube.create(SANDBOX_CLAIM, claim(f"load-{i}", "no-such-pool"), namespace=namespace)
            await asyncio.sleep(0.25)

    load = asyncio.create_task(keep_claiming())
    try:
        await asyncio.sleep(0.6)
        await kube.create(SANDBOX_CLAIM, claim("target"), namespace=namespace)

        async def bound_and_ready() -> str | None:
            status = (await kube.get(SANDBOX_CLAIM, "target", namespace=namespace)).get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
            )
            return (status.get("sandbox") or {}).get("name") if ready else None

        sandbox = await eventually(bound_and_ready, "the claim Ready")
        pod = await sandbox_pod(kube, namespace, sandbox)
        # The case this test is about: the Pod has not been relabelled yet.
        assert "agents.x-k8s.io/warm-pool-sandbox" in (pod["metadata"].get("labels") or {})
        by_name = {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": namespace}
        assert await answered_by(cached_router, by_name) == pod["metadata"]["name"]
    finally:
        load.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await load


async def test_tokenreview_against_the_api_server(
    start_router: Callable[..., Awaitable[Router]],
    cluster: DevCluster,
    kube: ApiClient,
    namespace: str,
    backend: Backend,
) -> None:
    router = await start_router(
        *with_identity(
            cluster,
            "--authz-mode=tokenreview",
            "--authz-tokenreview-audiences=sandbox-router",
            "--authz-tokenreview-require-token",
        )
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


async def test_a_pod_ip_outside_the_cache_is_refused_at_once_saying_why(
    start_router: Callable[..., Awaitable[Router]], cluster: DevCluster, backend: Backend
) -> None:
    """`--cache-namespace`: a Pod IP in a namespace the cache does not watch cannot be checked (the cache
    knows sandbox pods only), so it is refused - at once, saying why. Until December 6 it waited 2 s and was
    refused as another sandbox's address."""
    router = await start_router(*with_identity(cluster, "--cache-enabled", "--cache-namespace=elsewhere"))
    started = time.monotonic()
    status, body = await call(router, backend.headers(**{"X-Sandbox-Namespace": "team"}))
    assert time.monotonic() - started < 1.0
    assert status == 403
    assert "the router's Pod cache does not watch it (--cache-namespace)" in body["detail"]
    assert not backend.seen


def _service_account_token(cluster: DevCluster, namespace: str, name: str) -> str:
    admin = cluster.admin()
    status, _ = admin.request(
        "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}}
    )
    assert status == 201
    status, body = admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    assert status == 201, body
    token: str = body["status"]["token"]
    return token


async def test_a_revoked_token_stops_working_on_its_pinned_h2c_connection(
    start_router: Callable[..., Awaitable[Router]], cluster: DevCluster, namespace: str
) -> None:
    """tokenreview against the API server, gRPC through h2c: each stream is authorized, also one repeating
    the connection's credential. Until December 6 an unchanged header skipped the check, so a revoked
    ServiceAccount token (and an expired scoped token) kept working on a pinned connection. Concurrent calls
    on a new connection ride on its pending review instead of each being refused and retried."""
    from .test_h2c_pinning import OWN_CONNECTION, Sandbox, _who

    router = await start_router(
        *with_identity(
            cluster,
            "--enable-h2c",
            "--authz-mode=tokenreview",
            "--authz-tokenreview-require-token",
            "--authz-tokenreview-ttl=1s",
        )
    )
    token = _service_account_token(cluster, namespace, "caller")
    alpha = Sandbox("alpha")
    await alpha.server.start()
    try:
        metadata = (*alpha.metadata(), ("authorization", f"Bearer {token}"))
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{router.http_port}", options=OWN_CONNECTION
        ) as channel:
            who = _who(channel)
            answers = await asyncio.gather(*(who(b"", metadata=metadata, timeout=10) for _ in range(4)))
            assert answers == [b"alpha"] * 4
            reviews = router.proxy.authorizer.reviews  # type: ignore[union-attr]
            assert reviews == 1  # the concurrent calls waited for the connection's review
            status, _ = cluster.admin().request(
                "DELETE", f"/api/v1/namespaces/{namespace}/serviceaccounts/caller"
            )
            assert status == 200
            # Refused once the router's verdict (1 s) and the API server's own token cache (~10 s) expire;
            # the channel keeps calling meanwhile, as a long-lived gRPC client does.
            refused: grpc.aio.AioRpcError | None = None
            deadline = time.monotonic() + 30
            while refused is None and time.monotonic() < deadline:
                await asyncio.sleep(1)
                try:
                    await who(b"", metadata=metadata, timeout=10)
                except grpc.aio.AioRpcError as err:
                    refused = err
        assert refused is not None, "the revoked token kept working"
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await alpha.server.stop(None)
