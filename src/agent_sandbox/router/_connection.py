"""A client connection's transport side (`Connection`): writing, pausing reads, its one deadline, and ending
it well.

Apart from HTTP (`_request_reader`, `_server`): bytes are written; reading is paused for named reasons and
resumed once none is left; the connection is ended - closed after a flush that has a deadline, lingered so an
answer is not reset away, aborted, or refused with a JSON error - and it keeps the one deadline that the
listener's `DeadlineSweeper` fires.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Protocol

from ._responses import json_response

__all__ = ["Connection", "Limits"]


class Limits(Protocol):
    """What a connection's own classes read of its listener's limits (`_server.ConnectionLimits`)."""

    idle_timeout: float
    max_header_bytes: int
    max_body_bytes: int


class Connection(asyncio.Protocol):
    """The transport side of one client connection on the proxy listener (`_server.ClientConnection`)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.tunnel: Callable[[bytes], None] | None = None
        """Set once upgraded: raw client bytes go here."""
        self._task: asyncio.Task[None] | None = None
        """The active request's handler (`fail` stops it)."""
        self.deadline = math.inf
        """Loop time at which `_on_deadline` fires (checked by the listener's `DeadlineSweeper`)."""
        self._on_deadline: Callable[[], None] | None = None
        self._reading_paused_for: set[str] = set()
        self._failed = False
        self._lingering = False
        self.failed_status = 0
        self.response_started = False
        """The active request's response head has been written (errors can no longer be sent)."""
        self.handler_started = False
        """The active request's handler has begun (set by it): `fail` cancels it only then."""

    def pause_reading_for_body(self, reason: str = "body") -> None:
        if not self._reading_paused_for and self.transport is not None:
            self.transport.pause_reading()
        self._reading_paused_for.add(reason)

    def resume_reading_for_body(self, reason: str = "body") -> None:
        self._reading_paused_for.discard(reason)
        if not self._reading_paused_for and self.transport is not None and self.tunnel is None:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        # Not once lingering (half-closed): what a protocol still relays then (h2c's drain closes once its
        # last stream ended, and the sandbox may send a PING or WINDOW_UPDATE after it) raised `Cannot call
        # write() after write_eof()`, logged as a fatal transport error, until December 7.
        if self.transport is not None and not self.closed and not self._lingering:
            self.transport.write(data)

    def close(self) -> None:
        """Close once what is buffered is written; a flush still not done after `--idle-timeout` (a client
        that stopped reading) ends in an abort (`transport.close()` alone would wait for it for good)."""
        transport = self.transport
        if self.closed:
            return  # closed already: a flush deadline the first close armed stays armed
        self._cancel_timer()
        if transport is not None:
            self.closed = True
            transport.close()
            if transport.get_write_buffer_size():
                # The sweeper keeps checking a closed connection until `connection_lost` unregisters it.
                self._arm(self.limits.idle_timeout, transport.abort)

    def abort(self) -> None:
        """Drop the connection now, unwritten bytes and all (one closed already is left to its flush and the
        deadline `close` armed for it)."""
        if self.closed:
            return
        self._cancel_timer()
        if self.transport is not None:
            self.closed = True
            self.transport.abort()

    def fail(self, status: int, detail: str, *, extra: bytes = b"") -> None:
        """Refuse what the client sent (malformed, too large, too slow): answer with a JSON error if no
        response has started, stop the active handler (it aborts its upstream exchange), close. `extra`:
        raw header lines (each ending in CRLF) for the answer."""
        if self._failed:
            return
        self._failed = True
        self.failed_status = status
        self._cancel_timer()
        if not self.response_started:
            self.write(json_response(status, {"detail": detail}, keep_alive=False, extra_headers=extra))
        if self._task is not None and not self._task.done() and self.handler_started:
            # A handler that has not run yet is left to run: it sees `failed_status` and only counts and logs
            # the request (cancelled before its first step, it did neither - a 413 for a body that came in
            # the head's packet was missing from metrics and the access log until December 6).
            self._task.cancel()
        self._linger_close()

    def linger_close(self) -> None:
        """`_linger_close`, for a protocol that took the connection over (h2c's drain): its client may
        still be sending (a WINDOW_UPDATE, a PING) when its last stream has ended."""
        self._linger_close()

    def _linger_close(self) -> None:
        """Close after a response the client may still be sending a request body to (an error, or an
        answer that came before the body ended) without resetting it away: closing a socket that still has
        unread input makes the kernel send RST, and the client would then lose the response. So: half-close,
        discard input for up to a second - reading resumed if a full body buffer had paused it - then close
        (as Go's server does)."""
        transport = self.transport
        if transport is None or self.closed or self._lingering:
            return
        self._lingering = True
        self._failed = True  # input from here on is drained unparsed
        self._reading_paused_for.clear()
        if self.tunnel is None:
            transport.resume_reading()
        try:
            if transport.can_write_eof():
                transport.write_eof()
            else:
                self.close()
                return
        except (OSError, RuntimeError):
            self.close()
            return
        asyncio.get_running_loop().call_later(1.0, self.close)

    def _idle_expired(self) -> None:
        """The keep-alive idle timeout passed. Answers the client has not read in all that time (its write
        buffer is not empty) are dropped with the connection: a plain close would wait for a flush that a
        client which never reads never lets happen (the connection, its descriptor and buffer were kept for
        good until December 6)."""
        transport = self.transport
        if transport is not None and not self.closed and transport.get_write_buffer_size():
            self.abort()
        else:
            self.close()

    # ------------------------------------------------------------------ timers

    # Per-request timers would cost two timer objects per request on a keep-alive connection; instead
    # each connection records one deadline and a sweeper checks all connections a few times a second
    # (timeouts here are seconds long; a quarter second of slack is fine).

    def _arm(self, delay: float, callback: Callable[[], None]) -> None:
        if self.transport is not None:
            self.deadline = asyncio.get_running_loop().time() + delay
            self._on_deadline = callback

    def _cancel_timer(self) -> None:
        self.deadline = math.inf
        self._on_deadline = None

    def expire(self) -> None:
        """The deadline passed (called by the sweeper)."""
        callback = self._on_deadline
        self._cancel_timer()
        if callback is not None:
            callback()
