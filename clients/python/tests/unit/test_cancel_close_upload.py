"""The async client around cancellation, `close()` and slow upload sources (in-memory API + runtime, `fakes.py`;
the same cases against the real control plane, router and runtime: tests/integration/sdk/test_concurrent_use.py).

- A cancellation landing while a completed create closes its watch ends the create itself, so that
  `asyncio.timeout` raises TimeoutError - and the claim is tracked, so the client still deletes it. Until
  December 6 the create returned inside the block and the next, unrelated await raised a CancelledError.
- `files.write(path, fileobj)` reads the file object on a worker thread: a pipe fed slowly stalled the
  whole event loop.
- `list_active_sandboxes()` after `close()` dropped the closed handles from the registry, and the claims
  they stood for were then never deleted at cleanup.
- A stream read across the client's own `close()` fails with "... (client closed)", as a `run` does (the
  legacy stream blamed the sandbox or a proxy; a sync stream went on to exit 0).
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest

from agent_sandbox_sdk import (
    AsyncSandboxClient,
    SandboxClient,
    SandboxConnectionError,
    SandboxDirectConnectionConfig,
)
from agent_sandbox_sdk._driver import AsyncDriver, SyncDriver
from agent_sandbox_sdk._steps import HttpRequest, Open, ReadChunk, Send, StreamHandle

from .fakes import ROUTER, FakeCluster, endpoint

pytestmark = pytest.mark.unit

CONFIG = SandboxDirectConnectionConfig(api_url=ROUTER)


def _client(fake: FakeCluster) -> AsyncSandboxClient:
    return AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)


def test_a_timeout_landing_as_a_create_closes_its_watch_raises_from_the_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = AsyncDriver._release
    closing = asyncio.Event()

    async def slow_release(handle: Any) -> None:
        if isinstance(handle, StreamHandle):  # the claim watch, once the claim is Ready
            closing.set()
            await asyncio.sleep(0.2)
        await original(handle)

    monkeypatch.setattr(AsyncDriver, "_release", staticmethod(slow_release))
    fake = FakeCluster()

    async def main() -> tuple[bool, list[tuple[str, str]], int]:
        async with _client(fake) as client:
            timed_out = False
            try:
                async with asyncio.timeout(None) as deadline:

                    async def expire_while_closing() -> None:
                        await closing.wait()
                        deadline.reschedule(asyncio.get_running_loop().time())

                    expiring = asyncio.create_task(expire_while_closing())
                    await client.create_sandbox("python-pool")
            except TimeoutError:
                timed_out = True
            await expiring
            await asyncio.sleep(0)  # no cancellation left pending for a later await
            task = asyncio.current_task()
            assert task is not None
            return timed_out, await client.list_active_sandboxes(), task.cancelling()

    timed_out, tracked, cancelling = asyncio.run(main())
    assert timed_out
    assert cancelling == 0
    assert len(tracked) == 1  # the Ready claim was tracked before the cancellation was raised ...
    assert tracked[0][1] not in fake.claims  # ... so the end of the `async with` deleted it


def test_an_async_write_from_a_blocking_file_object_leaves_the_event_loop_running() -> None:
    """The source blocks until a coroutine on the loop lets it go: only a read off the loop can finish."""
    released = threading.Event()

    class SlowPipe(io.RawIOBase):
        def __init__(self) -> None:
            self.chunks = [b"a" * 10, b"b" * 10]
            self.waited: bool | None = None

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            if self.waited is None:
                self.waited = released.wait(10)  # False: nothing on the loop ran meanwhile
            return self.chunks.pop(0) if self.chunks else b""

    fake = FakeCluster()
    pipe = SlowPipe()

    async def main() -> int:
        async with _client(fake) as client:
            sandbox = await client.create_sandbox("python-pool")
            assert sandbox.files is not None
            ticks = 0

            async def other_work() -> None:
                nonlocal ticks
                while not released.is_set():
                    await asyncio.sleep(0.01)
                    ticks += 1
                    if ticks == 5:
                        released.set()

            await asyncio.gather(sandbox.files.write("from-a-pipe", pipe), other_work())
            assert fake.files.get("from-a-pipe") == b"a" * 10 + b"b" * 10
            return ticks

    assert asyncio.run(main()) == 5
    assert pipe.waited is True


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_listing_after_close_keeps_the_claims_cleanup_deletes(mode: str) -> None:
    fake = FakeCluster()
    if mode == "sync":
        with SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()) as client:
            auto = client.create_sandbox("python-pool")
            named = client.create_sandbox("python-pool", claim_name="keep-me")
            client.close()
            assert client.list_active_sandboxes() == []
    else:

        async def main() -> Any:
            async with _client(fake) as client:
                auto = await client.create_sandbox("python-pool")
                await client.create_sandbox("python-pool", claim_name="keep-me")
                await client.close()
                assert await client.list_active_sandboxes() == []
                return auto

        auto = asyncio.run(main())
    assert auto.claim_name not in fake.claims  # deleted by the end of the `with` block, listed or not
    assert "keep-me" in fake.claims
    if mode == "sync":
        assert not named.is_active


def _stream_flow():  # type: ignore[no-untyped-def]
    handle = yield Open(HttpRequest("POST", f"{ROUTER}/execute/stream"))
    chunks = []
    while (chunk := (yield ReadChunk(handle))) is not None:
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_sync_stream_read_across_close_from_another_thread_fails_as_a_run_does() -> None:
    """A read blocked on a socket that another thread's `close()` closed still returns what arrives (Linux does
    not wake it): the stream then went on to the command's end, exit 0, while a `run` failed."""
    arrived = threading.Event()

    def body() -> Iterator[bytes]:
        yield b"first\n"
        arrived.wait(10)  # the next output, after the other thread closed the client
        yield b"exit\n"

    driver = SyncDriver(None, transport=httpx2.MockTransport(lambda r: httpx2.Response(200, content=body())))

    def close_then_answer() -> None:
        driver.close()
        arrived.set()

    threading.Timer(0.2, close_then_answer).start()
    with pytest.raises(
        SandboxConnectionError, match=r"POST http://router.test/execute/stream: .*\(client closed\)"
    ):
        driver.run(_stream_flow())
    assert driver.run(_stream_flow()) == b"first\nexit\n"  # after close() the driver reconnects lazily


