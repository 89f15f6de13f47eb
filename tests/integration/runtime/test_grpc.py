"""process.v1.ProcessService on a real server (spec §2.2.2)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest
from grpc import aio

from agent_sandbox.api import processv1 as pb
from agent_sandbox.runtime import RuntimeServer
from tests.integration.runtime.helpers import ProcessClient, leaked_processes

pytestmark = pytest.mark.integration


async def _gone(root: str) -> bool:
    for _ in range(100):
        if not leaked_processes(root):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_execute(runtime: RuntimeServer, grpc_client: ProcessClient) -> None:
    resp = await grpc_client.execute("/bin/sh", "-c", "echo hi; echo oops >&2; exit 7")
    assert (resp.exit_code, resp.stdout, resp.stderr) == (7, b"hi\n", b"oops\n")
    resp = await grpc_client.execute("/bin/sh", "-c", "echo $A; pwd", env_vars={"A": "b"}, cwd="")
    assert resp.stdout == f"b\n{runtime.root}\n".encode()
    Path(runtime.root, "sub").mkdir()
    resp = await grpc_client.execute("pwd", cwd="sub")
    assert resp.stdout == f"{runtime.root}/sub\n".encode()
    resp = await grpc_client.execute("/bin/sh", "-c", "kill -9 $$")
    assert resp.exit_code == -1


@pytest.mark.parametrize(
    ("command", "config", "code", "details"),
    [
        ((), {}, grpc.StatusCode.INVALID_ARGUMENT, "command is required"),
        (("no-such-program-xyz",), {}, grpc.StatusCode.NOT_FOUND, "No such file or directory"),
        (("pwd",), {"cwd": "../.."}, grpc.StatusCode.PERMISSION_DENIED, "escapes the root"),
        (("pwd",), {"cwd": "missing-dir"}, grpc.StatusCode.NOT_FOUND, "No such file or directory"),
        (("/etc/passwd",), {}, grpc.StatusCode.PERMISSION_DENIED, "Permission denied"),
        (("echo", "x" * 140_000), {}, grpc.StatusCode.INVALID_ARGUMENT, "write a long script to a file"),
        # Named as the client gave it, never by the host's path of the root (until December 6 the whole
        # path came back, INTERNAL for a long one), and clipped: a 300 KB name passed gRPC's metadata limit.
        (("pwd",), {"cwd": "missing-dir"}, grpc.StatusCode.NOT_FOUND, "'working directory'"),
        (("pwd",), {"cwd": "d/" * 3000}, grpc.StatusCode.INVALID_ARGUMENT, "File name too long"),
        (("x" * 300_000,), {}, grpc.StatusCode.INVALID_ARGUMENT, "x" * 200 + "...'"),
    ],
)
async def test_execute_errors(
    runtime: RuntimeServer,
    grpc_client: ProcessClient,
    command: tuple[str, ...],
    config: dict[str, str],
    code: grpc.StatusCode,
    details: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.execute(*command, **config)
    assert err.value.code() == code
    assert details in (err.value.details() or "")
    assert len(err.value.details() or "") < 1000
    assert runtime.root not in (err.value.details() or "")


async def test_the_process_limit_holds_for_calls_that_arrive_together(make_runtime: object) -> None:
    """`--max-processes` is RESOURCE_EXHAUSTED past the limit, also for calls that arrive together (they all
    ran until December 6: the limit was checked before the spawn's first await and counted after it)."""
    server = await make_runtime(max_processes=3)  # type: ignore[operator]
    async with aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        client = ProcessClient(channel)
        results = await asyncio.gather(
            *(client.execute("sleep", "2") for _ in range(10)), return_exceptions=True
        )
    codes = sorted((r.code().name if isinstance(r, grpc.aio.AioRpcError) else "OK") for r in results)
    assert codes == ["OK"] * 3 + ["RESOURCE_EXHAUSTED"] * 7, results


async def test_malformed_request_is_invalid_argument(grpc_client: ProcessClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.raw_execute(b"\xff\xff\xff\xff", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_deadline_kills_the_process_group(runtime: RuntimeServer, grpc_client: ProcessClient) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.execute("/bin/sh", "-c", "sleep 300 & sleep 301", timeout=1)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert await _gone(runtime.root)


async def test_start_streams_init_output_exit_in_order(grpc_client: ProcessClient) -> None:
    call = grpc_client.start("/bin/sh", "-c", "echo one; echo two >&2; echo three; exit 3")
    events = [e async for e in grpc_client.events(call)]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "init"
    assert events[0].init.process_id >= 1
    assert kinds[-1] == "exit"
    assert events[-1].exit.exit_code == 3
    assert b"".join(e.stdout for e in events if e.HasField("stdout")) == b"one\nthree\n"
    assert b"".join(e.stderr for e in events if e.HasField("stderr")) == b"two\n"
    assert set(kinds[1:-1]) <= {"stdout", "stderr"}


async def test_start_chunks_are_bounded(make_runtime: object) -> None:
    from grpc import aio

    server = await make_runtime(stream_chunk_size=100)  # type: ignore[operator]
    async with aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        client = ProcessClient(channel)
        events = [e async for e in client.events(client.start("head", "-c", "1000", "/dev/zero"))]
    chunks = [e.stdout for e in events if e.HasField("stdout")]
    assert sum(map(len, chunks)) == 1000
    assert max(map(len, chunks)) <= 100


async def test_stdin_and_eof(grpc_client: ProcessClient) -> None:
    call = grpc_client.start("cat")
    it = grpc_client.events(call)
    init = await anext(it)
    pid = init.init.process_id
    await grpc_client.write_stdin_call(pb.WriteStdinRequest(process_id=pid, input=b"hello\n"), timeout=10)
    first = await anext(it)
    assert first.stdout == b"hello\n"
    await grpc_client.write_stdin_call(
        pb.WriteStdinRequest(process_id=pid, eof=pb.process_pb2.google_dot_protobuf_dot_empty__pb2.Empty()),
        timeout=10,
    )
    rest = [e async for e in it]
    assert rest[-1].exit.exit_code == 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.write_stdin_call(pb.WriteStdinRequest(process_id=pid, input=b"x"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_signal(runtime: RuntimeServer, grpc_client: ProcessClient) -> None:
    call = grpc_client.start("/bin/sh", "-c", "sleep 300 & sleep 301")
    it = grpc_client.events(call)
    pid = (await anext(it)).init.process_id
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.send_signal_call(
            pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_UNSPECIFIED), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.send_signal_call(pb.SendSignalRequest(process_id=pid, signal=5), timeout=10)  # type: ignore[arg-type]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.resize_call(pb.ResizeTTYRequest(process_id=pid, cols=10, rows=10), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await grpc_client.send_signal_call(
        pb.SendSignalRequest(process_id=pid, signal=pb.SIGNAL_SIGTERM), timeout=10
    )
    events = [e async for e in it]
    assert events[-1].exit.exit_code == -1
    assert await _gone(runtime.root)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await grpc_client.send_signal_call(
            pb.SendSignalRequest(process_id=999, signal=pb.SIGNAL_SIGKILL), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_pty_size_and_resize(grpc_client: ProcessClient) -> None:
    call = grpc_client.start("/bin/sh", pty=(100, 30))
    it = grpc_client.events(call)
    pid = (await anext(it)).init.process_id
    output = b""

    async def until(marker: bytes) -> None:
        nonlocal output
        while marker not in output:
            output += (await anext(it)).stdout

    await grpc_client.write_stdin_call(
        pb.WriteStdinRequest(process_id=pid, input=b"stty size; echo m1\n"), timeout=10
    )
    await until(b"30 100\r\nm1")
    await grpc_client.resize_call(pb.ResizeTTYRequest(process_id=pid, cols=120, rows=40), timeout=10)
    # the shell is the terminal's foreground job, so it also gets SIGWINCH; stty reads the new size
    await grpc_client.write_stdin_call(
        pb.WriteStdinRequest(process_id=pid, input=b"stty size; tty; exit 5\n"), timeout=10
    )
    rest = [e async for e in it]
    output += b"".join(e.stdout for e in rest)
    assert b"40 120" in output
    assert b"/dev/pts/" in output
    assert rest[-1].exit.exit_code == 5


async def test_a_pty_size_past_16_bits_is_clamped_and_leaks_nothing(grpc_client: ProcessClient) -> None:
    """struct winsize holds 16 bits: `cols=70000` failed with UNKNOWN (struct.error) and leaked the PTY's
    two descriptors on every call, using up the runtime's fds and the kernel's PTYs."""

    async def run_stty() -> bytes:
        events = [e async for e in grpc_client.events(grpc_client.start("stty", "size", pty=(70000, 24)))]
        assert events[-1].exit.exit_code == 0
        return b"".join(e.stdout for e in events)

    assert (await run_stty()).strip() == b"24 65535"
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        await run_stty()
    assert len(os.listdir("/proc/self/fd")) <= before + 2


async def test_stdin_writes_that_time_out_are_not_queued(grpc_client: ProcessClient) -> None:
    """A program not reading: each WriteStdin of 1 MiB times out. Until December 6 every one stayed queued in
    the runtime (memory without bound) and was delivered later although the client was told it failed; now
    what a timed-out call hands over is a prefix of its data, at most a chunk past what the pipe holds."""
    call = grpc_client.start("/bin/sh", "-c", "sleep 3; wc -c")
    it = grpc_client.events(call)
    pid = (await anext(it)).init.process_id
    chunk = b"x" * (1 << 20)
    for _ in range(8):
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await grpc_client.write_stdin_call(pb.WriteStdinRequest(process_id=pid, input=chunk), timeout=0.2)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    eof = pb.process_pb2.google_dot_protobuf_dot_empty__pb2.Empty()
    await grpc_client.write_stdin_call(pb.WriteStdinRequest(process_id=pid, eof=eof), timeout=10)
    rest = [e async for e in it]
    delivered = int(b"".join(e.stdout for e in rest))
    assert 0 < delivered <= 256 * 1024, delivered  # the pipe (64 KiB) and what the transport held


async def test_an_eof_sent_during_a_write_follows_it(grpc_client: ProcessClient) -> None:
    """A write is handed over in chunks; a CloseStdin that arrives meanwhile waits for it (between two chunks
    it cut the input short, and the writer failed)."""
    call = grpc_client.start("/bin/sh", "-c", "sleep 0.5; wc -c")  # not reading yet: the write is in progress
    it = grpc_client.events(call)
    pid = (await anext(it)).init.process_id
    eof = pb.process_pb2.google_dot_protobuf_dot_empty__pb2.Empty()
    data = b"y" * (1 << 20)
    writing = asyncio.ensure_future(
        grpc_client.write_stdin_call(pb.WriteStdinRequest(process_id=pid, input=data), timeout=20)
    )
    await asyncio.sleep(0.2)
    await grpc_client.write_stdin_call(pb.WriteStdinRequest(process_id=pid, eof=eof), timeout=20)
    await writing
    rest = [e async for e in it]
    assert int(b"".join(e.stdout for e in rest)) == len(data)


async def test_cancelled_stream_kills_the_process(runtime: RuntimeServer, grpc_client: ProcessClient) -> None:
    call = grpc_client.start("/bin/sh", "-c", "echo up; sleep 300")
    it = grpc_client.events(call)
    await anext(it)
    assert (await anext(it)).stdout == b"up\n"
    call.cancel()
    assert await _gone(runtime.root)


async def test_reflection_lists_the_service(runtime: RuntimeServer) -> None:
    from grpc import aio
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async with aio.insecure_channel(f"127.0.0.1:{runtime.ports['grpc']}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        async for resp in responses:
            names = {s.name for s in resp.list_services_response.service}
            break
    assert pb.SERVICE in names
