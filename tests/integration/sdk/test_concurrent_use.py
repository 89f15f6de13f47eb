"""One sandbox handle driven the way agents drive it: a reader task (or thread) on a command's stream while
another writes its stdin, commands that end without reading their input, the client closed under running
calls, a create cancelled as it completes. Real runtimes (sandboxd on the pods' 127.x IPs), real claims.

Each case failed until December 6: "anext(): asynchronous generator is already running" / "generator
already executing"; `NOT_FOUND process N not found` for `stream("true", stdin=...)`; a `CancelledError` in a
task nobody cancelled; a Ready claim left behind, neither rolled back nor tracked.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agent_sandbox.devcluster import DevCluster
from agent_sandbox.devcluster.processes import Started
from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxConnectionError,
    SandboxdInClusterConnectionConfig,
    SandboxDirectConnectionConfig,
)
from agent_sandbox_sdk._driver import AsyncDriver
from agent_sandbox_sdk._steps import StreamHandle
from tests.helpers import wait_for

from .conftest import EXT, RUNTIME_IMAGE, apply_pool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SANDBOXD = SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")


@pytest.fixture
def pool(cluster: DevCluster, namespace: str, controller: Started) -> str:
    apply_pool(cluster, namespace, replicas=2, containers=[{"name": "runtime", "image": RUNTIME_IMAGE}])
    return namespace


def _claims(cluster: DevCluster, namespace: str) -> list[str]:
    status, out = cluster.admin().request("GET", f"/apis/{EXT}/namespaces/{namespace}/sandboxclaims")
    assert status == 200, out
    return [item["metadata"]["name"] for item in out["items"]]


def test_a_reader_and_a_writer_on_one_stream(cluster: DevCluster, pool: str) -> None:
    with SandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig) as client:
        sandbox = client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        # sync: a reader thread iterates while this thread writes (send_stdin waits for the start)
        stream = sandbox.commands.stream("cat")
        seen: list[bytes] = []
        reader = threading.Thread(target=lambda: seen.extend(e.data for e in stream if e.type == "stdout"))
        reader.start()
        stream.send_stdin("from a thread\n")
        stream.close_stdin()
        reader.join(30)
        assert b"".join(seen) == b"from a thread\n"
        assert stream.exit_code == 0
        # commands that end without reading their input
        for command in ("true", "echo s"):
            for _ in range(3):
                result = sandbox.commands.stream(command, stdin="x" * 10).result()
                assert (result.exit_code, result.stdout) == (0, "" if command == "true" else "s\n")

    async def in_tasks() -> bytes:
        async with AsyncSandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig) as aclient:
            asandbox = await aclient.create_sandbox("pool", pool, sandbox_ready_timeout=90)
            assert asandbox.commands is not None
            astream = asandbox.commands.stream("cat")

            async def consume() -> bytes:
                return b"".join([e.data async for e in astream if e.type == "stdout"])

            reading = asyncio.create_task(consume())
            await asyncio.sleep(0)  # the reader is pulling before the writer starts
            await astream.send_stdin("from a task\n")
            await astream.close_stdin()
            return await asyncio.wait_for(reading, 30)

    assert asyncio.run(in_tasks()) == b"from a task\n"


def test_closing_the_client_under_a_running_call_is_a_connection_error(
    cluster: DevCluster, pool: str
) -> None:
    async def main() -> tuple[bool, BaseException | None]:
        client = AsyncSandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig)
        sandbox = await client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        running = asyncio.create_task(sandbox.commands.run("sleep 5; echo done"))
        await asyncio.sleep(1)
        await client.close()
        await asyncio.wait([running], timeout=30)
        outcome = running.cancelled(), None if running.cancelled() else running.exception()
        await sandbox.terminate()  # the client reconnects lazily; its claims stay through close()
        return outcome

    cancelled, error = asyncio.run(main())
    assert not cancelled
    assert isinstance(error, SandboxConnectionError), error


def test_a_create_cancelled_as_it_completes_leaves_nothing_behind(
    cluster: DevCluster, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cancellation lands while the create's claim watch is being closed, after the claim is Ready."""
    original = AsyncDriver._release
    closing = asyncio.Event()

    async def slow_release(handle: Any) -> None:
        if isinstance(handle, StreamHandle):
            closing.set()
            await asyncio.sleep(0.3)
        await original(handle)

    monkeypatch.setattr(AsyncDriver, "_release", staticmethod(slow_release))

    async def main() -> None:
        async with AsyncSandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig) as client:
            creating = asyncio.create_task(client.create_sandbox("pool", pool, sandbox_ready_timeout=90))
            await asyncio.wait_for(closing.wait(), 90)
            creating.cancel()
            await asyncio.wait([creating], timeout=60)
            # The cancellation is not lost (the task ends cancelled), and neither is the claim: rolled back,
            # or tracked - and so deleted with the client.
            assert creating.cancelled()

    asyncio.run(main())
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="no claim left")


