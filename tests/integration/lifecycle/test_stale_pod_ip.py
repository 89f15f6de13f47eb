"""Resume on request for clients that send the Sandbox's old pod IP (`X-Sandbox-Pod-IP`), on the real control
plane with the real controller and router (`--cache-enabled --sandbox-lifecycle`).

Upstream's SDK reads the pod IP once, sends it with every request and drops it only after a 5xx; our SDK's
gRPC path sends it too. A suspended or hibernated Sandbox that asked for `auto-resume` has no pod, so the
address its client holds is its former pod's: the request is held while the Sandbox resumes (or is restored)
and answered by the new pod, exactly as a request by name. Until December 6 it was refused after 2 s with
403 `X-Sandbox-Pod-IP ... does not belong to sandbox ...` and nothing was resumed, so a hibernated Sandbox
could never come back for upstream's SDK. An address that is another Sandbox's stays refused (403), and no
restore is requested for it.
"""

from __future__ import annotations

import asyncio
import json
import os
from subprocess import PIPE
from typing import Any

import aiohttp
import grpc
import orjson
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import hibernate
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import POD, SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient, Object
from agent_sandbox.router import Router
from agent_sandbox.router._routing import Route
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import (
    get_or_none,
    metric_value,
    pool_body,
    ready_ip,
    router_metrics,
    runtime_template,
)
from tests.integration.lifecycle.test_resume import AUTO, StartRouter, runtime_sandbox, suspend_and_wait
from tests.integration.lifecycle.test_resume_grpc import HOSTNAME
from tests.integration.runtime.helpers import ProcessClient
from tests.upstream_sdk import ensure_upstream_sdk

pytestmark = pytest.mark.integration

HOSTNAME_COMMAND = "sh -c 'echo $HOSTNAME'"


