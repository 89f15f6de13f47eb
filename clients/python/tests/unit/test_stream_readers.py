"""A command stream read by one thread (or task) while another waits for its start: when the stream fails
before the start, the waiter is released (it waited forever until December 6). Pure logic: the driver's
event iterator is a stand-in that fails."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from agent_sandbox_sdk import _commands
from agent_sandbox_sdk.async_sandbox import AsyncCommandStream
from agent_sandbox_sdk.sandbox import CommandStream

pytestmark = pytest.mark.unit


class FailingSync:
    def iterate(self, flow: Any) -> Iterator[Any]:
        time.sleep(0.2)
        raise RuntimeError("stream failed before the start")
        yield  # a generator


class FailingAsync:
    async def _events(self) -> AsyncIterator[Any]:
        await asyncio.sleep(0.2)
        raise RuntimeError("stream failed before the start")
        yield  # an async generator

    def iterate(self, flow: Any) -> AsyncIterator[Any]:
        return self._events()


def test_a_waiter_is_released_when_the_readers_stream_fails() -> None:
    stream = CommandStream(FailingSync(), None, None, _commands.ProcessRef(legacy=False))  # type: ignore[arg-type]
    failures: list[BaseException] = []

    def read() -> None:
        try:
            for _ in stream:
                pass
        except RuntimeError as err:
            failures.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.05)
    waiter = threading.Thread(target=stream.wait_started, daemon=True)
    waiter.start()
    waiter.join(3)
    reader.join(3)
    assert not waiter.is_alive()
    assert len(failures) == 1


async def test_a_waiting_task_is_released_when_the_readers_stream_fails() -> None:
    stream = AsyncCommandStream(FailingAsync(), None, None, _commands.ProcessRef(legacy=False))  # type: ignore[arg-type]

    async def read() -> None:
        async for _ in stream:
            pass

    reading = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    await asyncio.wait_for(stream.wait_started(), 3)
    with pytest.raises(RuntimeError):
        await reading
