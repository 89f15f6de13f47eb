"""Resume on request for gRPC through the router's h2c pass-through (`--enable-h2c --sandbox-lifecycle`).

A gRPC channel to a suspended Sandbox that asked for `auto-resume` is held before its first stream reaches
the sandbox, exactly as an HTTP/1.1 request: the call is served by the resumed pod. One that cannot start gets
`UNAVAILABLE` with the 503's detail. Streams on a pinned connection count as activity.
"""

from __future__ import annotations

import grpc
import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.api import processv1 as pb
from agent_sandbox.cli.lifecycle import hibernate
from agent_sandbox.kube import SANDBOX, ApiClient
from tests.helpers import eventually
from tests.integration.lifecycle.helpers import get_or_none, metric_value, ready_ip, router_metrics
from tests.integration.lifecycle.test_resume import AUTO, StartRouter, runtime_sandbox, suspend_and_wait
from tests.integration.runtime.helpers import ProcessClient

pytestmark = pytest.mark.integration

HOSTNAME = pb.ExecuteRequest(config=pb.ProcessConfig(command=["sh", "-c", "echo $HOSTNAME"]))


def routing(name: str, namespace: str) -> tuple[tuple[str, str], ...]:
    return (("x-sandbox-id", name), ("x-sandbox-namespace", namespace), ("x-sandbox-port", "9090"))


async def test_a_grpc_call_resumes_a_suspended_sandbox(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    """It used to fail at once with `UNAVAILABLE: Could not connect` (h2c connections were never held)."""
    router = await start_router("--enable-h2c")
    await kube.create(SANDBOX, runtime_sandbox("grpc-wake", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "grpc-wake")
    await suspend_and_wait(kube, namespace, "grpc-wake")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        client = ProcessClient(channel)
        resp = await client.execute_call(HOSTNAME, timeout=90, metadata=routing("grpc-wake", namespace))
        assert (resp.exit_code, resp.stdout) == (0, b"grpc-wake\n")
    sandbox = await kube.get(SANDBOX, "grpc-wake", namespace=namespace)
    assert sandbox["spec"]["operatingMode"] == "Running"
    assert sandbox["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
    metrics = await router_metrics(router)
    assert metric_value(metrics, "sandbox_router_lifecycle_resumes_total", result="resumed") == 1
    assert metric_value(metrics, "sandbox_router_resume_wait_seconds_count", outcome="ready") == 1


async def test_streams_on_a_pinned_connection_are_activity(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    router = await start_router("--enable-h2c", "--sandbox-lifecycle-activity-interval=1s")
    annotations = {**AUTO, lc.ANNOTATION_IDLE_TIMEOUT: "1h"}
    await kube.create(SANDBOX, runtime_sandbox("grpc-busy", annotations), namespace=namespace)
    await ready_ip(kube, namespace, "grpc-busy")

    async def stamp() -> str | None:
        sandbox = await kube.get(SANDBOX, "grpc-busy", namespace=namespace)
        return (sandbox["metadata"].get("annotations") or {}).get(lc.ANNOTATION_LAST_ACTIVITY)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        client = ProcessClient(channel)
        first = await client.execute_call(HOSTNAME, timeout=30, metadata=routing("grpc-busy", namespace))
        assert first.stdout == b"grpc-busy\n"
        before = await stamp()

        async def recorded_again() -> bool:
            # Every call goes over the one connection the first call pinned; each new stream is activity.
            await client.execute_call(HOSTNAME, timeout=30, metadata=routing("grpc-busy", namespace))
            now = await stamp()
            return now is not None and now != before

        await eventually(recorded_again, "a later stream's activity written", within=20)


async def test_a_sandbox_that_cannot_start_is_unavailable_with_the_reason(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    router = await start_router("--enable-h2c")
    body = runtime_sandbox("grpc-toobig", AUTO, resources={"requests": {"cpu": "1000"}})
    body["spec"]["operatingMode"] = "Suspended"
    await kube.create(SANDBOX, body, namespace=namespace)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ProcessClient(channel).execute_call(
                HOSTNAME, timeout=90, metadata=routing("grpc-toobig", namespace)
            )
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    detail = err.value.details() or ""
    assert detail.startswith(f"Sandbox {namespace}/grpc-toobig could not be resumed: Unschedulable: "), detail


async def test_a_grpc_call_restores_a_hibernated_sandbox(
    kube: ApiClient, namespace: str, start_router: StartRouter
) -> None:
    router = await start_router("--enable-h2c")
    await kube.create(SANDBOX, runtime_sandbox("grpc-sleeper", AUTO), namespace=namespace)
    await ready_ip(kube, namespace, "grpc-sleeper")
    await hibernate(kube, "grpc-sleeper", namespace)

    async def archived() -> bool:
        gone = await get_or_none(kube, SANDBOX, "grpc-sleeper", namespace) is None
        return gone and await get_or_none(kube, lc.ARCHIVE, "grpc-sleeper", namespace) is not None

    await eventually(archived, "grpc-sleeper hibernated")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.http_port}") as channel:
        resp = await ProcessClient(channel).execute_call(
            HOSTNAME, timeout=90, metadata=routing("grpc-sleeper", namespace)
        )
    assert (resp.exit_code, resp.stdout) == (0, b"grpc-sleeper\n")
    restored = await kube.get(SANDBOX, "grpc-sleeper", namespace=namespace)
    assert restored["metadata"]["annotations"][lc.ANNOTATION_RESUME_REASON] == "Request"
    metrics = await router_metrics(router)
    assert metric_value(metrics, "sandbox_router_lifecycle_resumes_total", result="restored") == 1
