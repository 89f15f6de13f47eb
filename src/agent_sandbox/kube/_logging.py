"""Structured logging: zap-compatible flags, JSON/console encoders, per-reconcile context fields.

Owns: `configure_logging()` (the `--zap-*` flags of controllers spec §5.1 mapped onto stdlib logging),
`JsonFormatter` (one orjson line per record: level, ts, logger, msg, caller, extra fields, stacktrace),
`ConsoleFormatter`, and the reconcile context (`bind_reconcile`) that stamps `controller`, `namespace`,
`name` and `reconcileID` onto every record logged during a reconcile, via a contextvar (no logger
objects are created per reconcile).
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any

import orjson

from ..api.errortext import describe_error

__all__ = [
    "LEVELS",
    "STACKTRACE_LEVELS",
    "TIME_ENCODINGS",
    "ConsoleFormatter",
    "JsonFormatter",
    "bind_reconcile",
    "configure_logging",
    "format_time",
    "parse_zap_level",
]

LEVELS = ("debug", "info", "error", "panic")
STACKTRACE_LEVELS = ("info", "error", "panic")
TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")
_ZAP_TO_PY = {"debug": logging.DEBUG, "info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}
_PY_TO_ZAP = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warn",
    logging.ERROR: "error",
    logging.CRITICAL: "panic",
}

_ctx: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("reconcile_ctx", default=None)

_STD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def parse_zap_level(value: str) -> int:
    """Map a `--zap-log-level` value ('debug', 'info', 'error', 'panic' or an integer > 0) to a level.

    Raises:
        ValueError: anything else.
    """
    if value in _ZAP_TO_PY:
        return _ZAP_TO_PY[value]
    try:
        n = int(value)
    except ValueError:
        raise ValueError(
            f"invalid log level {value!r}: use debug, info, error, panic or an integer > 0"
        ) from None
    if n <= 0:
        raise ValueError(f"invalid log level {value!r}: integer verbosity must be > 0")
    # zap verbosity N logs at -N; stdlib has no levels below DEBUG worth distinguishing here.
    return max(1, logging.DEBUG - (n - 1))


class _Token:
    __slots__ = ("_token",)

    def __init__(self, token: contextvars.Token[dict[str, str] | None]) -> None:
        self._token = token

    def reset(self) -> None:
        _ctx.reset(self._token)


def bind_reconcile(controller: str, namespace: str, name: str, reconcile_id: str) -> _Token:
    """Attach reconcile fields to log records of the current task until `reset()`."""
    return _Token(
        _ctx.set(
            {"controller": controller, "namespace": namespace, "name": name, "reconcileID": reconcile_id}
        )
    )


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ctx = _ctx.get()
    if ctx:
        out.update(ctx)
    for key, value in record.__dict__.items():
        if key not in _STD_ATTRS:
            out[key] = value
    return out


def _time(record: logging.LogRecord, encoding: str) -> Any:
    return format_time(record.created, encoding)


def format_time(t: float, encoding: str) -> Any:
    """A timestamp in one of the `--zap-time-encoding` forms (epoch seconds in, JSON value out)."""
    if encoding == "epoch":
        return t
    if encoding == "millis":
        return t * 1000.0
    if encoding == "nano":
        return int(t * 1e9)
    dt = datetime.fromtimestamp(t, UTC)
    if encoding == "rfc3339":
        return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    if encoding == "iso8601":
        return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
    return dt.isoformat().replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """zap-style JSON lines."""

    def __init__(self, *, time_encoding: str = "rfc3339", stacktrace_level: int = logging.ERROR) -> None:
        super().__init__()
        self._time_encoding = time_encoding
        self._stack_level = stacktrace_level

    @property
    def time_encoding(self) -> str:
        return self._time_encoding

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "level": _PY_TO_ZAP.get(record.levelno, "debug"),
            "ts": _time(record, self._time_encoding),
            "logger": record.name,
            "caller": f"{record.module}.py:{record.lineno}",
            "msg": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = describe_error(record.exc_info[1])
            if record.levelno >= self._stack_level:
                entry["stacktrace"] = "".join(traceback.format_exception(*record.exc_info))
        return orjson.dumps(entry, default=str).decode()


class ConsoleFormatter(logging.Formatter):
    """Human-readable lines: time, level, logger, message, then key=value fields."""

    def __init__(self, *, time_encoding: str = "iso8601", stacktrace_level: int = logging.ERROR) -> None:
        super().__init__()
        self._time_encoding = time_encoding
        self._stack_level = stacktrace_level

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        kv = " ".join(f"{k}={v}" for k, v in fields.items())
        level = _PY_TO_ZAP.get(record.levelno, "debug").upper()
        line = f"{_time(record, self._time_encoding)}\t{level}\t{record.name}\t{record.getMessage()}"
        if kv:
            line += "\t" + kv
        if record.exc_info and record.exc_info[1] is not None:
            if record.levelno >= self._stack_level:
                line += "\n" + "".join(traceback.format_exception(*record.exc_info))
            else:
                line += f"\terror={describe_error(record.exc_info[1])}"
        return line


def configure_logging(
    *,
    devel: bool = False,
    encoder: str | None = None,
    level: str | None = None,
    stacktrace_level: str | None = None,
    time_encoding: str | None = None,
    stream: Any = None,
) -> None:
    """Install the root handler from the zap flags (None = the zap default for the mode).

    Production defaults: JSON, info, stacktraces from error, rfc3339 time. `--zap-devel`: console,
    debug, stacktraces from warn.
    """
    encoder = encoder or ("console" if devel else "json")
    py_level = parse_zap_level(level) if level else (logging.DEBUG if devel else logging.INFO)
    stack = (
        _ZAP_TO_PY[stacktrace_level] if stacktrace_level else (logging.WARNING if devel else logging.ERROR)
    )
    tenc = time_encoding or ("iso8601" if devel else "rfc3339")
    formatter: logging.Formatter
    if encoder == "json":
        formatter = JsonFormatter(time_encoding=tenc, stacktrace_level=stack)
    else:
        formatter = ConsoleFormatter(time_encoding=tenc, stacktrace_level=stack)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(py_level)
    logging.Formatter.converter = time.gmtime
    # aiohttp's access log would add a line per probe/scrape.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
