"""`AsyncSandboxClient.close()` on another event loop than the one its connections were opened on (docs: "One
event loop at a time": a client may outlive a loop). `asyncio.run(work())` then `asyncio.run(client.close())`
raised `RuntimeError: Event loop is closed` from closing the first loop's connections (until December 7): they
are dropped, as a flow started on a new loop drops them. Against the real router:
tests/integration/sdk/test_close_in_flight.py."""

from __future__ import annotations

import asyncio

import pytest

from agent_sandbox_sdk import AsyncSandboxClient, SandboxDirectConnectionConfig
from agent_sandbox_sdk._driver import AsyncDriver

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit


class _LoopBound:
    """A pooled client or channel that, as httpx2's and grpc.aio's, can only be closed on its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed_on: list[asyncio.AbstractEventLoop] = []

    async def _close(self) -> None:
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError("Event loop is closed")
        self.closed_on.append(self.loop)

    aclose = close = _close


def test_aclose_on_a_new_loop_drops_what_the_old_loop_opened() -> None:
    driver = AsyncDriver(endpoint())
    opened: list[_LoopBound] = []

    async def work() -> None:
        driver._follow_loop()
        client, channel = _LoopBound(), _LoopBound()
        opened.extend([client, channel])
        driver._clients["plaintext"] = client
        driver._channels["aio router:80 ()"] = channel

    asyncio.run(work())
    asyncio.run(driver.aclose())  # raised RuntimeError
    assert driver._clients == {}
    assert driver._channels == {}
    assert all(not bound.closed_on for bound in opened)
    del opened[:]

    async def same_loop() -> list[asyncio.AbstractEventLoop]:
        await work()
        await driver.aclose()  # on the loop that opened them: closed
        return opened[0].closed_on + opened[1].closed_on

    assert len(asyncio.run(same_loop())) == 2


def test_a_client_closed_on_a_new_loop_after_its_work() -> None:
    fake = FakeCluster()
    client = AsyncSandboxClient(
        SandboxDirectConnectionConfig(api_url=ROUTER),
        api_client=endpoint(),
        transport=fake.transport(),
        cleanup=False,
    )

    async def work() -> str:
        sandbox = await client.create_sandbox("python-pool")
        assert sandbox.commands is not None
        return (await sandbox.commands.run("echo hi")).stdout

    assert asyncio.run(work()) == "ran echo hi\n"
    asyncio.run(client.close())
    asyncio.run(client.close())