def test_an_async_stream_read_across_aclose_says_the_client_closed_it() -> None:
    async def main() -> None:
        arrived = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            yield b"first\n"
            await arrived.wait()
            yield b"exit\n"

        driver = AsyncDriver(
            None, transport=httpx2.MockTransport(lambda r: httpx2.Response(200, content=body()))
        )

        async def close_then_answer() -> None:
            await asyncio.sleep(0.1)
            await driver.aclose()
            arrived.set()

        closing = asyncio.create_task(close_then_answer())
        with pytest.raises(SandboxConnectionError, match=r"\(client closed\)"):
            await driver.run(_stream_flow())
        await closing

    asyncio.run(main())


def test_an_answer_received_across_close_reaches_the_caller() -> None:
    """A request answered while another thread closed the client keeps its answer: it may have gone out on a
    connection opened after the close, and its result (a claim created, a file written) must not become an
    error the caller retries into a 409."""
    driver: SyncDriver

    def answer(request: httpx2.Request) -> httpx2.Response:
        driver.close()  # between the flow's step starting and its answer, as another thread may
        return httpx2.Response(201, json={"created": True})

    driver = SyncDriver(None, transport=httpx2.MockTransport(answer))

    def create():  # type: ignore[no-untyped-def]
        resp = yield Send(HttpRequest("POST", f"{ROUTER}/claims"))
        return resp.status_code

    assert driver.run(create()) == 201


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_claim_got_again_after_close_is_still_deleted_at_cleanup(mode: str) -> None:
    """`close()`, then `get_sandbox()` of an auto-named claim this client created: the new handle stands for
    the same claim, which cleanup still deletes. Until December 6 the new handle (not auto-named) replaced the
    closed one in the registry, and the claim outlived the process (close alone, or get alone, deleted it)."""
    fake = FakeCluster()
    if mode == "sync":
        with SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()) as client:
            auto = client.create_sandbox("python-pool")
            client.create_sandbox("python-pool", claim_name="keep-me")
            client.close()
            assert auto.claim_name is not None
            again = client.get_sandbox(auto.claim_name)
            assert again is not auto
            assert again.is_active
            client.get_sandbox("keep-me")
            assert again.commands is not None
            assert again.commands.run("echo hi").stdout == "ran echo hi\n"
    else:

        async def main() -> Any:
            async with _client(fake) as client:
                auto = await client.create_sandbox("python-pool")
                await client.create_sandbox("python-pool", claim_name="keep-me")
                await client.close()
                again = await client.get_sandbox(auto.claim_name)
                assert again is not auto
                assert again.is_active
                await client.get_sandbox("keep-me")
                assert again.commands is not None
                assert (await again.commands.run("echo hi")).stdout == "ran echo hi\n"
                return auto

        auto = asyncio.run(main())
    assert auto.claim_name not in fake.claims
    assert "keep-me" in fake.claims  # an explicit name is only disconnected, however often it was got


def test_a_claim_got_again_after_close_is_deleted_by_the_async_exit_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same through `AsyncSandboxClient`'s atexit hook (`cleanup=True`, a synchronous driver at exit)."""
    from agent_sandbox_sdk import async_sandbox_client

    fake = FakeCluster()
    monkeypatch.setattr(
        async_sandbox_client,
        "SyncDriver",
        lambda kube: SyncDriver(kube, transport=fake.transport()),
    )
    client = AsyncSandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport(), cleanup=False)

    async def main() -> str:
        sandbox = await client.create_sandbox("python-pool")
        await client.close()
        assert sandbox.claim_name is not None
        await client.get_sandbox(sandbox.claim_name)
        return sandbox.claim_name

    claim = asyncio.run(main())
    client._cleanup_at_exit()
    assert claim not in fake.claims


def test_a_forked_child_getting_its_parents_claim_again_does_not_delete_it() -> None:
    """Carrying "created here" over to a re-got handle is for the process that created the claim: a forked
    child that gets its parent's auto-named claim again, then exits normally, leaves it to the parent."""
    import os

    fake = FakeCluster()
    with SandboxClient(CONFIG, api_client=endpoint(), transport=fake.transport()) as client:
        sandbox = client.create_sandbox("python-pool")
        assert sandbox.claim_name is not None
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                client.close()
                client.get_sandbox(sandbox.claim_name)
                client.__exit__(None, None, None)  # the child runs to the end of the block
                status = 0 if not fake.find(lambda r: r.method == "DELETE") else 3
            finally:
                os._exit(status)
        _, wait_status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(wait_status) == 0
        assert sandbox.claim_name in fake.claims
    assert sandbox.claim_name not in fake.claims  # the parent's own exit deleted it