def test_a_timeout_as_a_create_or_a_resume_completes_is_raised_by_that_call(
    cluster: DevCluster, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`asyncio.timeout` expiring while the call closes its watch (the claim Ready; the resumed pod Ready): the
    call itself raises TimeoutError, nothing is left pending for the task's next await, and the claim is
    tracked (deleted with the client). Until December 6 the call returned inside the block, and the next,
    unrelated await raised a CancelledError with `cancelling() == 0`."""
    original = AsyncDriver._release
    closing: list[asyncio.Event] = []  # armed for one call at a time

    async def slow_release(handle: Any) -> None:
        if isinstance(handle, StreamHandle) and closing:
            closing[-1].set()
            await asyncio.sleep(0.3)
        await original(handle)

    monkeypatch.setattr(AsyncDriver, "_release", staticmethod(slow_release))

    async def expiring(call: Any) -> bool:
        """Whether `call()` raised TimeoutError for a deadline reached as its watch closes."""
        closing.append(event := asyncio.Event())
        timed_out = False
        try:
            async with asyncio.timeout(None) as deadline:

                async def expire() -> None:
                    await event.wait()
                    deadline.reschedule(asyncio.get_running_loop().time())

                expirer = asyncio.create_task(expire())
                await call()
        except TimeoutError:
            timed_out = True
        finally:
            closing.clear()
        await expirer
        await asyncio.sleep(0)  # a cancellation left pending would be raised here
        return timed_out

    async def main() -> None:
        async with AsyncSandboxClient(SANDBOXD, kubeconfig=cluster.kubeconfig) as client:
            assert await expiring(lambda: client.create_sandbox("pool", pool, sandbox_ready_timeout=90))
            [(namespace, claim)] = await client.list_active_sandboxes()  # tracked all the same
            sandbox = await client.get_sandbox(claim, namespace)
            await sandbox.suspend(timeout=60)
            assert await expiring(lambda: sandbox.resume(timeout=60))
            assert sandbox.commands is not None
            assert (await sandbox.commands.run("echo resumed")).stdout == "resumed\n"
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0

    asyncio.run(main())
    wait_for(lambda: _claims(cluster, pool) == [], timeout=30, what="the tracked claim deleted")


def test_a_legacy_stream_cut_by_the_clients_close_says_so(
    cluster: DevCluster, pool: str, router: str
) -> None:
    """Async `close()` under a legacy stream through the router; then the sync client closed from another
    thread under a stream and a run. Each fails with the same "(client closed)" `SandboxConnectionError`
    (until December 6 the legacy stream blamed the sandbox or a proxy, and the sync stream ran to exit 0)."""
    legacy = SandboxDirectConnectionConfig(api_url=router)
    ticking = "for i in 1 2 3 4 5 6; do echo $i; sleep 1; done"

    async def in_a_task() -> BaseException | None:
        client = AsyncSandboxClient(legacy, kubeconfig=cluster.kubeconfig)
        sandbox = await client.create_sandbox("pool", pool, sandbox_ready_timeout=90)
        assert sandbox.commands is not None
        events = aiter(sandbox.commands.stream(f"sh -c '{ticking}'"))
        assert (await anext(events)).data == b"1\n"
        await client.close()
        try:
            async for _ in events:
                pass
        except SandboxConnectionError as err:
            return err
        finally:
            await sandbox.terminate()
        return None

    error = asyncio.run(in_a_task())
    assert error is not None
    assert "/execute/stream: the connection was closed while the call was in flight (client closed)" in str(
        error
    )

    with SandboxClient(legacy, kubeconfig=cluster.kubeconfig) as client:
        sandboxes = [client.create_sandbox("pool", pool, sandbox_ready_timeout=90) for _ in range(2)]
        commands = [s.commands for s in sandboxes]
        assert commands[0] is not None
        assert commands[1] is not None
        outcomes: dict[str, BaseException | int] = {}

        def attempt(name: str, call: Any) -> None:
            try:
                outcomes[name] = call()
            except BaseException as err:  # reported to the test's thread
                outcomes[name] = err

        threads = [
            threading.Thread(
                target=attempt,
                args=("run", lambda: commands[0].run("sh -c 'touch started; sleep 3'").exit_code),
            ),
            threading.Thread(
                target=attempt,
                args=(
                    "stream",
                    lambda: commands[1].stream("sh -c 'touch started; sleep 3'").result().exit_code,
                ),
            ),
        ]
        for thread in threads:
            thread.start()
        # Both are waiting for their command's answer once both commands run (a fixed sleep was not enough on a
        # loaded machine: a call sent after the close rightly succeeds).
        deadline = time.monotonic() + 30
        while not all(s.files.exists("started") for s in sandboxes):
            assert time.monotonic() < deadline, "the commands did not start"
            time.sleep(0.1)
        client.close()
        for thread in threads:
            thread.join(30)
        for name in ("run", "stream"):
            assert isinstance(outcomes[name], SandboxConnectionError), (name, outcomes[name])
            assert "(client closed)" in str(outcomes[name]), outcomes[name]
        for sandbox in sandboxes:
            sandbox.terminate()
