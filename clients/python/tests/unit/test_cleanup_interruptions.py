"""A second Ctrl-C (or cancellation) stops a client's cleanup at once.

The first interruption of a client's `with`/`async with` exit is absorbed: the DELETE it landed in is
completed (sync: sent again; async: shielded), the remaining claims are deleted too, then it is raised. A
second one stops the cleanup at once and leaves the remaining handles tracked, for the exit hook. Until
December 7 (that change's first version) each `terminate()` absorbed one interruption and the cleanup caught
every one and went on: with an unreachable API server every claim cost two Ctrl-Cs and up to twice the
request timeout (ten Ctrl-Cs for five claims), and asyncio's second Ctrl-C - the event loop shutting down,
cancelling every task - made the async cleanup start new DELETE tasks the closing loop destroyed pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import httpx2
import pytest

from agent_sandbox_sdk import (
    AsyncSandbox,
    AsyncSandboxClient,
    Sandbox,
    SandboxClient,
    SandboxDirectConnectionConfig,
)

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


def _deletes(fake: FakeCluster) -> int:
    return len(fake.find(lambda r: r.method == "DELETE"))


class CtrlCOnDeletes:
    """A sync transport on which the claim DELETEs numbered in `interrupt` (1-based, in sending order) raise
    `KeyboardInterrupt` before they reach the server: a Ctrl-C while each waits for an unreachable one."""

    def __init__(self, fake: FakeCluster, interrupt: set[int]) -> None:
        self.fake, self.interrupt, self.sent = fake, interrupt, 0

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "DELETE":
            self.sent += 1
            if self.sent in self.interrupt:
                raise KeyboardInterrupt
        return self.fake.handle(request)


def _sync_client(fake: FakeCluster, interrupt: set[int]) -> tuple[SandboxClient, CtrlCOnDeletes]:
    transport = CtrlCOnDeletes(fake, interrupt)
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=httpx2.MockTransport(transport.handle))
    return client, transport


def test_sync_one_ctrl_c_is_absorbed_and_every_claim_deleted() -> None:
    fake = FakeCluster()
    client, transport = _sync_client(fake, {1})
    for _ in range(3):
        client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt):
        client.__exit__(None, None, None)
    assert transport.sent == 4  # the interrupted one again, and the two others
    assert fake.claims == {}
    assert client._registry.handles == {}


def test_sync_a_second_ctrl_c_during_the_resend_stops_the_client_exit() -> None:
    """Every DELETE interrupted (an unreachable API server, a user pressing Ctrl-C): two Ctrl-Cs end the
    exit - the first one's resend is the one the second cuts - and all five claims stay tracked."""
    fake = FakeCluster()
    client, transport = _sync_client(fake, set(range(1, 100)))
    for _ in range(5):
        client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt):
        client.__exit__(None, None, None)
    assert transport.sent == 2
    assert len(fake.claims) == 5
    assert len(client._registry.handles) == 5  # left to the exit hook
    transport.interrupt = set()  # the API server is back
    client.__exit__(None, None, None)  # what that hook (`cleanup=True`) runs at interpreter exit
    assert fake.claims == {}
    assert client._registry.handles == {}


def test_sync_a_second_ctrl_c_in_a_later_delete_stops_the_client_exit_at_once() -> None:
    """The first Ctrl-C's resend succeeds and the next claim is deleted; a second Ctrl-C in the third claim's
    DELETE is not absorbed (no resend) and ends the exit: that claim and the rest stay tracked."""
    fake = FakeCluster()
    client, transport = _sync_client(fake, {1, 4})
    for _ in range(5):
        client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt):
        client.__exit__(None, None, None)
    assert transport.sent == 4  # 1 (interrupted), 1 again, 2, 3 (interrupted)
    assert len(fake.claims) == 3
    assert sorted(k[1] for k in client._registry.handles) == sorted(fake.claims)


def test_sync_terminate_a_second_ctrl_c_during_the_resend_stops_it() -> None:
    fake = FakeCluster()
    client, transport = _sync_client(fake, {1, 2})
    sandbox = client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt):
        sandbox.terminate()
    assert transport.sent == 2
    assert sandbox.claim_name in fake.claims
    assert list(client._registry.handles) == [("default", sandbox.claim_name)]
    client.close()


