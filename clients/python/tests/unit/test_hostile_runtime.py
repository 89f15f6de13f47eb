"""What a sandbox answers is untrusted: the code inside can replace the runtime server. Whatever bytes come
back for a command or a file operation, the SDK raises a `SandboxError` (or returns a well-typed result),
never a `KeyError`, `TypeError` or pydantic error from deep inside (a caller catching `SandboxError` must
catch every failure of the sandbox)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxError,
    _bodies,
    _calls,
)
from agent_sandbox_sdk._steps import StreamHandle
from agent_sandbox_sdk.models import ExecutionResult, FileEntry

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
KEYS = st.sampled_from(
    [
        "stdout",
        "stderr",
        "exit_code",
        "timed_out",
        "truncated",
        "exists",
        "entries",
        "name",
        "type",
        "size",
        "mtime",
        "path",
        "message",
        "detail",
        "code",
    ]
)
SHAPED = st.dictionaries(
    KEYS, JSON | st.lists(st.dictionaries(KEYS, JSON, max_size=4), max_size=3), max_size=5
)
BODIES = st.one_of(
    st.binary(max_size=60),
    JSON.map(lambda v: json.dumps(v).encode()),
    SHAPED.map(lambda v: json.dumps(v).encode()),
)
STATUSES = st.sampled_from([200, 200, 200, 201, 204, 206, 301, 400, 404, 409, 413, 500, 503])


class Hostile(FakeCluster):
    """The fake cluster and router, with a runtime that answers `answer` to everything."""

    answer: tuple[int, bytes] = (200, b"{}")

    def _runtime(self, request: httpx2.Request, path: str) -> httpx2.Response:
        status, body = self.answer
        return httpx2.Response(status, content=body, headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def handle() -> Any:
    fake = Hostile()
    client = SandboxClient(
        SandboxDirectConnectionConfig(api_url=ROUTER), api_client=endpoint(), transport=fake.transport()
    )
    sandbox = client.create_sandbox("pool")
    return fake, sandbox


def with_async_sandbox(fake: Hostile, body: Callable[[Any], Awaitable[None]]) -> None:
    """Run `body` on a sandbox of an `AsyncSandboxClient` over the same fake (the other driver)."""

    async def main() -> None:
        client = AsyncSandboxClient(
            SandboxDirectConnectionConfig(api_url=ROUTER),
            api_client=endpoint(),
            transport=fake.transport(),
            cleanup=False,
        )
        try:
            await body(await client.create_sandbox("pool"))
        finally:
            await client.close()

    asyncio.run(main())


OPERATIONS = st.sampled_from(
    ["run", "run-env", "stream", "read", "read_to", "write", "list", "exists", "delete"]
)
# NDJSON as the streaming endpoint sends it, lines of any JSON
LINES = st.lists(
    st.one_of(
        JSON,
        SHAPED,
        st.fixed_dictionaries(
            {"type": st.sampled_from(["start", "stdout", "exit"])},
            optional={
                "data": JSON,
                "data_base64": JSON | st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()),
                "exit_code": JSON,
                "timed_out": JSON,
            },
        ),
    ),
    max_size=4,
).map(lambda lines: b"".join(json.dumps(v).encode() + b"\n" for v in lines))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=STATUSES, body=BODIES | LINES, operation=OPERATIONS)
def test_any_answer_is_a_result_or_a_sandbox_error(
    handle: Any, monkeypatch: pytest.MonkeyPatch, status: int, body: bytes, operation: str
) -> None:
    monkeypatch.setattr(_calls, "BACKOFF_BASE", 0.0)
    fake, sandbox = handle
    fake.answer = (status, body)
    try:
        if operation == "run":
            assert isinstance(sandbox.commands.run("true"), ExecutionResult)
        elif operation == "run-env":
            assert isinstance(sandbox.commands.run("true", env={"A": "1"}, cwd="/"), ExecutionResult)
        elif operation == "stream":
            with sandbox.commands.stream("true") as events:
                for item in events:
                    assert item.type in ("stdout", "stderr", "exit")
        elif operation == "read":
            assert isinstance(sandbox.files.read("a.txt"), bytes)
        elif operation == "read_to":
            sandbox.files.read_to("a.txt", io.BytesIO())
        elif operation == "write":
            sandbox.files.write("a.txt", b"x")
        elif operation == "list":
            entries = sandbox.files.list(".")
            assert all(isinstance(e, FileEntry) for e in entries)
        elif operation == "exists":
            assert isinstance(sandbox.files.exists("a.txt"), bool)
        else:
            sandbox.files.delete("a.txt")
    except SandboxError:
        pass


def test_a_line_without_end_is_cut_off(handle: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime that streams one endless line: the client stops at `MAX_LINE_BYTES` instead of buffering
    it all (both drivers)."""
    monkeypatch.setattr(_bodies, "MAX_LINE_BYTES", 1 << 16)
    fake, sandbox = handle
    fake.answer = (200, b'{"type": "start"}\n' + b"x" * (1 << 17))
    with (
        pytest.raises(SandboxError, match="streamed line longer than 65536 bytes"),
        sandbox.commands.stream("true") as events,
    ):
        list(events)

    async def drain(sb: Any) -> None:
        async with sb.commands.stream("true") as events:
            async for _ in events:
                pass

    with pytest.raises(SandboxError, match="streamed line longer"):
        with_async_sandbox(fake, drain)


def test_lines_split_anywhere() -> None:
    lines = _bodies.Lines()
    handle = StreamHandle(200, {}, "GET", "http://x", None)
    for chunk in (b'{"a"', b": 1}\r\n\n{", b'"b": 2}\n', b"tail"):
        lines.feed(chunk, handle)
    lines.feed(None, handle)
    assert list(lines.lines) == ['{"a": 1}', "", '{"b": 2}', "tail"]


@pytest.mark.parametrize("operation", ["run", "list", "exists"])
def test_an_oversized_answer_is_refused(handle: Any, operation: str) -> None:
    """A runtime answering past the limit where a command result or a listing is expected: the client stops
    reading there (16 MiB for /execute, 32 MiB for listings, as the Go SDK) instead of holding it all."""
    fake, sandbox = handle
    size = (17 << 20) if operation == "run" else (33 << 20)
    fake.answer = (200, b'{"stdout": "' + b"x" * size + b'"}')
    calls = {
        "run": lambda: sandbox.commands.run("true"),
        "list": lambda: sandbox.files.list("."),
        "exists": lambda: sandbox.files.exists("a"),
    }
    with pytest.raises(SandboxError, match="the answer is larger than"):
        calls[operation]()


def test_an_oversized_answer_is_refused_async(handle: Any) -> None:
    fake, _ = handle
    fake.answer = (200, b'{"stdout": "' + b"x" * (17 << 20) + b'"}')

    async def run(sandbox: Any) -> None:
        await sandbox.commands.run("true")

    with pytest.raises(SandboxError, match="the answer is larger than"):
        with_async_sandbox(fake, run)
