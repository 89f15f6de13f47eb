"""Command flows for both runtimes: `run` (one result) and `stream` (events as they happen) (spec §3.5).

| | legacy runtime (HTTP :8888) | sandboxd (gRPC :9090) |
|---|---|---|
| run | `POST /execute` `{command, timeout_seconds?, env?, cwd?}` | `Execute(["/bin/sh","-c",command], env_vars, cwd)`, deadline = the command's limit |
| stream | `POST /execute/stream`, NDJSON `start`/`stdout`/`stderr`/`exit` (this project's runtime) | `Start` (+ `WriteStdin`, `SendSignal`, `ResizeTTY`, PTY) |

`env`/`cwd` on the legacy runtime are this project's runtime extension (upstream's python-runtime ignores
unknown keys, and upstream's SDK refuses them): the SDK sends them and checks that the runtime
acknowledged the extended protocol (it answers `truncated`), so a runtime that would silently ignore them
raises instead of running the command in the wrong place.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from . import _process
from ._authhint import auth_hint
from ._calls import (
    MAX_RUN_RESPONSE,
    call,
    check_timeout,
    explain_unreachable,
    malformed_answer,
    open_stream,
    stale_pod_ip,
)
from ._connection import Connection, Target
from ._steps import Emit, Flow, GrpcCall, GrpcFailure, GrpcOpen, GrpcRead, ReadLine, Trace
from .exceptions import SandboxError, SandboxRequestError, SandboxRequestTimeoutError
from .models import CommandEvent, ExecutionResult

__all__ = [
    "STARTED",
    "ProcessRef",
    "Started",
    "check_process_options",
    "legacy_body",
    "run_command",
    "run_legacy",
    "signal_process",
    "stream_command",
]

TIMED_OUT_EXIT_CODE = 124


def check_process_options(env: Mapping[str, str] | None, cwd: str | None) -> None:
    """`ValueError` for env names that are empty or contain `=` / NUL, or a cwd with NUL."""
    for name, value in (env or {}).items():
        if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
            raise ValueError(f"invalid environment variable name {name!r}: must be non-empty, without '='")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"environment variable {name!r}: the value must be a str without NUL")
    if cwd is not None and (not isinstance(cwd, str) or "\x00" in cwd):
        raise ValueError(f"invalid cwd {cwd!r}")


def _read_timeout(timeout: float, command_timeout: float | None) -> float:
    return max(timeout, command_timeout + 10) if command_timeout else timeout


def legacy_body(
    command: str, command_timeout: float | None, env: Mapping[str, str] | None, cwd: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command}
    if command_timeout is not None:
        body["timeout_seconds"] = command_timeout
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    return body


#: grpc-core's words for a peer that answered in HTTP/1.1: a router started without h2c.
_HTTP1_PEER = "http1.x server"


def _grpc_error(err: GrpcFailure) -> SandboxRequestError:
    message = f"sandboxd process service failed ({err.code}): {err.details}"
    if _HTTP1_PEER in err.details:
        message += (
            " - the server answers HTTP/1.1 only: a router carries sandboxd's gRPC only when started with "
            "--enable-h2c (use SandboxDirectConnectionConfig for the legacy runtime otherwise)"
        )
    return SandboxRequestError(message)


#: The gRPC codes of a router's authorization answers (its h2c maps 401 and 403 to them), as HTTP statuses.
_AUTH_CODES = {"UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403}


def _call_failed(conn: Connection, err: GrpcFailure, target: Target) -> Flow[SandboxRequestError]:
    """The error for a failed gRPC call. When the router could not use the sandbox's address (unreachable, or
    a pod IP that is no longer the sandbox's) the connection forgets it - the next call re-reads it - and the
    error says why when the Sandbox tells (suspended, deleted). A refused token says why when the metadata
    sent shows it (`_authhint`)."""
    refused = err.code == "PERMISSION_DENIED" and stale_pod_ip(403, err.details)
    if err.code in _AUTH_CODES and not refused:
        hint = auth_hint(_AUTH_CODES[err.code], dict(target.grpc_metadata), conn.namespace, conn.sandbox_id)
        failed = _grpc_error(err)
        return SandboxRequestError(f"{failed} - {hint}") if hint else failed
    if err.code != "UNAVAILABLE" and not refused:
        return _grpc_error(err)
    conn.failed()
    explained: SandboxRequestError = yield from explain_unreachable(conn, _grpc_error(err))
    return explained


def _grpc_metadata(target: Target) -> tuple[tuple[str, str], ...]:
    if target.grpc_target is None:
        raise SandboxError("this connection has no gRPC target for the sandboxd process API")
    return target.grpc_metadata


def executable_name(command: object) -> str:
    """The span attribute `sandbox.command.executable`: the first word that is not `NAME=value`, basename."""
    for word in command.split() if isinstance(command, str) else ():
        if "=" not in word:
            return word.split("/")[-1]
    return ""


def run_command(
    conn: Connection,
    command: str,
    *,
    timeout: float,
    command_timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
) -> Flow[ExecutionResult]:
    """Run `command` to completion; a non-zero exit is a result, not an error. Span `run` (upstream's)."""
    yield Trace("run", {"sandbox.command.executable": executable_name(command)})
    if not isinstance(command, str) or not command:
        raise ValueError("command must be a non-empty string")
    check_process_options(env, cwd)
    check_timeout(timeout)
    check_timeout(command_timeout, "command_timeout")
    if conn.runtime == "legacy":
        body = legacy_body(command, command_timeout, env, cwd)
        extended = bool(env) or cwd is not None
        result = yield from run_legacy(conn, body, _read_timeout(timeout, command_timeout), extended)
    else:
        config = _process.config(command, env, cwd)
        result = yield from _run_sandboxd(
            conn, config, deadline=command_timeout or timeout, limit=command_timeout
        )
    yield Trace(None, {"sandbox.exit_code": result.exit_code})
    return result


def run_legacy(
    conn: Connection, body: dict[str, Any], read_timeout: float, extended: bool
) -> Flow[ExecutionResult]:
    """POST /execute; `extended`: env/cwd were asked for, which only this project's runtime honours."""
    resp = yield from call(
        conn, "POST", "/execute", timeout=read_timeout, json=body, max_response_bytes=MAX_RUN_RESPONSE
    )
    with malformed_answer("/execute", resp):
        answer = resp.json()
        if not isinstance(answer, dict):
            raise SandboxRequestError(
                f"/execute answered {type(answer).__name__}, not an object", resp.status_code, resp
            )
        if extended and "truncated" not in answer:
            raise SandboxError(
                "the runtime ignored env/cwd: it does not speak this project's extended /execute "
                "(an upstream python-runtime?); run without env/cwd or use the sandboxd runtime"
            )
        fields = {
            k: answer[k] for k in ("stdout", "stderr", "exit_code", "timed_out") if answer.get(k) is not None
        }
        return ExecutionResult(**fields)


def _run_sandboxd(
    conn: Connection, config: Any, *, deadline: float, limit: float | None
) -> Flow[ExecutionResult]:
    """gRPC Execute with `deadline`; `limit` (the caller's command_timeout) turns an exceeded deadline into
    a timed-out result instead of an error."""
    target = yield from conn.resolve()
    pb = _process.messages()
    request = pb.ExecuteRequest(config=config)
    try:
        reply = yield GrpcCall(
            target.grpc_target or "",
            _process.EXECUTE,
            request,
            pb.ExecuteResponse,
            deadline,
            _grpc_metadata(target),
        )
    except GrpcFailure as err:
        if err.code == "DEADLINE_EXCEEDED":
            if limit:
                return ExecutionResult(
                    stderr=f"Command timed out after {limit:g} seconds",
                    exit_code=TIMED_OUT_EXIT_CODE,
                    timed_out=True,
                )
            raise SandboxRequestTimeoutError(
                f"sandboxd Execute did not finish within {deadline:g} s"
            ) from err
        raise (yield from _call_failed(conn, err, target)) from err
    return ExecutionResult(
        stdout=reply.stdout.decode("utf-8", errors="replace"),
        stderr=reply.stderr.decode("utf-8", errors="replace"),
        exit_code=reply.exit_code,
    )


class Started:
    """Emitted once the process runs (sandboxd `init`, legacy `start`); the command streams consume it."""


STARTED = Started()


@dataclass
class ProcessRef:
    """The server-side id of a streamed sandboxd process, known once its `init` event arrived."""

    process_id: int | None = None
    target: Target | None = None
    #: The stream runs on the legacy runtime, which has no channel for stdin or signals.
    legacy: bool = False


def stream_command(
    conn: Connection,
    command: str,
    *,
    timeout: float | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    stdin: bytes | None,
    pty: tuple[int, int] | None,
    ref: ProcessRef,
) -> Flow[None]:
    """Emit `CommandEvent`s (stdout/stderr chunks, then one `exit`) while the command runs. Span `stream`."""
    yield Trace("stream", {"sandbox.command.executable": executable_name(command)})
    if not isinstance(command, str) or not command:
        raise ValueError("command must be a non-empty string")
    check_process_options(env, cwd)
    check_timeout(timeout)
    if conn.runtime == "legacy":
        if stdin is not None or pty is not None:
            raise NotImplementedError("stdin and PTY need the sandboxd runtime (gRPC Start)")
        yield from _stream_legacy(conn, command, timeout=timeout, env=env, cwd=cwd)
        return
    target = yield from conn.resolve()
    ref.target = target
    pb = _process.messages()
    request = pb.StartRequest(config=_process.config(command, env, cwd))
    if pty is not None:
        request.pty.CopyFrom(pb.PTY(cols=pty[0], rows=pty[1]))
    handle = yield GrpcOpen(
        target.grpc_target or "", _process.START, request, pb.StartResponse, timeout, _grpc_metadata(target)
    )
    try:
        while (event := (yield GrpcRead(handle))) is not None:
            kind = event.WhichOneof("event")
            if kind == "init":
                ref.process_id = event.init.process_id
                if stdin is not None:
                    # A command that ends without reading its input (`echo`, `true`) is fine, as for a shell's
                    # `echo x | true`; its output and exit code follow (until December 6 the stream failed).
                    yield from write_stdin(ref, stdin, gone_ok=True)
                    yield from write_stdin(ref, None)
                yield Emit(STARTED)
            elif kind in ("stdout", "stderr"):
                yield Emit(CommandEvent(type=kind, data=bytes(getattr(event, kind))))
            elif kind == "exit":
                yield Emit(CommandEvent(type="exit", exit_code=event.exit.exit_code))
                return
    except GrpcFailure as err:
        if err.code == "DEADLINE_EXCEEDED":
            yield Emit(CommandEvent(type="exit", exit_code=TIMED_OUT_EXIT_CODE, timed_out=True))
            return
        raise (yield from _call_failed(conn, err, target)) from err
    raise SandboxRequestError("sandboxd Start stream ended without an exit event")


#: The longest a legacy command stream may go without a byte when the command has no timeout (ours): the
#: response head comes as the command starts, and this project's runtime then writes a keep-alive line after
#: `--stream-keepalive` (30 s) of silence, so a quiet command still runs as long as it needs while a router or
#: sandbox that stopped answering is given up after three of those. Until December 6 such a stream waited for
#: good. (It is also the stream's `X-Sandbox-Timeout`: the router allows that long a silence, and that long
#: to reach the sandbox - a resume on request included; 180 s, its --proxy-timeout, without one.)
STREAM_IDLE_TIMEOUT = 90.0


@contextmanager
def _silence_said(read_timeout: float) -> Iterator[None]:
    """A read that went `read_timeout` seconds without a byte, said as such."""
    try:
        yield
    except SandboxRequestTimeoutError as err:
        if not err.request_sent:  # a connect timeout: nothing was asked yet, and the error says so
            raise
        raise SandboxRequestTimeoutError(
            f"{err} - no answer from the router or the sandbox for {read_timeout:g} s (a running command's "
            "stream carries a keep-alive line after 30 s of silence: they stopped answering)"
        ) from err


def _stream_legacy(
    conn: Connection, command: str, *, timeout: float | None, env: Mapping[str, str] | None, cwd: str | None
) -> Flow[None]:
    # The bytes exactly as the command wrote them (this project's runtime; one that predates the field
    # ignores it and sends UTF-8 text as `data`, read below too).
    body = {**legacy_body(command, timeout, env, cwd), "output_encoding": "base64"}
    # httpx's read timeout bounds each read, the response head's included: the longest silence.
    read_timeout = timeout + 10 if timeout else STREAM_IDLE_TIMEOUT
    # Resolved first (kept by the connection, open_stream finds it there), so that a Kubernetes API that
    # times out on the way is not said to be the router or the sandbox.
    yield from conn.resolve()
    with _silence_said(read_timeout):
        handle = yield from open_stream(conn, "POST", "/execute/stream", timeout=read_timeout, json=body)
    while True:
        with _silence_said(read_timeout):
            line = yield ReadLine(handle)
        if line is None:
            break
        if not line.strip():
            continue
        with malformed_answer("/execute/stream", sample=line):
            event = json.loads(line)
            kind = event.get("type")
            parsed: Started | CommandEvent | None = None
            if kind == "start":
                parsed = STARTED
            elif kind in ("stdout", "stderr"):
                if "data_base64" in event:
                    data = base64.b64decode(event["data_base64"], validate=True)
                else:
                    data = str(event.get("data", "")).encode()
                parsed = CommandEvent(type=kind, data=data)
            elif kind == "exit":
                parsed = CommandEvent(
                    type="exit",
                    exit_code=int(event.get("exit_code", -1)),
                    timed_out=bool(event.get("timed_out")),
                )
        if parsed is not None:
            yield Emit(parsed)
        if kind == "exit":
            return
    raise SandboxRequestError("/execute/stream ended without an exit event")


def require_control(ref: ProcessRef) -> None:
    """`NotImplementedError` on the legacy runtime, which has no channel for stdin, signals or resizes - as
    `stream(stdin=...)` says; until December 6 `send_signal` said the (running) process had not started."""
    if ref.legacy:
        raise NotImplementedError(
            "stdin, signals and terminal resizes need the sandboxd runtime (gRPC Start)"
        )


#: Answers of a control call on a process that exited (or closed its stdin) meanwhile.
_GONE = ("NOT_FOUND", "FAILED_PRECONDITION")


def _control(
    ref: ProcessRef, method: str, request: Any, response_type: Any, *, gone_ok: bool = False
) -> Flow[None]:
    """One control call on a running process. `gone_ok`: a process that already exited (NOT_FOUND), or whose
    stdin is closed (FAILED_PRECONDITION), is fine (closing stdin or signalling races with the process ending
    on its own)."""
    require_control(ref)
    if ref.process_id is None or ref.target is None:
        raise SandboxError("the process has not started yet (no init event received)")
    try:
        yield GrpcCall(
            ref.target.grpc_target or "", method, request, response_type, 30.0, ref.target.grpc_metadata
        )
    except GrpcFailure as err:
        if gone_ok and err.code in _GONE:
            return
        raise _grpc_error(err) from err


def write_stdin(ref: ProcessRef, data: bytes | None, *, gone_ok: bool = False) -> Flow[None]:
    """Write bytes to the process's stdin, or close it (`data=None`, fine once it exited). `gone_ok`: data
    for a process that has exited or closed its stdin is dropped."""
    pb = _process.messages()
    if data is None:
        request = pb.WriteStdinRequest(process_id=ref.process_id or 0, eof=_process.empty())
    else:
        request = pb.WriteStdinRequest(process_id=ref.process_id or 0, input=data)
    yield from _control(
        ref, _process.WRITE_STDIN, request, pb.WriteStdinResponse, gone_ok=gone_ok or data is None
    )


def signal_process(ref: ProcessRef, signal: int) -> Flow[None]:
    """Send SIGINT (2), SIGKILL (9) or SIGTERM (15) to the process group."""
    if signal not in (2, 9, 15):
        raise ValueError(f"signal must be 2 (SIGINT), 9 (SIGKILL) or 15 (SIGTERM), got {signal}")
    pb = _process.messages()
    request = pb.SendSignalRequest(process_id=ref.process_id or 0, signal=signal)
    yield from _control(ref, _process.SEND_SIGNAL, request, pb.SendSignalResponse, gone_ok=True)


def resize_tty(ref: ProcessRef, cols: int, rows: int) -> Flow[None]:
    """Resize the process's terminal (PTY processes only)."""
    pb = _process.messages()
    request = pb.ResizeTTYRequest(process_id=ref.process_id or 0, cols=cols, rows=rows)
    yield from _control(ref, _process.RESIZE_TTY, request, pb.ResizeTTYResponse)
