"""sandboxd's gRPC `process.v1.ProcessService` on :9090 (spec §2.2.2), one grpc.aio server per runtime server.

Requests are parsed here rather than by grpcio, so a malformed protobuf is INVALID_ARGUMENT with a message
instead of grpcio's generic failure. A cancelled call (client gone, deadline passed) kills the command's
process group. Status codes follow the spec: INVALID_ARGUMENT `command is required`, NOT_FOUND for a missing
program or path, PERMISSION_DENIED for a cwd outside the root or an exec denial; a non-zero exit is not an
error. Beyond upstream: RESOURCE_EXHAUSTED past the server's concurrent-process limit.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message
from grpc import aio

from agent_sandbox.api import processv1 as pb

from .execution import run_command
from .paths import InvalidPath, PathEscape
from .process import Process
from .processes import ShuttingDown, SpawnError, TooManyProcesses
from .state import RuntimeState

__all__ = ["add_process_service"]

M = TypeVar("M", bound=Message)

_SPAWN_CODES = {
    "not_found": grpc.StatusCode.NOT_FOUND,
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "internal": grpc.StatusCode.INTERNAL,
}
_SIGNALS = {
    pb.SIGNAL_SIGINT: signal.SIGINT,
    pb.SIGNAL_SIGTERM: signal.SIGTERM,
    pb.SIGNAL_SIGKILL: signal.SIGKILL,
}


async def _parse(kind: type[M], raw: bytes, context: aio.ServicerContext[Any, Any]) -> M:
    try:
        return kind.FromString(raw)
    except DecodeError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {kind.__name__}: {err}")
        raise  # abort raises; this line satisfies the type checker


class ProcessService:
    """The servicer of one runtime server (it serves exactly one root)."""

    def __init__(self, state: RuntimeState) -> None:
        self.state = state

    async def _prepare(
        self, config: pb.ProcessConfig, context: aio.ServicerContext[Any, Any]
    ) -> tuple[list[str], str, dict[str, str] | None]:
        if not config.command:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command is required")
        cwd = self.state.root
        if config.HasField("cwd") and config.cwd:
            try:
                cwd = self.state.resolve_sandboxd(config.cwd)
            except PathEscape as err:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"cwd: {err}")
            except InvalidPath as err:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cwd: {err}")
        env = dict(config.env_vars) if config.env_vars else None
        return list(config.command), cwd, env

    async def _running(self, process_id: int, context: aio.ServicerContext[Any, Any]) -> Process:
        proc = self.state.supervisor.get(process_id)
        if proc is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"process {process_id} not found")
            raise AssertionError("abort raises")
        return proc

    async def _spawn_failed(self, err: Exception, context: aio.ServicerContext[Any, Any]) -> None:
        if isinstance(err, ShuttingDown):
            # Nothing was run: UNAVAILABLE is the code clients (and gRPC's retry policies) retry.
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(err))
        if isinstance(err, TooManyProcesses):
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        assert isinstance(err, SpawnError)
        await context.abort(_SPAWN_CODES[err.kind], f"failed to start command: {err}")

    async def start(
        self, raw: bytes, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.StartResponse]:
        req = await _parse(pb.StartRequest, raw, context)
        argv, cwd, env = await self._prepare(req.config, context)
        pty = (req.pty.cols, req.pty.rows) if req.HasField("pty") else None
        try:
            proc = await self.state.supervisor.spawn(argv, cwd=cwd, env=env, pty=pty)
        except (SpawnError, TooManyProcesses) as err:
            await self._spawn_failed(err, context)
            return
        try:
            yield pb.StartResponse(init=pb.InitEvent(process_id=proc.id))
            async for event in proc.events():
                if event.stream == "stdout":
                    yield pb.StartResponse(stdout=event.data)
                else:
                    yield pb.StartResponse(stderr=event.data)
            code = await proc.wait()
            yield pb.StartResponse(exit=pb.ExitEvent(exit_code=code if code >= 0 else -1))
        finally:
            if proc.returncode is None:
                proc.kill_group()  # stream cancelled: the process goes with it
            await proc.close()

    async def execute(self, raw: bytes, context: aio.ServicerContext[Any, Any]) -> pb.ExecuteResponse:
        req = await _parse(pb.ExecuteRequest, raw, context)
        argv, cwd, env = await self._prepare(req.config, context)
        try:
            result = await run_command(
                self.state.supervisor,
                argv,
                cwd=cwd,
                env=env,
                time_limit=None,  # the client's deadline cancels the call, which kills the group
                output_limit=self.state.config.max_output_bytes,
            )
        except (SpawnError, TooManyProcesses) as err:
            await self._spawn_failed(err, context)
            raise
        code = result.exit_code if result.exit_code >= 0 else -1
        return pb.ExecuteResponse(exit_code=code, stdout=result.stdout, stderr=result.stderr)

    async def write_stdin(self, raw: bytes, context: aio.ServicerContext[Any, Any]) -> pb.WriteStdinResponse:
        req = await _parse(pb.WriteStdinRequest, raw, context)
        proc = await self._running(req.process_id, context)
        if req.WhichOneof("payload") == "eof":
            await proc.close_stdin()
            return pb.WriteStdinResponse()
        if not proc.stdin_open:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"process {req.process_id} has no stdin")
        if req.input:
            try:
                await proc.write_stdin(req.input)
            except ConnectionError:  # broken pipe / connection lost: the program exited or closed its stdin
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"process {req.process_id} has no stdin (it exited or closed it)",
                )
            except (OSError, RuntimeError) as err:
                await context.abort(grpc.StatusCode.INTERNAL, f"failed to write stdin: {err}")
        return pb.WriteStdinResponse()

    async def send_signal(self, raw: bytes, context: aio.ServicerContext[Any, Any]) -> pb.SendSignalResponse:
        req = await _parse(pb.SendSignalRequest, raw, context)
        proc = await self._running(req.process_id, context)
        sig = _SIGNALS.get(req.signal)
        if sig is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"unsupported or unspecified signal: {req.signal}"
            )
        assert sig is not None
        try:
            proc.signal_group(sig)
        except OSError as err:
            await context.abort(grpc.StatusCode.INTERNAL, f"failed to send signal: {err}")
        return pb.SendSignalResponse()

    async def resize_tty(self, raw: bytes, context: aio.ServicerContext[Any, Any]) -> pb.ResizeTTYResponse:
        req = await _parse(pb.ResizeTTYRequest, raw, context)
        proc = await self._running(req.process_id, context)
        if not proc.has_pty:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"process {req.process_id} has no PTY")
        try:
            proc.resize(req.cols, req.rows)
        except OSError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"failed to resize TTY: {err}")
        return pb.ResizeTTYResponse()


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_process_service(server: aio.Server, state: RuntimeState) -> ProcessService:
    """Register ProcessService on `server` (reflection: `reflection.enable_reflection`)."""
    service = ProcessService(state)
    unary: dict[str, Callable[[bytes, Any], Awaitable[Message]]] = {
        "Execute": service.execute,
        "WriteStdin": service.write_stdin,
        "SendSignal": service.send_signal,
        "ResizeTTY": service.resize_tty,
    }
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(fn, response_serializer=_serialize)
        for name, fn in unary.items()
    }
    handlers["Start"] = grpc.unary_stream_rpc_method_handler(service.start, response_serializer=_serialize)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, handlers),))
    return service
