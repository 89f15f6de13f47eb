"""h2c connections are pinned to one sandbox: a stream naming another never reaches the first.

gRPC clients put several calls on one connection: calls on one channel, and by default calls on several
channels to the same address (grpc's global subchannel pool), so a user with one channel per sandbox, all
through one router, shares connections too. The router pins a connection to the sandbox its first stream
names and refuses later streams that name another with GOAWAY, unprocessed, so the client retries them on
a new connection. These tests use the real grpcio client and server, and raw frames where the exact bytes
reaching the sandbox matter.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest

from agent_sandbox.api import processv1 as pb
from agent_sandbox.router import Router
from agent_sandbox.runtime import RuntimeConfig, RuntimeServer
from tests.helpers import eventually
from tests.integration.runtime.helpers import ProcessClient

from .conftest import fresh_ip

pytestmark = pytest.mark.integration


class Sandbox:
    """A real gRPC server on its own loopback address that answers with its own name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ip = fresh_ip()
        self.calls = 0
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "echo.Echo",
                    {
                        "Who": grpc.unary_unary_rpc_method_handler(self._who),
                        "Count": grpc.unary_stream_rpc_method_handler(self._count),
                    },
                ),
            )
        )
        self.port = self.server.add_insecure_port(f"{self.ip}:0")

    async def _who(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.calls += 1
        return self.name.encode()

    async def _count(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        self.calls += 1
        for i in range(int(request)):
            await asyncio.sleep(0.1)
            yield f"{self.name} {i}".encode()

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (
            ("x-sandbox-id", self.name),
            ("x-sandbox-pod-ip", self.ip),
            ("x-sandbox-port", str(self.port)),
        )


@pytest.fixture
async def sandboxes() -> AsyncIterator[tuple[Sandbox, Sandbox]]:
    pair = (Sandbox("alpha"), Sandbox("beta"))
    for sandbox in pair:
        await sandbox.server.start()
    try:
        yield pair
    finally:
        for sandbox in pair:
            await sandbox.server.stop(None)


@pytest.fixture
async def h2c_router(start_router: Callable[..., Awaitable[Router]]) -> Router:
    return await start_router("--enable-h2c")


def _who(channel: grpc.aio.Channel) -> Any:
    return channel.unary_unary("/echo.Echo/Who")


# A channel of its own connection (grpc otherwise shares connections between channels to one address).
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


async def test_concurrent_calls_on_a_new_connection_reach_their_own_sandbox(
    h2c_router: Router, sandboxes: tuple[Sandbox, Sandbox]
) -> None:
    """Two calls started together on a new connection leave in one write: the first is forwarded, the
    second refused unprocessed and retried by gRPC on a new connection. (The router used to check only the
    first stream of a read, so the second call ran in the first call's sandbox.)"""
    alpha, beta = sandboxes
    for _ in range(10):
        target = f"127.0.0.1:{h2c_router.http_port}"
        async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
            who = _who(channel)
            answers = await asyncio.gather(
                who(b"", metadata=alpha.metadata(), timeout=10),
                who(b"", metadata=beta.metadata(), timeout=10),
            )
        assert answers == [b"alpha", b"beta"]


async def test_a_channel_per_sandbox(h2c_router: Router, sandboxes: tuple[Sandbox, Sandbox]) -> None:
    """The usage docs/router.md recommends (and the SDK follows): a channel per sandbox, each with its own
    connection. Every call succeeds, however they interleave."""
    alpha, beta = sandboxes
    target = f"127.0.0.1:{h2c_router.http_port}"
    async with (
        grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as a,
        grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as b,
    ):
        for _ in range(5):
            calls = [(_who(a), alpha), (_who(b), beta)] * 3
            answers = await asyncio.gather(*(who(b"", metadata=s.metadata(), timeout=10) for who, s in calls))
            assert answers == [s.name.encode() for _, s in calls]


async def test_mixed_calls_are_never_misrouted(
    h2c_router: Router, sandboxes: tuple[Sandbox, Sandbox]
) -> None:
    """Calls naming both sandboxes, interleaved on one connection: each one either reaches its own sandbox
    or fails UNAVAILABLE. gRPC retries a refused call once, on a new connection; when the retried calls
    are mixed again, the router refuses again and the second refusal reaches the caller (docs/router.md)."""
    alpha, beta = sandboxes
    order = [alpha, beta, alpha, beta, alpha]
    succeeded = 0
    for _ in range(5):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{h2c_router.http_port}") as channel:
            who = _who(channel)
            answers = await asyncio.gather(
                *(who(b"", metadata=s.metadata(), timeout=10) for s in order), return_exceptions=True
            )
        for sandbox, answer in zip(order, answers, strict=True):
            if isinstance(answer, grpc.aio.AioRpcError):
                assert answer.code() == grpc.StatusCode.UNAVAILABLE, answer
            else:
                assert answer == sandbox.name.encode()
                succeeded += 1
    assert succeeded >= 5  # at least the first call of every connection
    assert alpha.calls + beta.calls == succeeded  # a refused stream never reached a sandbox


async def test_a_refused_stream_leaves_the_accepted_ones_running(
    h2c_router: Router, sandboxes: tuple[Sandbox, Sandbox]
) -> None:
    """A stream naming another sandbox on a busy connection: the streams in flight finish (the refusal
    does not close the connection under them) and the refused call succeeds on a new connection."""
    alpha, beta = sandboxes
    target = f"127.0.0.1:{h2c_router.http_port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        counting = channel.unary_stream("/echo.Echo/Count")(b"10", metadata=alpha.metadata(), timeout=15)
        first = await counting.read()
        assert first == b"alpha 0"
        assert await _who(channel)(b"", metadata=beta.metadata(), timeout=10) == b"beta"
        rest = []
        while (message := await counting.read()) is not grpc.aio.EOF:
            rest.append(message)
    assert rest == [f"alpha {i}".encode() for i in range(1, 10)]
    assert await counting.code() == grpc.StatusCode.OK


# ---------------------------------------------------------------------------------------------- raw frames

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, SETTINGS, GOAWAY = 0x1, 0x4, 0x7
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(ftype: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + stream.to_bytes(4, "big") + payload


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of every complete frame in `data`."""
    out, pos = [], 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        if len(data) - pos < 9 + length:
            break
        out.append(
            (
                data[pos + 3],
                data[pos + 4],
                int.from_bytes(data[pos + 5 : pos + 9], "big"),
                data[pos + 9 : pos + 9 + length],
            )
        )
        pos += 9 + length
    return out


class RecordingSandbox:
    """A raw h2c sandbox on its own loopback address: sends SETTINGS, records every byte it receives."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.got_headers = asyncio.Event()
        self.ip = fresh_ip()
        self.port = 0
        self.server: asyncio.Server | None = None
        self._encoder = hpack.Encoder()

    async def __aenter__(self) -> RecordingSandbox:
        self.server = await asyncio.start_server(self._serve, self.ip, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frame(SETTINGS, 0, 0, b""))
        while chunk := await reader.read(65536):
            self.received.extend(chunk)
            if any(t == HEADERS for t, *_ in self.relayed()):
                self.got_headers.set()
        writer.close()

    def relayed(self) -> list[tuple[int, int, int, bytes]]:
        """The frames that reached this sandbox after the preface."""
        return frames(bytes(self.received[len(PREFACE) :]))

    def request(self, stream: int, name: str) -> bytes:
        """A gRPC request's HEADERS frame naming sandbox `name` at this address."""
        block = self._encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", "/echo.Echo/Who"),
                (":authority", "router"),
                ("x-sandbox-id", name),
                ("x-sandbox-pod-ip", self.ip),
                ("x-sandbox-port", str(self.port)),
            ]
        )
        return frame(HEADERS, END_HEADERS | END_STREAM, stream, block)


async def test_a_stream_naming_another_sandbox_never_reaches_the_first(h2c_router: Router) -> None:
    """Byte-level: of three streams in one write (alpha, beta, alpha), the sandbox the connection is
    pinned to receives only the first; the client gets GOAWAY naming it, so it retries 3 and 5."""
    async with RecordingSandbox() as sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(
                PREFACE
                + frame(SETTINGS, 0, 0, b"")
                + sandbox.request(1, "alpha")
                + sandbox.request(3, "beta")
                + sandbox.request(5, "alpha")
            )
            await writer.drain()
            seen = b""
            async with asyncio.timeout(10):
                while not any(t == GOAWAY for t, *_ in frames(seen)):
                    chunk = await reader.read(65536)
                    assert chunk, f"closed without GOAWAY: {frames(seen)}"
                    seen += chunk
                await sandbox.got_headers.wait()
            goaway = next(p for t, _, _, p in frames(seen) if t == GOAWAY)
            assert (int.from_bytes(goaway[:4], "big"), int.from_bytes(goaway[4:8], "big")) == (1, 0)
            await asyncio.sleep(0.3)  # anything else would have been relayed by now
            relayed = sandbox.relayed()
            assert [(t, s) for t, _, s, _ in relayed if t == HEADERS] == [(HEADERS, 1)], relayed
            assert not writer.is_closing()  # the connection stays up for stream 1
        finally:
            writer.close()


@pytest.mark.parametrize("split", [1, 5, 14, 23])
async def test_a_preface_that_arrives_in_pieces_is_still_h2c(h2c_router: Router, split: int) -> None:
    """The router told h2c from HTTP/1.1 by its first read alone: a client (or a TCP relay) that wrote the
    preface in pieces got `HTTP/1.1 400` instead of HTTP/2."""
    async with RecordingSandbox() as sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(PREFACE[:split])
            await writer.drain()
            await asyncio.sleep(0.2)
            writer.write(PREFACE[split:] + frame(SETTINGS, 0, 0, b"") + sandbox.request(1, "alpha"))
            await writer.drain()
            async with asyncio.timeout(10):
                first = await reader.read(9)
                assert not first.startswith(b"HTTP/"), first
                assert frames(first + await reader.read(65536))[0][0] == SETTINGS
                await sandbox.got_headers.wait()
        finally:
            writer.close()


async def test_binary_metadata_leaves_the_connection_up(
    h2c_router: Router, sandboxes: tuple[Sandbox, Sandbox]
) -> None:
    """gRPC sends `-bin` metadata (grpc-trace-bin) as raw bytes once the connection is set up; the router
    decoded header blocks as UTF-8 and dropped the connection, ending every call on it (a running command's
    stream included)."""
    alpha, _ = sandboxes
    target = f"127.0.0.1:{h2c_router.http_port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        who = _who(channel)
        assert await who(b"", metadata=alpha.metadata(), timeout=10) == b"alpha"
        counting = channel.unary_stream("/echo.Echo/Count")(b"5", metadata=alpha.metadata(), timeout=10)
        first = await counting.read()
        assert first == b"alpha 0"
        binary = (*alpha.metadata(), ("trace-bin", b"\x00\x80\xff\x01"))
        assert await who(b"", metadata=binary, timeout=10) == b"alpha"
        rest = [await counting.read() for _ in range(4)]
        assert await counting.read() == grpc.aio.EOF
    assert rest == [f"alpha {i}".encode() for i in range(1, 5)]


# ------------------------------------------------------------------ X-Sandbox-Timeout is not part of the pin


def _timed_request(sandbox: RecordingSandbox, encoder: hpack.Encoder, stream: int, timeout: str) -> bytes:
    """A gRPC request's HEADERS frame for `sandbox` carrying `x-sandbox-timeout: <timeout>`."""
    block = encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/echo.Echo/Who"),
            (":authority", "router"),
            ("x-sandbox-id", "alpha"),
            ("x-sandbox-pod-ip", sandbox.ip),
            ("x-sandbox-port", str(sandbox.port)),
            ("x-sandbox-timeout", timeout),
        ]
    )
    return frame(HEADERS, END_HEADERS | END_STREAM, stream, block)