async def via_pod_ip(
    http: aiohttp.ClientSession, router: Router, sandbox: str, namespace: str, ip: str
) -> tuple[int, str]:
    """Legacy `POST /execute` through the router naming the Sandbox and the pod IP, as upstream's SDK does:
    (status, stdout when 200 else the `detail`)."""
    headers = {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": namespace, "X-Sandbox-Pod-IP": ip}
    url = f"http://127.0.0.1:{router.http_port}/execute"
    data = orjson.dumps({"command": HOSTNAME_COMMAND})
    async with http.post(url, data=data, headers=headers) as resp:
        body: dict[str, Any] = await resp.json(content_type=None)
        return resp.status, str(body.get("stdout") if resp.status == 200 else body.get("detail"))


async def served_via_pod_ip(
    http: aiohttp.ClientSession, router: Router, sandbox: str, namespace: str, ip: str
) -> None:
    """The request with the current pod IP is served (once the router's Pod cache has the pod)."""

    async def served() -> bool:
        return await via_pod_ip(http, router, sandbox, namespace, ip) == (200, f"{sandbox}\n")

    await eventually(served, f"{sandbox} served through the router with its pod IP")


async def archived(kube: ApiClient, ns: str, name: str) -> None:
    async def probe() -> bool:
        gone = await get_or_none(kube, SANDBOX, name, ns) is None
        return gone and await get_or_none(kube, lc.ARCHIVE, name, ns) is not None

    await eventually(probe, f"{name} hibernated")


async def sandbox_holding(kube: ApiClient, ip: str) -> str | None:
    """The Sandbox (`ns/name`) whose pod has `ip` now, in any namespace."""
    for pod in await kube.list(POD):
        if (pod.get("status") or {}).get("podIP") != ip:
            continue
        for owner in pod["metadata"].get("ownerReferences") or []:
            if owner.get("kind") == "Sandbox":
                return f"{pod['metadata']['namespace']}/{owner['name']}"
    return None


async def keep_address(kube: ApiClient, namespace: str, ip: str) -> None:
    """Create plain pods (no Sandbox's) until one holds `ip`, so no other Sandbox's pod (a parallel test's) takes
    the freed address before the request that names it: kwok hands freed addresses out again soon. The
    restored pod then gets a new address, so the old one is stale indeed. Best effort: another pod may take
    it first (`expect_served` says what that means)."""
    for i in range(6):
        name = f"placeholder-{i}"
        spec = {"containers": [{"name": "c", "image": "busybox"}]}
        await kube.create(POD, {"metadata": {"name": name}, "spec": spec}, namespace=namespace)

        async def pod_ip(name: str = name) -> str | None:
            value: str | None = ((await kube.get(POD, name, namespace=namespace)).get("status") or {}).get(
                "podIP"
            )
            return value

        if await eventually(pod_ip, f"{name} pod IP") == ip:
            return


async def expect_served(
    kube: ApiClient, answer: tuple[int, str], sandbox: str, namespace: str, ip: str
) -> None:
    """`answer` is the restored Sandbox's, unless another Sandbox's pod took the old address meanwhile (a
    parallel test's, despite `keep_address`): then it is refused as that Sandbox's, never proxied to it."""
    holder = await sandbox_holding(kube, ip)
    if holder is not None and holder != f"{namespace}/{sandbox}":
        detail = f"X-Sandbox-Pod-IP {ip} does not belong to sandbox {namespace}/{sandbox}."
        assert answer == (403, detail)
    else:
        assert answer == (200, f"{sandbox}\n")


async def test_the_old_pod_ip_of_a_hibernated_sandbox_restores_it(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("ip-sleeper", AUTO), namespace=namespace)
    ip = await ready_ip(kube, namespace, "ip-sleeper")
    await served_via_pod_ip(http, router, "ip-sleeper", namespace, ip)
    await hibernate(kube, "ip-sleeper", namespace)
    await archived(kube, namespace, "ip-sleeper")
    await keep_address(kube, namespace, ip)

    answer = await via_pod_ip(http, router, "ip-sleeper", namespace, ip)
    await expect_served(kube, answer, "ip-sleeper", namespace, ip)
    if answer[0] == 200:
        restored = await kube.get(SANDBOX, "ip-sleeper", namespace=namespace)
        assert restored["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
        metrics = await router_metrics(router)
        assert metric_value(metrics, "sandbox_router_lifecycle_resumes_total", result="restored") == 1


async def test_the_old_pod_ip_of_a_suspended_sandbox_resumes_it(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("ip-wake", AUTO), namespace=namespace)
    ip = await ready_ip(kube, namespace, "ip-wake")
    await served_via_pod_ip(http, router, "ip-wake", namespace, ip)
    await suspend_and_wait(kube, namespace, "ip-wake")
    await keep_address(kube, namespace, ip)

    answer = await via_pod_ip(http, router, "ip-wake", namespace, ip)
    await expect_served(kube, answer, "ip-wake", namespace, ip)
    if answer[0] == 200:
        sandbox = await kube.get(SANDBOX, "ip-wake", namespace=namespace)
        assert sandbox["spec"]["operatingMode"] == "Running"
        assert sandbox["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"


@pytest.mark.parametrize("away", ["hibernated", "suspended"])
async def test_a_router_that_never_saw_the_old_pod_resumes_the_sandbox_too(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession, away: str
) -> None:
    """A router started (or another replica) after the Sandbox went away does not know the address was the
    Sandbox's: the Sandbox has no pod and resumes on request, so the address predates its going away; the
    request is held as one by name, and the address is never dialled. (A suspended one the router sees
    Suspended was held first already, and then refused the address it did not know.)"""
    first = await start_router()
    name = f"ip-late-{away[:3]}"
    await kube.create(SANDBOX, runtime_sandbox(name, AUTO), namespace=namespace)
    ip = await ready_ip(kube, namespace, name)
    await served_via_pod_ip(http, first, name, namespace, ip)
    if away == "hibernated":
        await hibernate(kube, name, namespace)
        await archived(kube, namespace, name)
    else:
        await suspend_and_wait(kube, namespace, name)
    await keep_address(kube, namespace, ip)
    late = await start_router()

    answer = await via_pod_ip(http, late, name, namespace, ip)
    await expect_served(kube, answer, name, namespace, ip)


@pytest.mark.parametrize("away", ["hibernated", "suspended"])
async def test_another_sandboxes_pod_ip_is_refused_and_restores_nothing(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession, away: str
) -> None:
    """Refused before any hold: a suspended Sandbox the router has seen Suspended is held before it is resolved
    (not to the pod a suspend is taking away), and until December 6 it was resumed first and only then refused
    the address (`resume-reason: Request` for a request that was never going to be served)."""
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("ip-mine", AUTO), namespace=namespace)
    await kube.create(SANDBOX, runtime_sandbox("ip-theirs", {}), namespace=namespace)
    await ready_ip(kube, namespace, "ip-mine")
    theirs = await ready_ip(kube, namespace, "ip-theirs")
    await served_via_pod_ip(http, router, "ip-theirs", namespace, theirs)
    if away == "hibernated":
        await hibernate(kube, "ip-mine", namespace)
        await archived(kube, namespace, "ip-mine")
    else:
        await suspend_and_wait(kube, namespace, "ip-mine")
        assert router.lifecycle is not None
        lifecycle = router.lifecycle
        mine = Route("ip-mine", namespace, 8888)

        async def seen() -> bool:
            return lifecycle.seen_suspended(mine)

        await eventually(seen, "the router sees ip-mine Suspended")

    detail = f"X-Sandbox-Pod-IP {theirs} does not belong to sandbox {namespace}/ip-mine."
    assert await via_pod_ip(http, router, "ip-mine", namespace, theirs) == (403, detail)
    if away == "hibernated":
        archive = await kube.get(lc.ARCHIVE, "ip-mine", namespace=namespace)
        assert not (archive.get("spec") or {}).get("restore")  # nothing was asked of the controller
        assert await get_or_none(kube, SANDBOX, "ip-mine", namespace) is None
    else:
        sandbox = await kube.get(SANDBOX, "ip-mine", namespace=namespace)
        assert sandbox["spec"]["operatingMode"] == "Suspended"  # not resumed
        assert lc.ANNOTATION_RESUME_REASON not in (sandbox["metadata"].get("annotations") or {})


async def test_the_old_pod_ip_of_a_sandbox_that_did_not_ask_is_a_connect_failure(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """Not auto-resumed: answered as a request by name (502, upstream's answer to a dead address, after which
    upstream's SDK drops the address), not 403 (which it keeps the address after)."""
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("ip-plain", {}), namespace=namespace)
    ip = await ready_ip(kube, namespace, "ip-plain")
    await served_via_pod_ip(http, router, "ip-plain", namespace, ip)
    await suspend_and_wait(kube, namespace, "ip-plain")
    await keep_address(kube, namespace, ip)
    answer = await via_pod_ip(http, router, "ip-plain", namespace, ip)
    if await sandbox_holding(kube, ip) is None:
        assert answer == (502, "Could not connect to the backend sandbox: ip-plain")
    sandbox = await kube.get(SANDBOX, "ip-plain", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Suspended"


async def test_a_grpc_call_with_the_old_pod_ip_restores_a_hibernated_sandbox(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """Our SDK's gRPC path sends the pod IP too: it got `PERMISSION_DENIED` for a hibernated Sandbox."""
    router = await start_router("--enable-h2c")
    await kube.create(SANDBOX, runtime_sandbox("grpc-ip", AUTO), namespace=namespace)
    ip = await ready_ip(kube, namespace, "grpc-ip")
    await served_via_pod_ip(http, router, "grpc-ip", namespace, ip)
    await hibernate(kube, "grpc-ip", namespace)
    await archived(kube, namespace, "grpc-ip")
    await keep_address(kube, namespace, ip)
    metadata = (
        ("x-sandbox-id", "grpc-ip"),
        ("x-sandbox-namespace", namespace),
        ("x-sandbox-port", "9090"),
        ("x-sandbox-pod-ip", ip),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        try:
            resp = await ProcessClient(channel).execute_call(HOSTNAME, timeout=90, metadata=metadata)
            answer = (200 if resp.exit_code == 0 else -1, resp.stdout.decode())
        except grpc.aio.AioRpcError as err:
            denied = err.code() == grpc.StatusCode.PERMISSION_DENIED
            answer = (
                403 if denied else -1,
                f"{err.code()}: {err.details()}" if not denied else err.details() or "",
            )
    await expect_served(kube, answer, "grpc-ip", namespace, ip)


async def test_a_grpc_call_with_another_sandboxes_pod_ip_resumes_nothing(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """The h2c path holds a Sandbox seen Suspended before resolving too: refused first (`PERMISSION_DENIED`)."""
    router = await start_router("--enable-h2c")
    await kube.create(SANDBOX, runtime_sandbox("grpc-mine", AUTO), namespace=namespace)
    await kube.create(SANDBOX, runtime_sandbox("grpc-theirs", {}), namespace=namespace)
    await ready_ip(kube, namespace, "grpc-mine")
    theirs = await ready_ip(kube, namespace, "grpc-theirs")
    await served_via_pod_ip(http, router, "grpc-theirs", namespace, theirs)
    await suspend_and_wait(kube, namespace, "grpc-mine")
    assert router.lifecycle is not None
    lifecycle = router.lifecycle
    mine = Route("grpc-mine", namespace, 9090)

    async def seen() -> bool:
        return lifecycle.seen_suspended(mine)

    await eventually(seen, "the router sees grpc-mine Suspended")
    metadata = (
        ("x-sandbox-id", "grpc-mine"),
        ("x-sandbox-namespace", namespace),
        ("x-sandbox-port", "9090"),
        ("x-sandbox-pod-ip", theirs),
    )
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ProcessClient(channel).execute_call(HOSTNAME, timeout=90, metadata=metadata)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (
        err.value.details() == f"X-Sandbox-Pod-IP {theirs} does not belong to sandbox {namespace}/grpc-mine."
    )
    sandbox = await kube.get(SANDBOX, "grpc-mine", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Suspended"  # not resumed
    assert lc.ANNOTATION_RESUME_REASON not in (sandbox["metadata"].get("annotations") or {})


# Upstream's published SDK, unchanged, through the router: create a claim from pool argv[3], run a command
# (its first request resolves and keeps the pod IP), print the Sandbox's name, wait for a line on stdin (the
# test hibernates the Sandbox meanwhile), run again with the address it kept.
_UPSTREAM = r"""
import json, sys
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
router, ns, pool = sys.argv[1:4]
client = SandboxClient(connection_config=SandboxDirectConnectionConfig(api_url=router))
sb = client.create_sandbox(pool, namespace=ns, sandbox_ready_timeout=90)
r = sb.commands.run("sh -c 'echo $HOSTNAME'")
print(json.dumps({"name": sb.sandbox_id, "before": [r.stdout, r.exit_code]}), flush=True)
sys.stdin.readline()
try:
    r = sb.commands.run("sh -c 'echo $HOSTNAME'", timeout=90)
    after = [r.stdout, r.exit_code]
except Exception as exc:
    after = [type(exc).__name__, str(exc)[:500]]
print(json.dumps({"after": after}), flush=True)
sb.terminate()
"""


async def test_upstream_sdk_reaches_its_hibernated_sandbox_again(
    kube: ApiClient, namespace: str, start_router: StartRouter, cluster: DevCluster
) -> None:
    python = ensure_upstream_sdk()
    router = await start_router()
    template: Object = runtime_template("ip-tmpl", annotations=AUTO)
    await kube.create(SANDBOX_TEMPLATE, template, namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body("ip-pool", "ip-tmpl", 1), namespace=namespace)
    proc = await asyncio.create_subprocess_exec(
        str(python),
        "-c",
        _UPSTREAM,
        f"http://127.0.0.1:{router.http_port}",
        namespace,
        "ip-pool",
        stdin=PIPE,
        stdout=PIPE,
        stderr=PIPE,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(180):
            line = await proc.stdout.readline()
            assert line, (await proc.communicate())[1].decode()
            first = json.loads(line)
            name = first["name"]
            assert first["before"] == [f"{name}\n", 0]
            ip = await ready_ip(kube, namespace, name)
            await hibernate(kube, name, namespace)
            await archived(kube, namespace, name)
            await keep_address(kube, namespace, ip)
            out, err = await proc.communicate(b"go\n")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    after = json.loads(out.decode().strip().splitlines()[-1])["after"]
    holder = await sandbox_holding(kube, ip)
    if holder is None or holder == f"{namespace}/{name}":
        assert after == [f"{name}\n", 0], err.decode()


@pytest.mark.parametrize("h2c", [False, True])
async def test_a_request_refused_for_another_sandboxes_pod_ip_is_not_activity(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession, h2c: bool
) -> None:
    """A request the router refuses (403, another sandbox's address) never reached the Sandbox, so it must not
    keep it from its idle suspend: until December 6 the activity was written before the address was checked."""
    router = await start_router(*(["--enable-h2c"] if h2c else []))
    idle = {lc.ANNOTATION_IDLE_TIMEOUT: "1h"}
    await kube.create(SANDBOX, runtime_sandbox("act-mine", idle), namespace=namespace)
    await kube.create(SANDBOX, runtime_sandbox("act-theirs", {}), namespace=namespace)
    await ready_ip(kube, namespace, "act-mine")
    theirs = await ready_ip(kube, namespace, "act-theirs")
    await served_via_pod_ip(http, router, "act-theirs", namespace, theirs)
    assert router.lifecycle is not None
    sandboxes = router.lifecycle.state.sandboxes

    async def seen() -> bool:
        view = sandboxes.get((namespace, "act-mine"))
        return view is not None and lc.ANNOTATION_IDLE_TIMEOUT in view.annotations

    await eventually(seen, "the router sees act-mine with its idle timeout")
    detail = f"X-Sandbox-Pod-IP {theirs} does not belong to sandbox {namespace}/act-mine."
    if h2c:
        metadata = (
            ("x-sandbox-id", "act-mine"),
            ("x-sandbox-namespace", namespace),
            ("x-sandbox-port", "9090"),
            ("x-sandbox-pod-ip", theirs),
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await ProcessClient(channel).execute_call(HOSTNAME, timeout=30, metadata=metadata)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, detail)
    else:
        assert await via_pod_ip(http, router, "act-mine", namespace, theirs) == (403, detail)
    await asyncio.sleep(1)  # a background flush of noted activity, had there been one
    sandbox = await kube.get(SANDBOX, "act-mine", namespace=namespace)
    assert lc.ANNOTATION_LAST_ACTIVITY not in (sandbox["metadata"].get("annotations") or {})
