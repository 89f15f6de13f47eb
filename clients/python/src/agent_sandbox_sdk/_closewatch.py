"""Calls cut by the client's own `close()`: one flow's view of its driver's close count (`CloseWatch`).

`close()` of a client (another task, or another thread with the sync client) closes the pooled connections and
channels under the calls running on them. What those calls then saw depended on the transport: a legacy
stream said "the response was cut off ... the sandbox went away, or a router or proxy in between closed it",
a sandboxd call "CANCELLED: Channel closed!", and a sync stream whose socket was blocked in a read when the
other thread closed it went on to the command's end (exit 0), while a sync `run` failed. Now every call in
flight across a `close()` - and every later read of a stream opened before it - fails alike, with
`SandboxClientClosedError` (a `SandboxConnectionError`) "...: the connection was closed while the call was in
flight (client closed)"; the calls started after it reconnect lazily as before. No flow retries or waits out that
error (a watch reconnecting after it made a create in flight across `close()` complete afterwards, its claim
left behind, until December 7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._steps import GrpcCall, GrpcFailure, GrpcOpen, GrpcRead, Open, ReadChunk, ReadLine, Send, Step
from .exceptions import SandboxClientClosedError, SandboxConnectionError, SandboxRequestTimeoutError

__all__ = ["CloseWatch", "closed_error", "step_where"]

#: Steps that use a connection or channel `close()` closes (a `Sleep` or a `Close` does not).
_CONNECTION_STEPS = (Send, Open, ReadLine, ReadChunk, GrpcCall, GrpcOpen, GrpcRead)
#: Reads of an open stream: what arrives after a `close()` no longer belongs to a usable call.
_STREAM_READS = (ReadLine, ReadChunk, GrpcRead)
#: What grpc reports for a call whose channel was closed under it.
_GRPC_CUT = frozenset({"CANCELLED", "UNAVAILABLE"})


def step_where(step: Step) -> str:
    """`METHOD URL` of an HTTP step, the method of a gRPC call, else the step's kind."""
    if isinstance(step, Send | Open):
        return f"{step.request.method} {step.request.url}"
    if isinstance(step, ReadLine | ReadChunk):
        return f"{step.handle.method} {step.handle.url}"
    if isinstance(step, GrpcCall | GrpcOpen):
        return step.method
    return type(step).__name__


def closed_error(where: str) -> SandboxClientClosedError:
    """The error of a call the client's `close()` cut (the same words for every transport)."""
    return SandboxClientClosedError(
        f"{where}: the connection was closed while the call was in flight (client closed)"
    )


class CloseWatch:
    """Tracks, for one flow, whether its driver's `close()` ran during a step or since a stream was opened.

    `closes` reads the driver's count of `close()` calls (bumped before it closes anything)."""

    __slots__ = ("_closes", "_start", "_streams")

    def __init__(self, closes: Callable[[], int]) -> None:
        self._closes = closes
        self._start = closes()
        #: id(stream handle) -> (close count when it was opened, what it is); the flow's `opened` keeps them alive.
        self._streams: dict[int, tuple[int, str]] = {}

    def start(self, step: Step) -> SandboxConnectionError | None:
        """Before a step: the error when it reads a stream that a `close()` since its opening cut, else None."""
        self._start = self._closes()
        if isinstance(step, _STREAM_READS):
            opened = self._streams.get(id(step.handle))
            if opened is not None and opened[0] != self._start:
                return closed_error(opened[1])
        return None

    def _where(self, step: Step) -> str:
        if isinstance(step, GrpcRead) and (opened := self._streams.get(id(step.handle))) is not None:
            return opened[1]
        return step_where(step)

    def cut(self) -> bool:
        """Whether a `close()` ran since the step started."""
        return self._closes() != self._start

    def failed(self, step: Step, err: BaseException) -> BaseException:
        """After a step failed: the client-closed error when a `close()` ran meanwhile and `err` is what closing
        a connection does to a call (a timeout stays a timeout); else `err`."""
        if not self.cut() or not isinstance(step, _CONNECTION_STEPS):
            return err
        if isinstance(err, SandboxRequestTimeoutError):
            return err
        if isinstance(err, SandboxConnectionError) or (
            isinstance(err, GrpcFailure) and err.code in _GRPC_CUT
        ):
            out = closed_error(self._where(step))
            out.__cause__ = err
            return out
        return err

    def succeeded(self, step: Step, value: Any) -> SandboxConnectionError | None:
        """After a step succeeded: the client-closed error when it read a stream and a `close()` ran meanwhile
        (a read blocked on a socket that another thread closed still returns what arrives), else None; records
        opened streams.

        A request that got its answer (`Send`, a unary gRPC call, a stream's `Open`) keeps it: it may have been
        sent on a connection opened after the `close()` (the count is read before the connection is looked up,
        and an exec-plugin credential can take a while), and its result - a created claim, a written file, a
        command's exit - must reach the caller rather than be reported as a failure."""
        if isinstance(step, _STREAM_READS) and self.cut():
            return closed_error(self._where(step))
        if isinstance(step, Open | GrpcOpen):
            self._streams[id(value)] = (self._start, step_where(step))
        return None
