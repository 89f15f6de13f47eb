"""The request span: one OpenTelemetry server span per proxied request, when tracing is configured.

Owns: starting the span as a child of the client's `traceparent`/`tracestate` (when a propagator is set),
ending it with the response status, and the span's context that `_headers.request_head` injects into the
request sent to the sandbox. `opentelemetry` is imported only on first use: the router runs without it
when tracing is off.

Does not own: the tracer and propagator (set up by `_app` from `kube.setup_tracing`) or the span's
Sandbox attributes (set by `_proxy` once the route is known).
"""

from __future__ import annotations

import contextlib
from typing import Any

import httptools

from ._outcome import Outcome
from ._request import Request

__all__ = ["TRACE_HEADERS", "end_span", "span_context", "start_span", "target_path"]

TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})


def start_span(tracer: Any, propagator: Any, req: Request) -> Any:
    """A started server span for `req`, parented by the client's trace context when it sent one."""
    carrier = {
        lname.decode("latin-1"): value.decode("latin-1")
        for lname, _, value in req.headers
        if lname in TRACE_HEADERS
    }
    parent = propagator.extract(carrier) if carrier and propagator is not None else None
    span = tracer.start_span(
        f"HTTP {req.method}",
        context=parent,
        kind=_server_kind(),
        attributes={"http.method": req.method, "http.target": target_path(req.url)},
    )
    return span


def target_path(url: bytes) -> str:
    """The path of a request target, as upstream's `r.URL.Path`: no query (it can carry tokens, which a
    trace backend should not get; until December 6 the whole target was recorded), and the path of an
    absolute-form target."""
    if url.startswith((b"http://", b"https://")):
        with contextlib.suppress(httptools.HttpParserInvalidURLError):
            url = httptools.parse_url(url).path or b"/"
    q = url.find(b"?")
    return (url if q < 0 else url[:q]).decode("latin-1")


def end_span(span: Any, out: Outcome) -> None:
    """Record the response status on `span` and end it."""
    span.set_attribute("http.status_code", out.status)
    span.end()


def _server_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.SERVER


def span_context(span: Any) -> Any:
    """A context holding `span`, for the propagator to inject."""
    from opentelemetry.trace import set_span_in_context

    return set_span_in_context(span)