class SlowDeletes(httpx2.AsyncBaseTransport):
    """Claim DELETEs wait `delay` seconds before they reach the server (a slow or unreachable one)."""

    def __init__(self, fake: FakeCluster, delay: float) -> None:
        self.fake, self.delay = fake, delay
        self.started = 0
        self.first_started = asyncio.Event()
        self.second_started = asyncio.Event()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "DELETE":
            self.started += 1
            self.first_started.set()
            if self.started == 2:
                self.second_started.set()
            await asyncio.sleep(self.delay)
        await request.aread()
        return self.fake.handle(request)


def _async_client(fake: FakeCluster, delay: float) -> tuple[AsyncSandboxClient, SlowDeletes]:
    transport = SlowDeletes(fake, delay)
    client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=transport, cleanup=False)
    return client, transport


def test_async_one_cancellation_is_absorbed_and_every_claim_deleted() -> None:
    fake = FakeCluster()

    async def main() -> None:
        client, transport = _async_client(fake, 0.1)

        async def body() -> None:
            async with client:
                for _ in range(3):
                    await client.create_sandbox("python-pool")

        task = asyncio.create_task(body())
        await transport.first_started.wait()
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert task.cancelled()
        assert transport.started == 3
        assert client._registry.handles == {}

    asyncio.run(main())
    assert fake.claims == {}


def test_async_a_second_cancellation_stops_the_client_exit_at_once() -> None:
    fake = FakeCluster()
    tracked: list[Any] = []

    async def main() -> None:
        client, transport = _async_client(fake, 5)

        async def body() -> None:
            async with client:
                for _ in range(3):
                    await client.create_sandbox("python-pool")

        task = asyncio.create_task(body())
        await transport.first_started.wait()
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()  # the second: cancelling() == 2
        started = time.monotonic()
        await asyncio.wait([task], timeout=10)
        assert time.monotonic() - started < 1
        assert task.cancelled()
        assert transport.started == 1
        tracked.extend(client._registry.handles)

    asyncio.run(main())
    assert len(fake.claims) == 3
    assert sorted(k[1] for k in tracked) == sorted(fake.claims)


def test_async_terminate_a_second_cancellation_stops_it() -> None:
    fake = FakeCluster()

    async def main() -> None:
        client, transport = _async_client(fake, 5)
        sandbox = await client.create_sandbox("python-pool")
        task = asyncio.create_task(sandbox.terminate())
        await transport.first_started.wait()
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.wait([task], timeout=1)
        assert task.cancelled()
        assert sandbox.claim_name in fake.claims
        assert list(client._registry.handles) == [("default", sandbox.claim_name)]
        await client.close()

    asyncio.run(main())


#: Run in a child process: real SIGINTs, to asyncio.run's own handler (in this process a KeyboardInterrupt
#: raised that way upsets pytest's interpreter state). Prints the outcome as JSON.
_CTRL_C_CHILD = """
import asyncio, gc, json, logging, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from agent_sandbox_sdk import AsyncSandboxClient, SandboxDirectConnectionConfig
from tests.unit.fakes import ROUTER, FakeCluster, endpoint
import httpx2

destroyed = []
class Catch(logging.Handler):
    def emit(self, record):
        destroyed.append(record.getMessage())
logging.getLogger("asyncio").addHandler(Catch(logging.ERROR))

fake = FakeCluster()
started = []
class SlowDeletes(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request):
        if request.method == "DELETE":
            started.append(time.monotonic())
            print("DELETE", flush=True)
            await asyncio.sleep(3)
        await request.aread()
        return fake.handle(request)

client = AsyncSandboxClient(SandboxDirectConnectionConfig(api_url=ROUTER), api_client=endpoint(),
                            transport=SlowDeletes(), cleanup=False)

async def main():
    async with client:
        for _ in range(3):
            await client.create_sandbox("python-pool")

outcome = "returned"
try:
    asyncio.run(main())
except BaseException as err:
    outcome = type(err).__name__
ended = time.monotonic()
gc.collect()
print(json.dumps({"outcome": outcome, "after_first_delete": ended - started[0], "deletes": len(started),
                  "claims": len(fake.claims), "tracked": len(client._registry.handles),
                  "destroyed": [m for m in destroyed if "destroyed but it is pending" in m]}), flush=True)
"""


