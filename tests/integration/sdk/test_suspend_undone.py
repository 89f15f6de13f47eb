"""The Python SDK's `suspend()` and the "suspended" advice next to our lifecycle (docs/lifecycle.md), on the real
control plane: the controller with `--sandbox-lifecycle`, real routers (one with `--sandbox-lifecycle`, one
without) and real runtimes.

- `suspend()` of an auto-resume Sandbox still in use is undone by the lifecycle router within a second
  (`resume-reason: Request`): it raises `SandboxModeChangedError` naming that at once. Until December 6 it
  waited out its whole timeout and then said `not Suspended within 20 s: Suspended=False, reason NotSuspended`.
- A call that meets a suspended Sandbox says what is missing for resume on request: through a lifecycle
  router, the Sandbox's opt-in (`lifecycle.agents.x-k8s.io/auto-resume: "true"`, on it or its template);
  for a Sandbox that asks for it, a router running `--sandbox-lifecycle`. Until December 6 it always said
  "or run the router with --sandbox-lifecycle to resume it on request", also through a router that ran it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from agent_sandbox.api import lifecycle as lc
from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.controller import start_controller
from agent_sandbox.devcluster.processes import Started, stop
from agent_sandbox.kube import SANDBOX, SANDBOX_TEMPLATE, SANDBOX_WARM_POOL, ApiClient
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxDirectConnectionConfig,
    SandboxModeChangedError,
    SandboxRequestError,
)
from tests.integration.lifecycle.helpers import pool_body, runtime_template

from .conftest import router_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

AUTO = {lc.ANNOTATION_AUTO_RESUME: "true"}


@pytest.fixture(scope="module")
def controller(cluster: DevCluster) -> Iterator[Started]:
    """The controller with the lifecycle controller on (installs the SandboxArchive CRD and grants)."""
    started = start_controller(cluster, extra=("--sandbox-lifecycle",))
    try:
        yield started
    finally:
        stop(started)


@pytest.fixture(scope="module")
def lifecycle_router(cluster: DevCluster, controller: Started) -> Iterator[str]:
    """A router with `--sandbox-lifecycle` (resume on request); its URL."""
    port = cluster.reserve_port("undone_lc_router_http")
    with router_process(cluster, "undone_lc_router", f"127.0.0.1:{port}", "--sandbox-lifecycle"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def plain_router(cluster: DevCluster, controller: Started) -> Iterator[str]:
    """A router without `--sandbox-lifecycle` (upstream's behaviour: a suspended Sandbox is a 502); its URL."""
    port = cluster.reserve_port("undone_plain_router_http")
    with router_process(cluster, "undone_plain_router", f"127.0.0.1:{port}"):
        yield f"http://127.0.0.1:{port}"


async def pool(kube: ApiClient, namespace: str, name: str, annotations: dict[str, str]) -> str:
    """A warm pool `<name>-pool` of one runtime Sandbox from template `name` (with `annotations`)."""
    await kube.create(SANDBOX_TEMPLATE, runtime_template(name, annotations=annotations), namespace=namespace)
    await kube.create(SANDBOX_WARM_POOL, pool_body(f"{name}-pool", name, 1), namespace=namespace)
    return f"{name}-pool"


async def test_suspend_of_an_auto_resume_sandbox_in_use_is_undone_and_said_at_once(
    kube: ApiClient, namespace: str, cluster: DevCluster, lifecycle_router: str
) -> None:
    warm = await pool(kube, namespace, "auto", AUTO)
    config = SandboxDirectConnectionConfig(api_url=lifecycle_router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = await client.create_sandbox(warm, namespace, 90)
        commands = sandbox.commands
        assert commands is not None
        calls = 0
        served: int | None = None  # calls made when suspend() raised
        served_after = asyncio.Event()

        async def keep_using() -> None:  # another task of the program, still using the sandbox
            nonlocal calls
            while True:
                await commands.run("true", timeout=60)
                calls += 1
                if served is not None and calls > served + 2:
                    served_after.set()
                await asyncio.sleep(0.2)

        user = asyncio.create_task(keep_using())
        try:
            await asyncio.sleep(1)
            started = time.monotonic()
            with pytest.raises(SandboxModeChangedError, match=r"was set back to Running") as info:
                await sandbox.suspend(timeout=60)
            elapsed = time.monotonic() - started
            served = calls
            # the user's calls go on, served by the resumed pod
            waiter = asyncio.create_task(served_after.wait())
            await asyncio.wait({user, waiter}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            assert served_after.is_set(), user
        finally:
            user.cancel()
            await asyncio.gather(user, return_exceptions=True)
    message = str(info.value)
    assert elapsed < 20, (elapsed, message)  # at once, not after the 60 s timeout
    assert info.value.operating_mode == "Running"
    assert info.value.changed_by == "Request", message
    assert f"{lc.ANNOTATION_RESUME_REASON}: Request" in message
    assert "a lifecycle router resumed it for a request" in message
    assert not isinstance(info.value, TimeoutError)


async def test_a_suspended_sandbox_without_auto_resume_names_the_opt_in(
    kube: ApiClient, namespace: str, cluster: DevCluster, lifecycle_router: str
) -> None:
    """Through a router that runs `--sandbox-lifecycle`: what is missing is the Sandbox's opt-in."""
    warm = await pool(kube, namespace, "plain", {})
    config = SandboxDirectConnectionConfig(api_url=lifecycle_router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = await client.create_sandbox(warm, namespace, 90)
        await sandbox.suspend(timeout=60)
        assert sandbox.commands is not None
        with pytest.raises(
            SandboxRequestError, match=r"is suspended \(spec.operatingMode: Suspended\)"
        ) as info:
            await sandbox.commands.run("true")
    message = str(info.value)
    assert (
        f"for resume on request, annotate the Sandbox or its SandboxTemplate {namespace}/plain with "
        f'{lc.ANNOTATION_AUTO_RESUME}: "true"'
    ) in message, message
    assert "or run the router with --sandbox-lifecycle" not in message


async def test_a_suspended_auto_resume_sandbox_through_a_plain_router_names_the_flag(
    kube: ApiClient, namespace: str, cluster: DevCluster, plain_router: str
) -> None:
    """The Sandbox asks for auto-resume (on its template): what is missing is a router that resumes."""
    warm = await pool(kube, namespace, "asks", AUTO)
    config = SandboxDirectConnectionConfig(api_url=plain_router)
    async with AsyncSandboxClient(config, kubeconfig=cluster.kubeconfig) as client:
        sandbox = await client.create_sandbox(warm, namespace, 90)
        await sandbox.suspend(timeout=60)
        assert sandbox.commands is not None
        with pytest.raises(
            SandboxRequestError, match=r"is suspended \(spec.operatingMode: Suspended\)"
        ) as info:
            await sandbox.commands.run("true")
        current = await kube.get(SANDBOX, sandbox.sandbox_id, namespace=namespace)
        assert current["spec"]["operatingMode"] == "Suspended"  # nothing resumed it
    message = str(info.value)
    assert (
        f'it asks to be resumed on request ({lc.ANNOTATION_AUTO_RESUME}: "true" on its SandboxTemplate '
        f"{namespace}/asks), but this request did not go through a router running --sandbox-lifecycle"
    ) in message, message
