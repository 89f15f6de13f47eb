"""A legacy command stream without a timeout is bounded by its silence, not unbounded (ours).

The runtime answers the response head as the command starts and then writes a keep-alive line after 30 s of
silence, so 90 s without a byte means the router or the sandbox stopped answering. Until December 6 such a
stream (`commands.stream(cmd)`, `agent-sandbox exec` without --timeout) waited for good. The real runtime's
keep-alive lines carrying a quiet command past the limit: tests/integration/cli/test_unanswered.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import SandboxRequestTimeoutError

from .fakes import FakeCluster
from .test_flows import run_async, sync_client

pytestmark = pytest.mark.unit


def _read_timeout(request: httpx2.Request) -> float | None:
    timeout: dict[str, float | None] = request.extensions["timeout"]
    return timeout["read"]


@pytest.mark.parametrize(("timeout", "read", "header"), [(None, 90.0, "90"), (5, 15.0, "15")])
def test_the_stream_is_read_with_an_idle_limit(timeout: float | None, read: float, header: str) -> None:
    fake = FakeCluster()
    seen: list[httpx2.Request] = []
    handle = fake.handle

    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/execute/stream":
            seen.append(request)
            lines = b'{"type": "start", "pid": 7}\n{"type": "exit", "exit_code": 0, "timed_out": false}\n'
            return httpx2.Response(200, headers={"content-type": "application/x-ndjson"}, content=lines)
        return handle(request)

    fake.handle = answer  # type: ignore[method-assign]
    sandbox = sync_client(fake).create_sandbox("pool")
    assert sandbox.commands is not None
    assert sandbox.commands.stream("true", timeout=timeout).wait() == 0
    assert _read_timeout(seen[0]) == read
    # the router allows the same silence (and as long to reach the sandbox)
    assert seen[0].headers["X-Sandbox-Timeout"] == header


class _GoesQuiet(httpx2.SyncByteStream, httpx2.AsyncByteStream):
    """The start line, then nothing: the read times out (a router or sandbox that stopped answering)."""

    def __init__(self, request: httpx2.Request) -> None:
        self.request = request

    def __iter__(self) -> Iterator[bytes]:
        yield b'{"type": "start", "pid": 7}\n{"type": "stdout", "data": "before"}\n'
        raise httpx2.ReadTimeout("timed out", request=self.request)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.__iter__():
            yield chunk


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("where", ["head", "body"])
def test_silence_is_said_as_such(mode: str, where: str) -> None:
    fake = FakeCluster()
    handle = fake.handle

    def silent(request: httpx2.Request) -> httpx2.Response:
        if request.url.path == "/execute/stream":
            fake.requests.append(request)
            if where == "head":
                raise httpx2.ReadTimeout("timed out", request=request)
            stream = _GoesQuiet(request)
            return httpx2.Response(200, headers={"content-type": "application/x-ndjson"}, stream=stream)
        return handle(request)

    fake.handle = silent  # type: ignore[method-assign]
    seen: list[bytes] = []

    def consume(sb: Any) -> None:
        for event in sb.commands.stream("sleep 300"):
            seen.append(event.data)

    async def consume_async(sb: Any) -> None:
        async for event in sb.commands.stream("sleep 300"):
            seen.append(event.data)

    async def consume_created(client: Any) -> None:
        await consume_async(await client.create_sandbox("pool"))

    def run() -> None:
        if mode == "sync":
            consume(sync_client(fake).create_sandbox("pool"))
        else:
            run_async(fake, consume_created)

    with pytest.raises(SandboxRequestTimeoutError) as info:
        run()
    assert seen == ([] if where == "head" else [b"before"])
    message = str(info.value)
    assert message.startswith("POST http://router.test/execute/stream: timed out (ReadTimeout)"), message
    assert "no answer from the router or the sandbox for 90 s" in message
    assert info.value.status_code is None
