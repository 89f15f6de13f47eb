"""The I/O vocabulary between the SDK's flows and its two drivers.

Every SDK operation is written once, as a generator ("flow") that yields steps — send this HTTP request,
open a stream and read a line, call a gRPC method, sleep, emit a value to the caller — and receives each
step's result. `SyncDriver` and `AsyncDriver` (`_driver.py`) execute the same flows with blocking or
asyncio I/O; nothing else in the SDK does I/O (httpx's `auth_flow` idea, applied to whole operations).

Failures are thrown into the flow at the `yield` that caused them: `SandboxRequestError` subclasses for
HTTP transport failures, `GrpcFailure` for gRPC status errors. Handles opened by a flow are closed by the
driver when the flow ends, however it ends, so flows never need `yield` in a `finally`.
"""

from __future__ import annotations

import json as _json
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

__all__ = [
    "Close",
    "Emit",
    "Flow",
    "GrpcCall",
    "GrpcFailure",
    "GrpcOpen",
    "GrpcRead",
    "HttpRequest",
    "HttpResponse",
    "Open",
    "ReadChunk",
    "ReadLine",
    "Send",
    "Sleep",
    "Step",
    "StreamHandle",
    "TlsSettings",
    "Trace",
    "Upload",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Client TLS for sandbox-side requests (router mTLS): CA bundle and client certificate paths."""

    ca_cert: str | None = None
    client_cert: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Upload:
    """A streamed request body: `prefix`, then `source` read in `chunk_size` pieces, then `suffix`."""

    source: IO[bytes]
    prefix: bytes = b""
    suffix: bytes = b""
    chunk_size: int = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request. `kube=True`: a path on the Kubernetes API (its auth and TLS); else an absolute URL."""

    method: str
    url: str
    kube: bool = False
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    upload: Upload | None = None
    #: Read timeout in seconds (None: no limit); connecting is bounded by min(timeout, 10 s).
    timeout: float | None = 60.0
    tls: TlsSettings | None = None
    #: Most body bytes read (None: all); a longer body comes back cut, with `HttpResponse.over_limit`.
    max_response_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A complete HTTP response (header names lower-cased)."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    method: str = ""
    url: str = ""
    #: The body went past the request's `max_response_bytes`; `content` holds only that much.
    over_limit: bool = False

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return _json.loads(self.content)

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


class StreamHandle:
    """An open streamed response: status and headers known, body read with `ReadLine`/`ReadChunk`."""

    def __init__(self, status_code: int, headers: Mapping[str, str], method: str, url: str, raw: Any) -> None:
        self.status_code = status_code
        self.headers = headers
        self.method = method
        self.url = url
        self.raw = raw  # driver-private state


class GrpcFailure(Exception):
    """A gRPC call ended with a non-OK status (`code` is the status name, e.g. `DEADLINE_EXCEEDED`)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


@dataclass(frozen=True, slots=True)
class Send:
    """Send a request and read the whole body -> `HttpResponse`."""

    request: HttpRequest


@dataclass(frozen=True, slots=True)
class Open:
    """Send a request, read only the head -> `StreamHandle`."""

    request: HttpRequest


@dataclass(frozen=True, slots=True)
class ReadLine:
    """Next line of a streamed body (without the newline) -> bytes, or None at the end."""

    handle: StreamHandle


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """Next chunk of a streamed body -> bytes, or None at the end."""

    handle: StreamHandle


@dataclass(frozen=True, slots=True)
class Close:
    """Release a stream (HTTP or gRPC) early -> None."""

    handle: Any


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class GrpcCall:
    """A unary gRPC call on plaintext `target` (`host:port`) -> the response message."""

    target: str
    method: str
    request: Any
    response_type: Any
    timeout: float | None
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GrpcOpen:
    """A server-streaming gRPC call -> an opaque handle for `GrpcRead`/`Close`."""

    target: str
    method: str
    request: Any
    response_type: Any
    timeout: float | None
    metadata: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GrpcRead:
    """Next message of a gRPC stream -> message, or None at the end."""

    handle: Any


@dataclass(frozen=True, slots=True)
class Emit:
    """Hand a value to the caller of a streaming operation -> None."""

    value: Any


@dataclass(frozen=True, slots=True)
class Trace:
    """Mark the flow's span (`_tracing.py`) -> the open span's W3C trace-context carrier ({} when untraced).

    `op` given: end the flow's open span and start `<trace_service_name>.<op>` with `attributes`.
    `op` None: add `attributes` to the open span. Drivers without tracing answer {} at once.
    """

    op: str | None
    attributes: Mapping[str, str | int | float | bool] = field(default_factory=dict)


Step = Send | Open | ReadLine | ReadChunk | Close | Sleep | GrpcCall | GrpcOpen | GrpcRead | Emit | Trace
#: A flow: yields steps, receives their results, returns the operation's result.
Flow = Generator[Step, Any, T]