async def test_streams_differing_only_in_x_sandbox_timeout_share_the_connection(h2c_router: Router) -> None:
    """Byte-level: `x-sandbox-timeout` says nothing about which sandbox a call is for, so streams that differ
    only in it all reach the pinned sandbox, in one write and one after another, and no GOAWAY comes back.
    (The pin compared the whole route, timeout included: every such stream was refused with a GOAWAY and
    gRPC reconnected for each call; 26-28 of 32 concurrent calls from a pool of threads failed
    `UNAVAILABLE: Stream removed`.) An invalid value is not refused either: on h2c the header is ignored
    (docs/router.md), as upstream's Go router ignores it."""
    async with RecordingSandbox() as sandbox:
        encoder = hpack.Encoder()
        reader, writer = await asyncio.open_connection("127.0.0.1", h2c_router.http_port)
        try:
            writer.write(
                PREFACE
                + frame(SETTINGS, 0, 0, b"")
                + _timed_request(sandbox, encoder, 1, "30")
                + _timed_request(sandbox, encoder, 3, "31")
                + _timed_request(sandbox, encoder, 5, "0.5")
            )
            await writer.drain()
            for stream, timeout in ((7, "60"), (9, "not-a-number"), (11, "30")):
                await asyncio.sleep(0.1)
                writer.write(_timed_request(sandbox, encoder, stream, timeout))
                await writer.drain()
            expected = [1, 3, 5, 7, 9, 11]

            async def all_relayed() -> bool:
                return [s for t, _, s, _ in sandbox.relayed() if t == HEADERS] == expected

            await eventually(all_relayed, f"streams {expected} at the sandbox", within=10, interval=0.05)
            await asyncio.sleep(0.3)  # a GOAWAY would have been written by now
            seen = b""
            while True:
                try:
                    async with asyncio.timeout(0.2):
                        chunk = await reader.read(65536)
                except TimeoutError:
                    break
                assert chunk, f"connection closed: {frames(seen)}"
                seen += chunk
            assert not [f for f in frames(seen) if f[0] == GOAWAY], frames(seen)
            assert [s for t, _, s, _ in sandbox.relayed() if t == HEADERS] == expected
            assert not writer.is_closing()
        finally:
            writer.close()


