"""The access log (router spec §1.14): logger `sandbox-router.access`, message `request`, one line per
proxied request (not `/healthz`, `/readyz`, `/metrics`) with method, path, status, duration_ms,
client_ip, sandbox_id, sandbox_namespace (raw header values), bytes_out, user_agent, trace_id/span_id.

Cost matters here: it runs on every request. When logging is configured the production way (the root
handler writes zap-style JSON lines, `configure_logging`), lines are built directly with orjson in the
same layout as `JsonFormatter` and written in batches (at most every 50 ms, or 64 KiB), instead of one
LogRecord, one formatting pass and one write system call per request. Any other configuration (console
encoder, extra handlers, tests capturing records) goes through `logging` unchanged.

Owns: the fields of a line, taken from a finished request and its `Outcome` (`log_request`), and writing
lines (`AccessLog`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import IO, Any

import orjson

from ..kube._logging import JsonFormatter, format_time
from ._outcome import Outcome
from ._request import Request
from ._server import ClientConnection

__all__ = ["ACCESS_LOGGER", "AccessLog", "log_request"]

ACCESS_LOGGER = "sandbox-router.access"
_FLUSH_DELAY = 0.05
_FLUSH_BYTES = 64 * 1024
_CALLER = "_accesslog.py:1"

log = logging.getLogger(ACCESS_LOGGER)


class AccessLog:
    """Writes access-log entries, batched when the root handler is a plain JSON stream."""

    def __init__(self) -> None:
        self._stream: IO[str] | None = None
        self._encoding = "rfc3339"
        self._buffer: list[bytes] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None
        self._ts_second = -1
        self._ts_value: Any = ""
        root = logging.getLogger()
        handlers = root.handlers
        if (
            len(handlers) == 1
            and type(handlers[0]) is logging.StreamHandler
            and isinstance(handlers[0].formatter, JsonFormatter)
            and not log.handlers
            and log.propagate
        ):
            self._stream = handlers[0].stream
            self._encoding = handlers[0].formatter.time_encoding

    @property
    def batched(self) -> bool:
        return self._stream is not None

    def enabled(self) -> bool:
        return log.isEnabledFor(logging.INFO)

    def write(self, fields: dict[str, Any]) -> None:
        if self._stream is None:
            log.info("request", extra=fields)
            return
        entry: dict[str, Any] = {
            "level": "info",
            "ts": self._timestamp(),
            "logger": ACCESS_LOGGER,
            "caller": _CALLER,
            "msg": "request",
        }
        entry.update(fields)
        line = orjson.dumps(entry) + b"\n"
        self._buffer.append(line)
        self._size += len(line)
        if self._size >= _FLUSH_BYTES:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(_FLUSH_DELAY, self.flush)

    def _timestamp(self) -> Any:
        now = time.time()
        if self._encoding in ("rfc3339",):
            second = int(now)
            if second != self._ts_second:
                self._ts_second, self._ts_value = second, format_time(now, self._encoding)
            return self._ts_value
        return format_time(now, self._encoding)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer or self._stream is None:
            return
        data = b"".join(self._buffer).decode()
        self._buffer.clear()
        self._size = 0
        try:
            self._stream.write(data)
            self._stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken log stream must not break request handling


def log_request(
    access: AccessLog,
    conn: ClientConnection,
    req: Request,
    out: Outcome,
    elapsed: float,
    span: Any,
) -> None:
    """Write the access-log line of one finished request (none for `/healthz`, `/readyz`, `/metrics`)."""
    path = req.path
    if path in (b"/healthz", b"/readyz", b"/metrics"):
        return
    ua = next((v for lname, _, v in req.headers if lname == b"user-agent"), b"")
    fields: dict[str, Any] = {
        "method": req.method,
        "path": path.decode("latin-1"),
        "status": out.status,
        "duration_ms": round(elapsed * 1000, 3),
        "client_ip": conn.client_ip,
        "sandbox_id": req.routing.get(b"x-sandbox-id", b"").decode("latin-1"),
        "sandbox_namespace": req.routing.get(b"x-sandbox-namespace", b"").decode("latin-1"),
        "bytes_out": out.bytes_out,
        "user_agent": ua.decode("latin-1"),
    }
    if span is not None:
        ctx = span.get_span_context()
        fields["trace_id"] = format(ctx.trace_id, "032x")
        fields["span_id"] = format(ctx.span_id, "016x")
    access.write(fields)
