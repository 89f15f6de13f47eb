"""On SIGTERM the router drains h2c connections as it drains HTTP/1.1 requests (docs/router.md, "SIGTERM with
h2c streams or tunnels open").

The client gets GOAWAY(NO_ERROR) naming the last stream the router accepted (RFC 9113 6.8): the streams
running go on to their end, later ones are refused unprocessed (RST_STREAM(REFUSED_STREAM)) and never reach
the sandbox, and the connection closes once the last accepted stream has ended - or at the drain's deadline,
like every connection still busy then. Until December 7 the drain took an h2c connection (which has no
HTTP/1.1 request) for idle and closed it at once: every gRPC stream through a router (sandboxd's
commands.stream/run) failed with UNAVAILABLE at each rollout, after the command had started.

A real router process and SIGTERM, real grpcio client and server (the gRPC `Sandbox` of test_h2c_pinning);
raw frames where the exact frames matter.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import hpack
import pytest

from agent_sandbox.api import processv1 as pb
from agent_sandbox.router import Router
from agent_sandbox.runtime import RuntimeConfig, RuntimeServer

from .conftest import RouterProcess, fresh_ip
from .test_h2c_pinning import (
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    OWN_CONNECTION,
    PREFACE,
    SETTINGS,
    Sandbox,
    _runtime_metadata,
    frame,
    frames,
)

pytestmark = pytest.mark.integration

DATA, RST_STREAM = 0x0, 0x3
NO_ERROR, REFUSED_STREAM = 0x0, 0x7


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    sandbox = Sandbox("alpha")
    await sandbox.server.start()
    try:
        yield sandbox
    finally:
        await sandbox.server.stop(None)


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[RuntimeServer]:
    """The project's runtime (sandboxd's process.v1 on its gRPC port), as in test_h2c_pinning."""
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


async def _terminate(router: RouterProcess) -> float:
    """SIGTERM; returns the monotonic time it was sent."""
    router.proc.send_signal(signal.SIGTERM)
    return time.monotonic()


async def test_a_stream_running_at_sigterm_completes_and_the_router_then_exits(
    router_process: Callable[..., RouterProcess], sandbox: Sandbox
) -> None:
    """The stream in flight when SIGTERM arrives delivers every message and status OK; a call started
    after the GOAWAY is not run here (the router is gone: UNAVAILABLE, and the sandbox never saw it); the
    router exits once the stream is done, within --shutdown-timeout."""
    router = router_process("--enable-h2c", "--shutdown-timeout=20s")
    target = f"127.0.0.1:{router.port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        counting = channel.unary_stream("/echo.Echo/Count")(b"20", metadata=sandbox.metadata(), timeout=30)
        assert await counting.read() == b"alpha 0"
        sent = await _terminate(router)
        rest = []
        while (message := await counting.read()) is not grpc.aio.EOF:
            rest.append(message)
        assert rest == [f"alpha {i}".encode() for i in range(1, 20)]
        assert await counting.code() == grpc.StatusCode.OK
        code = await asyncio.to_thread(router.proc.wait, 20)
        elapsed = time.monotonic() - sent
        calls = sandbox.calls
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/echo.Echo/Who")(b"", metadata=sandbox.metadata(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert sandbox.calls == calls
    log = router.log.read_text()
    assert code == 0, log[-2000:]
    assert "h2c: draining, GOAWAY(1) with 1 stream(s) open" in log
    assert "still busy" not in log  # ended by its stream, not cut at the deadline
    assert elapsed < 20, f"stopped {elapsed:.2f} s after SIGTERM"


async def test_a_runtime_command_streaming_at_sigterm_runs_to_its_exit(
    router_process: Callable[..., RouterProcess], runtime: RuntimeServer
) -> None:
    """The probe's case: the project's runtime (sandboxd's process.v1) behind a router process, a command
    streaming its output (`commands.stream`) when the router gets SIGTERM: every line and the exit arrive."""
    router = router_process("--enable-h2c", "--shutdown-timeout=20s")
    path, req, resp, _ = pb.METHODS["Start"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}", options=OWN_CONNECTION) as channel:
        start = channel.unary_stream(
            path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString
        )
        script = "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.2; done"
        request = pb.StartRequest(config=pb.ProcessConfig(command=["sh", "-c", script]))
        call = start(request, metadata=_runtime_metadata(runtime), timeout=30)
        stdout = b""
        exit_code = None
        async for event in call:
            if event.HasField("stdout"):
                if not stdout:
                    await _terminate(router)
                stdout += event.stdout
            elif event.HasField("exit"):
                exit_code = event.exit.exit_code
        assert await call.code() == grpc.StatusCode.OK
    assert (stdout, exit_code) == (b"1\n2\n3\n4\n5\n6\n7\n8\n", 0)
    assert await asyncio.to_thread(router.proc.wait, 20) == 0


async def _read_all(call: grpc.aio.UnaryStreamCall[bytes, bytes], into: list[bytes]) -> None:
    while (message := await call.read()) is not grpc.aio.EOF:
        into.append(message)


async def test_a_stream_longer_than_the_shutdown_timeout_is_cut_at_the_deadline(
    router_process: Callable[..., RouterProcess], sandbox: Sandbox
) -> None:
    timeout = 3.0
    router = router_process("--enable-h2c", f"--shutdown-timeout={timeout:g}s")
    target = f"127.0.0.1:{router.port}"
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION) as channel:
        counting = channel.unary_stream("/echo.Echo/Count")(b"600", metadata=sandbox.metadata(), timeout=60)
        assert await counting.read() == b"alpha 0"
        sent = await _terminate(router)
        received: list[bytes] = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _read_all(counting, received)
        elapsed = time.monotonic() - sent
        code = await asyncio.to_thread(router.proc.wait, 20)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    # It ran on through the drain (0.1 s a message), and was cut by the deadline.
    assert len(received) > 10
    assert elapsed < timeout + 1.0
    log = router.log.read_text()
    assert code == 0, log[-2000:]
    assert "closing 1 connection(s) still busy" in log


class AnsweringSandbox:
    """A raw h2c sandbox: answers each request it receives with a head; the test ends each stream itself."""

    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.port = 0
        self.streams: list[int] = []
        self.got: asyncio.Queue[int] = asyncio.Queue()
        self.writer: asyncio.StreamWriter | None = None
        self.server: asyncio.Server | None = None
        self.encoder = hpack.Encoder()

    async def __aenter__(self) -> AnsweringSandbox:
        self.server = await asyncio.start_server(self._serve, self.ip, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        if self.writer is not None:
            self.writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        writer.write(frame(SETTINGS, 0, 0, b""))
        buf = b""
        while chunk := await reader.read(65536):
            buf += chunk
            for ftype, _flags, stream, _payload in frames(buf[len(PREFACE) :]):
                if ftype == HEADERS and stream not in self.streams:
                    self.streams.append(stream)
                    head = self.encoder.encode([(":status", "200")])
                    writer.write(frame(HEADERS, END_HEADERS, stream, head))
                    self.got.put_nowait(stream)

    def end(self, stream: int) -> None:
        assert self.writer is not None
        self.writer.write(frame(DATA, END_STREAM, stream, b"bye"))


def _request(encoder: hpack.Encoder, sandbox: AnsweringSandbox, stream: int) -> bytes:
    block = encoder.encode(
        [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "router"),
            ("x-sandbox-id", "raw"),
            ("x-sandbox-pod-ip", sandbox.ip),
            ("x-sandbox-port", str(sandbox.port)),
        ]
    )
    return frame(HEADERS, END_HEADERS | END_STREAM, stream, block)


async def _read_frames(
    reader: asyncio.StreamReader, until: Callable[[list[tuple[int, int, int, bytes]]], bool]
) -> list[tuple[int, int, int, bytes]]:
    data = b""
    while not until(got := frames(data)):
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        assert chunk, f"closed before expected; frames so far: {got}"
        data += chunk
    return got


async def test_goaway_names_the_last_stream_later_ones_are_refused_and_the_close_waits_for_the_open_ones(
    start_router: Callable[..., Awaitable[Router]],
) -> None:
    router = await start_router("--enable-h2c", "--shutdown-timeout=20s")
    encoder = hpack.Encoder()
    async with AnsweringSandbox(fresh_ip()) as sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.http_port)
        writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + _request(encoder, sandbox, 1))
        writer.write(_request(encoder, sandbox, 3))
        assert {await asyncio.wait_for(sandbox.got.get(), 10) for _ in range(2)} == {1, 3}
        stopping = asyncio.create_task(router.shutdown())
        got = await _read_frames(reader, lambda fs: any(t == GOAWAY for t, *_ in fs))
        goaway = next(p for t, _, _, p in got if t == GOAWAY)
        assert struct.unpack("!II", goaway) == (3, NO_ERROR)
        # A stream the client opened before it read the GOAWAY: refused, unprocessed, never forwarded.
        writer.write(_request(encoder, sandbox, 5))
        got = await _read_frames(reader, lambda fs: any(t == RST_STREAM for t, *_ in fs))
        assert [(s, p) for t, _, s, p in got if t == RST_STREAM] == [(5, struct.pack("!I", REFUSED_STREAM))]
        # The open streams run on: the connection stays up until the last one has ended.
        sandbox.end(1)
        got = await _read_frames(reader, lambda fs: any(t == DATA and s == 1 for t, _, s, _ in fs))
        assert not stopping.done()
        sandbox.end(3)
        rest = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            rest += chunk
        assert [(t, f, s) for t, f, s, _ in frames(rest) if t == DATA] == [(DATA, END_STREAM, 3)]
        writer.close()
        await asyncio.wait_for(stopping, 10)
        assert sandbox.streams == [1, 3]


async def test_what_the_sandbox_sends_after_the_last_stream_ended_is_dropped_quietly(
    router_process: Callable[..., RouterProcess],
) -> None:
    """Once the drain has half-closed the connection (its last stream ended), the sandbox's connection-level
    frames that still come (a PING, a WINDOW_UPDATE: gRPC servers send both) are dropped: they were written
    after the half-close until December 7, and each raised `Cannot call write() after write_eof()`, logged at
    error level with a traceback ("Fatal error on transport")."""
    router = router_process("--enable-h2c", "--shutdown-timeout=5s")
    encoder = hpack.Encoder()
    async with AnsweringSandbox(fresh_ip()) as sandbox:
        reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
        writer.write(PREFACE + frame(SETTINGS, 0, 0, b"") + _request(encoder, sandbox, 1))
        await asyncio.wait_for(sandbox.got.get(), 10)
        await _read_frames(reader, lambda fs: any(t == HEADERS for t, *_ in fs))
        await _terminate(router)
        await _read_frames(reader, lambda fs: any(t == GOAWAY for t, *_ in fs))
        sandbox.end(1)
        rest = b""
        while chunk := await asyncio.wait_for(reader.read(65536), 10):  # the half-close: EOF
            rest += chunk
        assert sandbox.writer is not None
        sandbox.writer.write(frame(0x6, 0, 0, b"12345678") + frame(0x8, 0, 0, struct.pack("!I", 4096)))
        code = await asyncio.to_thread(router.proc.wait, 20)
        writer.close()
    log = router.log.read_text()
    assert code == 0, log[-2000:]
    assert [(t, f, s) for t, f, s, _ in frames(rest) if t == DATA] == [(DATA, END_STREAM, 1)]
    assert '"level":"error"' not in log, log[-3000:]
