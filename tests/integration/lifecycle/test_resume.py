"""Resume on request through the real router (`--sandbox-lifecycle`) on the real control plane.

A request to a suspended Sandbox that asked for `auto-resume` is held until the Sandbox is Ready again, then
served: the client sees one slower response, never an error. Concurrent requests, and requests through two
routers, share one resume. A request that arrives while the Sandbox is being suspended is served too. A
hibernated Sandbox is restored the same way. A Sandbox that cannot start gives a 503 naming the reason; one
that did not ask for it keeps upstream's behaviour (502). Activity is recorded at a bounded rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.cli.lifecycle import hibernate
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.kube import POD, SANDBOX, ApiClient, Object, ResourceKind
from agent_sandbox.router import Router
from tests.helpers import controller_metrics, eventually
from tests.integration.devcluster.runtime_helpers import RUNTIME_IMAGE
from tests.integration.lifecycle.helpers import (
    CLAIM_ENV_MOUNT,
    CLAIM_ENV_VOLUME,
    execute,
    get_or_none,
    metric_value,
    ready_ip,
    router_metrics,
    through,
)

pytestmark = pytest.mark.integration

StartRouter = Callable[..., Awaitable[Router]]
RESOURCE_QUOTA = ResourceKind("", "v1", "ResourceQuota", "resourcequotas")
AUTO = {lc.ANNOTATION_AUTO_RESUME: "true"}


def runtime_sandbox(name: str, annotations: dict[str, str], **container: Any) -> Object:
    return {
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "podTemplate": {
                "spec": {"containers": [{"name": "runtime", "image": RUNTIME_IMAGE, **container}]}
            }
        },
    }


async def suspend_and_wait(kube: ApiClient, ns: str, name: str) -> None:
    await kube.patch(SANDBOX, name, {"spec": {"operatingMode": "Suspended"}}, namespace=ns)

    async def pod_gone() -> bool:
        return await get_or_none(kube, POD, name, ns) is None

    await eventually(pod_gone, f"{name}'s pod gone")


async def test_request_resumes_a_suspended_sandbox(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("wake", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "wake")
    await suspend_and_wait(kube, namespace, "wake")
    start = time.monotonic()
    status, body = await through(http, router, "wake", namespace)
    assert (status, body["stdout"]) == (200, "wake\n")
    assert time.monotonic() - start < 60
    sandbox = await kube.get(SANDBOX, "wake", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Running"
    assert sandbox["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
    metrics = await router_metrics(router)
    assert metric_value(metrics, "sandbox_router_lifecycle_resumes_total", result="resumed") == 1
    assert metric_value(metrics, "sandbox_router_resume_wait_seconds_count", outcome="ready") == 1


async def test_concurrent_requests_through_two_routers_share_one_resume(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    routers = [await start_router(), await start_router()]
    await kube.create(SANDBOX, runtime_sandbox("shared", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "shared")
    await suspend_and_wait(kube, namespace, "shared")
    results = await asyncio.gather(*(through(http, routers[i % 2], "shared", namespace) for i in range(8)))
    assert [status for status, _ in results] == [200] * 8
    assert {body["stdout"] for _, body in results} == {"shared\n"}
    texts = [await router_metrics(r) for r in routers]
    resumed = sum(metric_value(t, "sandbox_router_lifecycle_resumes_total", result="resumed") for t in texts)
    assert resumed == 1  # exactly one write; the other router joined or just waited
    held = sum(metric_value(t, "sandbox_router_resume_wait_seconds_count", outcome="ready") for t in texts)
    assert held == 8


async def test_request_while_the_sandbox_is_being_suspended_is_served(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("racing", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "racing")
    first = await kube.get(POD, "racing", namespace=namespace)
    # As the controller's suspend does; the request goes out while the pod is still terminating.
    await kube.patch(SANDBOX, "racing", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)

    async def terminating() -> bool:
        pod = await get_or_none(kube, POD, "racing", namespace)
        return pod is None or bool(pod["metadata"].get("deletionTimestamp"))

    await eventually(terminating, "the pod terminating")

    async def router_saw_suspend() -> bool:
        # The router's watches may lag the direct reads above; before it sees the suspend, a request is
        # (rightly) proxied to the still-running old pod, which is not the race this test is about. Its Pod
        # cache may still hold the old pod (Ready or not): the request must not go there, nor take it for the
        # resumed one (it used to, when the pod's runtime was still up: a 429 "runtime is shutting down").
        assert router.lifecycle is not None
        view = router.lifecycle.state.sandboxes.get((namespace, "racing"))
        pod = router.lifecycle.cache.by_ip.get(first["status"]["podIP"])
        return view is not None and view.suspended and (pod is None or pod.deleting)

    await eventually(router_saw_suspend, "the router seeing the suspend")
    status, body = await through(http, router, "racing", namespace)
    assert (status, body.get("stdout")) == (200, "racing\n"), body
    second = await kube.get(POD, "racing", namespace=namespace)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]  # served by the resumed pod


async def test_requests_around_the_controllers_idle_suspend_are_all_served(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
) -> None:
    """The race with the real controller: requests that arrive just before, while and after it suspends.

    The gaps straddle the 2 s idle timeout, so some requests meet a Sandbox the controller is deciding to
    suspend (the router's activity write must win or the request be held), some a pod being deleted, some a
    suspended Sandbox; every one of them must be served.
    """
    router = await start_router()
    annotations = {**AUTO, lc.ANNOTATION_IDLE_TIMEOUT: "2s"}
    await kube.create(SANDBOX, runtime_sandbox("edge", annotations), namespace=namespace)
    await ready_ip(kube, namespace, "edge")
    before = metric_value(controller_metrics(cluster), "agent_sandbox_lifecycle_suspends_total", cause="Idle")
    for gap in (1.9, 2.0, 2.1, 2.2, 2.4, 2.0, 2.1, 3.0):
        await asyncio.sleep(gap)
        status, body = await through(http, router, "edge", namespace)
        assert (status, body.get("stdout")) == (200, "edge\n"), f"after {gap}s without requests: {body}"
    suspends = metric_value(
        controller_metrics(cluster), "agent_sandbox_lifecycle_suspends_total", cause="Idle"
    )
    resumed = metric_value(await router_metrics(router), "sandbox_router_lifecycle_resumes_total")
    assert suspends - before >= 1  # the controller did suspend it in between
    assert resumed >= 1  # and requests resumed it


async def test_hibernated_sandbox_is_restored_on_request(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("sleeper", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "sleeper")
    await hibernate(kube, "sleeper", namespace)

    async def archived() -> bool:
        gone = await get_or_none(kube, SANDBOX, "sleeper", namespace) is None
        return gone and await get_or_none(kube, lc.ARCHIVE, "sleeper", namespace) is not None

    await eventually(archived, "sleeper hibernated")
    status, body = await through(http, router, "sleeper", namespace)
    assert (status, body["stdout"]) == (200, "sleeper\n")
    restored = await kube.get(SANDBOX, "sleeper", namespace=namespace)
    assert restored["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
    assert (
        metric_value(
            await router_metrics(router), "sandbox_router_lifecycle_resumes_total", result="restored"
        )
        == 1
    )


async def test_a_sandbox_that_cannot_start_gets_a_clear_503(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    huge = {"resources": {"requests": {"cpu": "1000"}}}  # fits no node
    body = runtime_sandbox("toobig", {**AUTO}, **huge)
    body["spec"]["operatingMode"] = "Suspended"
    await kube.create(SANDBOX, body, namespace=namespace)
    headers = {"X-Sandbox-ID": "toobig", "X-Sandbox-Namespace": namespace}
    async with http.post(
        f"http://127.0.0.1:{router.http_port}/execute", data=b'{"command": "true"}', headers=headers
    ) as resp:
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "5"
        assert resp.headers["Content-Type"] == "application/json"
        detail = (await resp.json())["detail"]
    assert detail.startswith(f"Sandbox {namespace}/toobig could not be resumed: Unschedulable: ")
    assert "Insufficient cpu" in detail


async def test_a_held_request_is_bounded_by_its_own_timeout(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    body = runtime_sandbox("slow", AUTO)
    body["spec"]["operatingMode"] = "Suspended"
    # Its pod, once resumed, takes 30 s to start (the dev cluster's per-pod start delay).
    body["spec"]["podTemplate"]["metadata"] = {
        "annotations": {"devcluster.agents.x-k8s.io/start-after": "30s"}
    }
    await kube.create(SANDBOX, body, namespace=namespace)
    headers = {"X-Sandbox-ID": "slow", "X-Sandbox-Namespace": namespace, "X-Sandbox-Timeout": "2"}
    start = time.monotonic()
    async with http.post(
        f"http://127.0.0.1:{router.http_port}/execute", data=b'{"command": "true"}', headers=headers
    ) as resp:
        status, detail = resp.status, (await resp.json())["detail"]
    assert time.monotonic() - start < 10  # the client's 2 s, not the router's 60 s resume timeout
    assert (status, detail) == (503, f"Sandbox {namespace}/slow is resuming but was not Ready within 2s")
    sandbox = await kube.get(SANDBOX, "slow", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Running"  # the resume goes on for the next request
    metrics = await router_metrics(router)
    assert metric_value(metrics, "sandbox_router_resume_wait_seconds_count", outcome="timeout") == 1


async def test_sandboxes_that_did_not_ask_keep_upstream_behaviour(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("plain", {}), namespace=namespace)
    await ready_ip(kube, namespace, "plain")
    await suspend_and_wait(kube, namespace, "plain")
    status, body = await through(http, router, "plain", namespace)
    assert (status, body) == (502, {"detail": "Could not connect to the backend sandbox: plain"})
    assert (await kube.get(SANDBOX, "plain", namespace=namespace))["spec"]["operatingMode"] == "Suspended"


async def test_activity_is_recorded_at_a_bounded_rate(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router("--sandbox-lifecycle-activity-interval=1s")
    annotations = {lc.ANNOTATION_IDLE_TIMEOUT: "8s"}
    await kube.create(SANDBOX, runtime_sandbox("chatty", annotations), namespace=namespace)
    await ready_ip(kube, namespace, "chatty")
    await kube.create(SANDBOX, runtime_sandbox("quiet-flag", {}), namespace=namespace)
    await ready_ip(kube, namespace, "quiet-flag")
    start = time.monotonic()
    requests = 0
    while time.monotonic() - start < 4:
        assert (await through(http, router, "chatty", namespace, "true"))[0] == 200
        assert (await through(http, router, "quiet-flag", namespace, "true"))[0] == 200
        requests += 1
    await asyncio.sleep(1.5)  # the last batch is flushed
    metrics = await router_metrics(router)
    writes = metric_value(metrics, "sandbox_router_lifecycle_activity_writes_total", result="ok")
    assert requests >= 8
    assert 1 <= writes <= 6  # about one per interval (1 s) over 4 s, whatever the request rate
    sandbox = await kube.get(SANDBOX, "chatty", namespace=namespace)
    assert lc.ANNOTATION_LAST_ACTIVITY in sandbox["metadata"]["annotations"]
    # No idle timeout, no writes.
    quiet = await kube.get(SANDBOX, "quiet-flag", namespace=namespace)
    assert lc.ANNOTATION_LAST_ACTIVITY not in (quiet["metadata"].get("annotations") or {})


async def test_a_quota_refusal_is_named_in_the_503(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    router = await start_router()
    body = runtime_sandbox("over-quota", AUTO)
    body["spec"]["operatingMode"] = "Suspended"
    await kube.create(SANDBOX, body, namespace=namespace)
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}},
    }
    await kube.create(RESOURCE_QUOTA, quota, namespace=namespace)

    async def enforced() -> bool:
        rq = await kube.get(RESOURCE_QUOTA, "no-pods", namespace=namespace)
        return "hard" in (rq.get("status") or {})

    await eventually(enforced, "the quota enforced")
    status, detail = await through(http, router, "over-quota", namespace)
    assert status == 503
    assert detail["detail"].startswith(
        f"Sandbox {namespace}/over-quota could not be resumed: ReconcilerError: "
    )
    assert "exceeded quota" in detail["detail"]


async def test_a_request_to_a_crashed_runtime_waits_for_its_restart_not_the_resume_timeout(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
) -> None:
    """The runtime of a Running Sandbox that resumes on request dies; its container restarts in the same pod.
    A request that meets the dead runtime is held (as for a suspend) and must be served once the same pod is
    Ready again. It used to wait for a pod with another UID, which never came: a 503 after the 60 s resume
    timeout."""
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("phoenix", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "phoenix")
    pod = await kube.get(POD, "phoenix", namespace=namespace)
    assert (await through(http, router, "phoenix", namespace))[0] == 200  # the connection is pooled now
    cluster.crash_runtime(namespace, "phoenix", noticed_after=3.0)  # the pod stays Ready meanwhile
    start = time.monotonic()
    status, body = await through(http, router, "phoenix", namespace)
    assert (status, body.get("stdout")) == (200, "phoenix\n"), body
    assert time.monotonic() - start < 20
    again = await kube.get(POD, "phoenix", namespace=namespace)
    assert again["metadata"]["uid"] == pod["metadata"]["uid"]  # the same pod, restarted
    assert again["status"]["containerStatuses"][0]["restartCount"] == 1


async def test_a_websocket_in_use_keeps_its_sandbox_from_idling(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """A notebook or IDE session is one WebSocket through the router; its messages are not new requests, and
    a server of the sandbox's own (not the runtime) is invisible to the runtime's activity report. Traffic on
    the connection is activity: the Sandbox stays Running while messages flow (it used to be suspended under
    the user 3 s after the connection opened), and idles as usual once they stop, the connection still open
    (a tab left open overnight)."""
    from aiohttp import WSMsgType, web

    router = await start_router()
    annotations = {**AUTO, lc.ANNOTATION_IDLE_TIMEOUT: "3s"}
    await kube.create(SANDBOX, runtime_sandbox("notebook", annotations), namespace=namespace)
    ip = await ready_ip(kube, namespace, "notebook")

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await ws.send_str(msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/ws", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, ip, 0)  # on the pod's address, as the sandbox's own server would be
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    headers = {"X-Sandbox-ID": "notebook", "X-Sandbox-Namespace": namespace, "X-Sandbox-Port": str(port)}

    async def mode() -> str:
        return str((await kube.get(SANDBOX, "notebook", namespace=namespace))["spec"].get("operatingMode"))

    try:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"http://127.0.0.1:{router.http_port}/ws", headers=headers) as ws,
        ):
            for i in range(8):  # 8 s: well past the 3 s idle timeout
                await ws.send_str(f"cell {i}")
                assert await ws.receive_str(timeout=10) == f"cell {i}"
                await asyncio.sleep(1)
            assert await mode() == "Running"

            async def suspended() -> bool:
                return await mode() == "Suspended"

            await eventually(suspended, "the Sandbox suspended once the messages stopped", within=30)
    finally:
        await runner.cleanup()


async def test_a_request_a_crashing_runtime_closed_unanswered_is_not_run_twice(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
) -> None:
    """The runtime dies while running a command; its container restarts in the same pod. The request was
    read and may have done its work, so it is not sent again to the restarted container (as a request a
    draining pod closed unread is sent to the resumed pod): the client gets the 502, the command ran once."""
    router = await start_router()
    await kube.create(SANDBOX, runtime_sandbox("once", AUTO), namespace=namespace)
    ip = await ready_ip(kube, namespace, "once")
    slow = through(http, router, "once", namespace, "sh -c 'echo run >> runs.txt; sleep 5'")
    request = asyncio.ensure_future(slow)

    async def started() -> bool:
        return (await execute(http, ip, "cat runs.txt"))["stdout"] == "run\n"

    await eventually(started, "the command running")
    cluster.crash_runtime(namespace, "once", hard=True)
    status, body = await request
    assert (status, body) == (502, {"detail": "Could not connect to the backend sandbox: once"}), body

    async def back() -> bool:
        pod = await kube.get(POD, "once", namespace=namespace)
        return pod["status"]["containerStatuses"][0].get("restartCount") == 1 and any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
        )

    await eventually(back, "the runtime restarted")
    assert (await execute(http, ip, "cat runs.txt"))["stdout"] == "run\n"  # once


def workspace_sandbox(name: str, *, claim_env: bool = False) -> Object:
    """A Sandbox that resumes on request, whose workspace is a PVC (kept across the suspend: a counter file
    there tells how often a command ran, whichever pod ran it); `claim_env` projects the claim env file."""
    mounts: list[dict[str, str]] = [{"name": "data", "mountPath": "/workspace"}]
    body = runtime_sandbox(name, AUTO, volumeMounts=mounts)
    if claim_env:
        mounts.append(CLAIM_ENV_MOUNT)
        body["spec"]["podTemplate"]["spec"]["volumes"] = [CLAIM_ENV_VOLUME]
    body["spec"]["volumeClaimTemplates"] = [
        {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
    ]
    return body


async def resumed_pod(
    kube: ApiClient, ns: str, name: str, old_uid: str, pending: asyncio.Future[Any] | None = None
) -> Object:
    """The Sandbox's pod once it is another one than `old_uid`'s; `pending`: a request that must not be
    answered before (it is what resumes the Sandbox)."""

    async def probe() -> Object | None:
        if pending is not None and pending.done():
            pytest.fail(f"answered before the Sandbox was resumed: {pending.result()}")
        pod = await get_or_none(kube, POD, name, ns)
        return pod if pod is not None and pod["metadata"]["uid"] != old_uid else None

    return await eventually(probe, f"{name}'s new pod")


async def test_a_command_whose_runtime_died_as_its_sandbox_was_suspended_is_not_run_again(
    kube: ApiClient,
    namespace: str,
    cluster: DevCluster,
    start_router: StartRouter,
    http: aiohttp.ClientSession,
) -> None:
    """The runtime reads a POST /execute, starts the command and is stopped without answering (SIGKILL, or a
    stop deadline) as its Sandbox is suspended. That close cannot be told from a draining runtime's close of a
    request it never read: the request may have run, so it is not held for the resumed pod (Go's rule for a
    pooled connection, `may_resend`): the client gets the 502 at once, and the command ran once. Until December
    7 it was held and sent again, whole, to the resumed pod: the counter in the persistent workspace reached 2
    and the client saw the second run's answer."""
    router = await start_router()
    await kube.create(SANDBOX, workspace_sandbox("twice"), namespace=namespace)
    ip = await ready_ip(kube, namespace, "twice")
    first = await kube.get(POD, "twice", namespace=namespace)
    slow = through(http, router, "twice", namespace, "sh -c 'echo run >> runs.txt; sleep 5'")
    request = asyncio.ensure_future(slow)

    async def started() -> bool:
        return (await execute(http, ip, "cat runs.txt"))["stdout"] == "run\n"

    await eventually(started, "the command running")
    # Killed unanswered, the pod still Ready a while (as until a kubelet's probe notices), then suspended:
    # the held request of the old code resumed the Sandbox and went to its new pod.
    cluster.crash_runtime(namespace, "twice", hard=True, noticed_after=3)
    await kube.patch(SANDBOX, "twice", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)
    status, body = await request
    assert (status, body) == (502, {"detail": "Could not connect to the backend sandbox: twice"}), body
    await kube.patch(SANDBOX, "twice", {"spec": {"operatingMode": "Running"}}, namespace=namespace)
    await resumed_pod(kube, namespace, "twice", first["metadata"]["uid"])
    ip = await ready_ip(kube, namespace, "twice")
    assert (await execute(http, ip, "cat runs.txt"))["stdout"] == "run\n"  # once


async def in_flight(http: aiohttp.ClientSession, ip: str) -> None:
    """Until the runtime at `ip` has a request in flight (a command waiting for its claim env)."""

    async def waiting() -> bool:
        async with http.get(f"http://{ip}:8080/v1/activity") as resp:
            return bool((await resp.json())["inflightRequests"] >= 1)

    await eventually(waiting, "the command waiting for its claim env")


async def test_a_sandbox_that_does_not_resume_on_request_gets_its_runtimes_not_started_answer(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """The same race for a Sandbox without `auto-resume`, through a router running the lifecycle: nothing is
    held for it, so the draining runtime's own `503` (its message, `X-Sandbox-Not-Started`) reaches the
    client as without the flag. Until December 7 the router swallowed it and answered its own 503."""
    router = await start_router()
    body = workspace_sandbox("plain", claim_env=True)
    body["metadata"]["annotations"] = {}
    await kube.create(SANDBOX, body, namespace=namespace)
    ip = await ready_ip(kube, namespace, "plain")
    command = "sh -c 'echo run >> runs.txt'"
    request = asyncio.ensure_future(through(http, router, "plain", namespace, command))
    await in_flight(http, ip)
    await kube.patch(SANDBOX, "plain", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)
    status, answer = await asyncio.wait_for(request, 60)
    assert status == 503, answer
    assert "the command was not started" in str(answer.get("message")), answer
    assert "detail" not in answer, answer


async def test_a_command_a_draining_runtime_did_not_start_goes_to_the_resumed_pod(
    kube: ApiClient, namespace: str, start_router: StartRouter, http: aiohttp.ClientSession
) -> None:
    """The race the hold exists for, on a POST: the runtime has read the request but not started its command
    (here: waiting for its claim env) when the suspend drains it. It answers `503` with `X-Sandbox-Not-Started`;
    the router does not relay that but holds the request, and sends it whole to the resumed pod, where it runs
    once. Until December 7 the runtime kept waiting past its stop deadline and was reset unanswered: with the
    router's rule above, such a POST would get a 502."""
    router = await start_router()
    await kube.create(SANDBOX, workspace_sandbox("unstarted", claim_env=True), namespace=namespace)
    ip = await ready_ip(kube, namespace, "unstarted")
    first = await kube.get(POD, "unstarted", namespace=namespace)
    command = "sh -c 'echo run >> runs.txt; echo $WHO'"
    request = asyncio.ensure_future(through(http, router, "unstarted", namespace, command))
    await in_flight(http, ip)
    await kube.patch(SANDBOX, "unstarted", {"spec": {"operatingMode": "Suspended"}}, namespace=namespace)
    pod = await resumed_pod(kube, namespace, "unstarted", first["metadata"]["uid"], request)
    annotation = {lc.ANNOTATION_CLAIM_ENV: orjson.dumps({"WHO": "resumed"}).decode()}
    await kube.patch(
        POD, pod["metadata"]["name"], {"metadata": {"annotations": annotation}}, namespace=namespace
    )
    status, body = await request
    assert (status, body.get("stdout")) == (200, "resumed\n"), body
    ip = await ready_ip(kube, namespace, "unstarted")
    assert (await execute(http, ip, "cat runs.txt"))["stdout"] == "run\n"  # once, on the resumed pod