def test_async_the_second_ctrl_c_ends_asyncio_run_without_tasks_left_pending() -> None:
    """`asyncio.run`'s Ctrl-C handling: the first cancels the main task (absorbed: the exit's DELETE goes on),
    the second raises `KeyboardInterrupt` and the closing loop cancels every task, the DELETE's too. The exit
    must stop there, not start the next claims' DELETEs in a loop that is closing: those were destroyed
    pending ("Task was destroyed but it is pending!"), and the loop's close waited for them."""
    import agent_sandbox_sdk

    src = str(Path(agent_sandbox_sdk.__file__).parents[1])
    tests_root = str(Path(__file__).parents[2])
    child = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_CHILD, src, tests_root],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal: a background job (CI's runner, nohup'd scripts) and pytest-xdist's workers ignore
        # SIGINT, the child would inherit that, and `asyncio.run` would then install no Ctrl-C handling at all.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "DELETE"
        child.send_signal(signal.SIGINT)
        time.sleep(0.2)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["outcome"] == "KeyboardInterrupt", err
    assert result["after_first_delete"] < 2.5, result
    assert result["deletes"] == 1, result
    assert result["claims"] == 3, result
    assert result["tracked"] == 3, result  # left to the exit hook
    assert result["destroyed"] == [], result
    assert "destroyed but it is pending" not in err


class _LoggingSandbox(Sandbox):
    """A `sandbox_class` whose terminate() defers to the SDK's (a typical override)."""

    def terminate(self) -> None:
        super().terminate()


class _LoggingClient(SandboxClient):
    sandbox_class = _LoggingSandbox


def test_sync_a_custom_terminate_calling_super_shares_the_cleanups_ctrl_cs() -> None:
    """Each `super().terminate()` counted its Ctrl-Cs apart (a fresh `Interruptions`): every claim absorbed
    one, and three claims took four Ctrl-Cs instead of two."""
    fake = FakeCluster()
    transport = CtrlCOnDeletes(fake, set(range(1, 100)))
    client = _LoggingClient(CONFIG, api_client=endpoint(), transport=httpx2.MockTransport(transport.handle))
    for _ in range(3):
        client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt):
        client.__exit__(None, None, None)
    assert transport.sent == 2
    assert len(fake.claims) == 3
    assert len(client._registry.handles) == 3


def test_sync_a_custom_terminate_calling_super_one_ctrl_c_deletes_every_claim() -> None:
    fake = FakeCluster()
    transport = CtrlCOnDeletes(fake, {1})
    client = _LoggingClient(CONFIG, api_client=endpoint(), transport=httpx2.MockTransport(transport.handle))
    for _ in range(3):
        client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt):
        client.__exit__(None, None, None)
    assert transport.sent == 4
    assert fake.claims == {}
    assert client._registry.handles == {}


def _with_client_ended_by(client: SandboxClient, interruption: KeyboardInterrupt) -> None:
    with client:
        for _ in range(3):
            client.create_sandbox("python-pool")
        raise interruption


def test_sync_with_client_ended_by_ctrl_c_counts_it_as_the_first() -> None:
    """The Ctrl-C that ended the block is the first: the next one, in the exit's first DELETE, stops it."""
    fake = FakeCluster()
    client, transport = _sync_client(fake, set(range(1, 100)))
    body = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as raised:
        _with_client_ended_by(client, body)
    assert transport.sent == 1
    assert raised.value is not body  # the second one
    assert len(fake.claims) == 3
    assert len(client._registry.handles) == 3


def test_sync_with_client_ended_by_ctrl_c_still_deletes_every_claim() -> None:
    fake = FakeCluster()
    client, transport = _sync_client(fake, set())
    body = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as raised:
        _with_client_ended_by(client, body)
    assert raised.value is body
    assert transport.sent == 3
    assert fake.claims == {}
    assert client._registry.handles == {}


def test_sync_with_sandbox_ended_by_ctrl_c_counts_it_as_the_first() -> None:
    fake = FakeCluster()
    client, transport = _sync_client(fake, set(range(1, 100)))
    sandbox = client.create_sandbox("python-pool")
    with pytest.raises(KeyboardInterrupt), sandbox:
        raise KeyboardInterrupt
    assert transport.sent == 1
    assert sandbox.claim_name in fake.claims
    assert list(client._registry.handles) == [("default", sandbox.claim_name)]
    transport.interrupt = set()
    client.__exit__(None, None, None)
    assert fake.claims == {}


def test_sync_cleanup_calls_a_terminate_replaced_on_the_instance() -> None:
    fake = FakeCluster()
    client = SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport())
    sandbox = client.create_sandbox("python-pool")
    with mock.patch.object(sandbox, "terminate", wraps=sandbox.terminate) as spy:
        client.__exit__(None, None, None)
    assert spy.called
    assert fake.claims == {}