# ------------------------------------------------- the project's runtime (process.v1) behind the router


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[RuntimeServer]:
    """The project's runtime on its own loopback address; its gRPC port serves process.v1 (sandboxd's)."""
    server = RuntimeServer(
        RuntimeConfig(
            root_dir=tmp_path / "root", listen_host=fresh_ip(), legacy_port=0, rest_port=0, grpc_port=0
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop(2.0)


def _runtime_metadata(runtime: RuntimeServer, timeout: str | None = None) -> tuple[tuple[str, str], ...]:
    metadata = (
        ("x-sandbox-id", "runtime"),
        ("x-sandbox-namespace", "default"),
        ("x-sandbox-pod-ip", runtime.config.listen_host),
        ("x-sandbox-port", str(runtime.ports["grpc"])),
    )
    return metadata if timeout is None else (*metadata, ("x-sandbox-timeout", timeout))


async def test_calls_differing_only_in_x_sandbox_timeout_are_all_served(
    h2c_router: Router, runtime: RuntimeServer
) -> None:
    """The probe that found it: 32 concurrent Execute calls on one connection, each with its own
    `x-sandbox-timeout` (as the SDK sends it: the call's read timeout), all succeed."""
    target = f"127.0.0.1:{h2c_router.http_port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        client = ProcessClient(channel)

        async def execute(i: int) -> pb.ExecuteResponse:
            request = pb.ExecuteRequest(config=pb.ProcessConfig(command=["echo", str(i)]))
            response: pb.ExecuteResponse = await client.execute_call(
                request, metadata=_runtime_metadata(runtime, str(30 + i)), timeout=30
            )
            return response

        results = await asyncio.gather(*(execute(i) for i in range(32)), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        assert not failed, f"{len(failed)} of 32 failed, first: {failed[0]!r}"
        assert [(r.exit_code, r.stdout) for r in results] == [(0, f"{i}\n".encode()) for i in range(32)]  # type: ignore[union-attr]


async def test_on_h2c_the_call_deadline_is_grpc_timeout_not_x_sandbox_timeout(
    h2c_router: Router, runtime: RuntimeServer
) -> None:
    """What docs/router.md says: on h2c the router does not apply `x-sandbox-timeout` to a stream (it would
    have to end a stream in the middle of a multiplexed connection it only inspects); a call's deadline is
    gRPC's own (`grpc-timeout`), which the client and the runtime enforce."""
    target = f"127.0.0.1:{h2c_router.http_port}"
    sleep = pb.ExecuteRequest(config=pb.ProcessConfig(command=["sleep", "1.5"]))
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        client = ProcessClient(channel)
        start = time.monotonic()
        response = await client.execute_call(sleep, metadata=_runtime_metadata(runtime, "0.3"), timeout=30)
        assert response.exit_code == 0
        assert time.monotonic() - start >= 1.4
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.execute_call(sleep, metadata=_runtime_metadata(runtime, "60"), timeout=0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - start < 1.2
        # The connection carries on after a call that ran out (both calls above used it).
        response = await client.execute_call(
            pb.ExecuteRequest(config=pb.ProcessConfig(command=["echo", "ok"])),
            metadata=_runtime_metadata(runtime, "5"),
            timeout=30,
        )
        assert response.stdout == b"ok\n"