def test_async_a_timeout_does_not_cut_the_delete_of_a_task_already_cancelling() -> None:
    """A task whose `cancelling()` was already 1 (a cancellation it caught) - `limit = max(1, cancelling())`
    let one `asyncio.timeout` cut the DELETE: the claim outlived the handle, still tracked."""
    fake = FakeCluster()

    async def main() -> None:
        client, _transport = _async_client(fake, 0.3)
        sandbox = await client.create_sandbox("python-pool")
        other = await client.create_sandbox("python-pool")
        outcome: list[str] = []

        async def worker() -> None:
            with contextlib.suppress(asyncio.CancelledError):  # caught, not uncancelled: cancelling() stays 1
                await asyncio.sleep(10)
            for handle in (sandbox, other):
                try:
                    async with asyncio.timeout(0.05):
                        await handle.terminate()
                except TimeoutError:
                    outcome.append("timeout")

        task = asyncio.create_task(worker())
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert outcome == ["timeout", "timeout"]
        assert client._registry.handles == {}
        await client.close()

    asyncio.run(main())
    assert fake.claims == {}


def test_async_a_timeout_does_not_cut_the_cleanup_of_a_task_already_cancelling() -> None:
    fake = FakeCluster()

    async def main() -> None:
        client, _transport = _async_client(fake, 0.3)
        outcome: list[str] = []

        async def worker() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
            try:
                async with asyncio.timeout(0.05):
                    async with client:
                        for _ in range(2):
                            await client.create_sandbox("python-pool")
            except TimeoutError:
                outcome.append("timeout")

        task = asyncio.create_task(worker())
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert outcome == ["timeout"]
        assert client._registry.handles == {}

    asyncio.run(main())
    assert fake.claims == {}


class _LoggingAsyncSandbox(AsyncSandbox):
    async def terminate(self) -> None:
        await super().terminate()


class _LoggingAsyncClient(AsyncSandboxClient):
    sandbox_class = _LoggingAsyncSandbox


@pytest.mark.parametrize("client_class", [AsyncSandboxClient, _LoggingAsyncClient])
def test_async_a_second_cancellation_in_a_later_delete_stops_the_client_exit(
    client_class: type[AsyncSandboxClient],
) -> None:
    """The first cancellation, in the first DELETE, is absorbed; the second, in the next claim's DELETE (entered
    with `cancelling()` at 1), stops the exit - a custom terminate() calling `super().terminate()` too."""
    fake = FakeCluster()
    tracked: list[Any] = []

    async def main() -> None:
        transport = SlowDeletes(fake, 0.3)
        client = client_class(CONFIG, api_client=endpoint(), transport=transport, cleanup=False)

        async def body() -> None:
            async with client:
                for _ in range(3):
                    await client.create_sandbox("python-pool")

        task = asyncio.create_task(body())
        await transport.first_started.wait()
        task.cancel()
        await transport.second_started.wait()
        task.cancel()
        started = time.monotonic()
        await asyncio.wait([task], timeout=10)
        assert time.monotonic() - started < 0.25
        assert task.cancelled()
        assert transport.started == 2
        tracked.extend(client._registry.handles)

    asyncio.run(main())
    assert len(fake.claims) == 2
    assert sorted(k[1] for k in tracked) == sorted(fake.claims)


def test_async_a_second_cancellation_still_closes_the_clients_connections() -> None:
    fake = FakeCluster()

    async def main() -> None:
        client, transport = _async_client(fake, 5)

        async def body() -> None:
            async with client:
                for _ in range(3):
                    await client.create_sandbox("python-pool")

        task = asyncio.create_task(body())
        await transport.first_started.wait()
        assert client._driver._clients
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.wait([task], timeout=10)
        assert task.cancelled()
        assert client._driver._clients == {}

    asyncio.run(main())


def test_async_cleanup_calls_a_terminate_replaced_on_the_instance() -> None:
    fake = FakeCluster()

    async def main() -> None:
        client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)
        sandbox = await client.create_sandbox("python-pool")
        with mock.patch.object(sandbox, "terminate", wraps=sandbox.terminate) as spy:
            await client.__aexit__(None, None, None)
        assert spy.called

    asyncio.run(main())
    assert fake.claims == {}
