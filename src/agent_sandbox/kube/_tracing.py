"""OpenTelemetry tracing behind `--enable-tracing` (controllers spec §5.9); the SDK is imported lazily.

Owns: `Tracing`, the instrumenter controllers use. Disabled (the default) it is a no-op: no spans, empty
trace context, no annotations written, and OpenTelemetry is never imported. Enabled: OTLP exporter from
the standard `OTEL_EXPORTER_OTLP_*` variables (gRPC if `opentelemetry-exporter-otlp-proto-grpc` is
installed, else OTLP/HTTP), batch span processor, resource `service.name=agent-sandbox-controller`,
tracer `agent-sandbox-controller`, W3C TraceContext propagation only.

Trace context is persisted on objects as the annotation `opentelemetry.io/trace-context`, a JSON object
of propagation headers (`{"traceparent": "00-..."}`); `start_span(..., parent=annotation)` continues that
trace (malformed JSON is logged and ignored).

Failure modes: enabling without the SDK/exporter installed raises `TracingError` naming the package.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

__all__ = ["SERVICE_NAME", "Tracing", "TracingError", "setup_tracing"]

log = logging.getLogger("agent_sandbox.kube.tracing")

SERVICE_NAME = "agent-sandbox-controller"


class TracingError(RuntimeError):
    """Tracing was requested but cannot be initialised."""


class Tracing:
    """Span factory + W3C context (de)serialisation; a no-op unless built by `setup_tracing(True)`."""

    def __init__(self, tracer: Any = None, propagator: Any = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._propagator = propagator
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    @property
    def tracer(self) -> Any:
        """The OpenTelemetry tracer (None when disabled), for callers that manage spans themselves."""
        return self._tracer

    @property
    def propagator(self) -> Any:
        """The W3C TraceContext propagator (None when disabled)."""
        return self._propagator

    @contextlib.contextmanager
    def start_span(
        self, name: str, *, parent: str | None = None, attributes: Mapping[str, Any] | None = None
    ) -> Iterator[Any]:
        """Open a span (yields None when disabled), continuing the trace in `parent` (annotation JSON)."""
        if self._tracer is None:
            yield None
            return
        ctx = self._extract(parent) if parent else None
        with self._tracer.start_as_current_span(name, context=ctx, attributes=dict(attributes or {})) as span:
            yield span

    def _extract(self, annotation: str) -> Any:
        try:
            carrier = orjson.loads(annotation)
        except orjson.JSONDecodeError:
            log.info("ignoring malformed trace-context annotation")
            return None
        if not isinstance(carrier, dict):
            return None
        return self._propagator.extract(carrier={str(k): str(v) for k, v in carrier.items()})

    def current_context_annotation(self) -> str:
        """JSON of the current span's propagation headers, "" when disabled or outside a span."""
        if self._propagator is None:
            return ""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return orjson.dumps(carrier).decode() if carrier else ""

    def shutdown(self) -> None:
        """Flush and stop the exporter."""
        if self._provider is not None:
            self._provider.shutdown()


def setup_tracing(enabled: bool, *, service_name: str = SERVICE_NAME, timeout: float = 10.0) -> Tracing:
    """Build the process tracer; disabled returns a no-op `Tracing` without importing OpenTelemetry."""
    if not enabled:
        return Tracing()
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise TracingError(
            "--enable-tracing needs opentelemetry-sdk: pip install 'agent-sandbox[tracing]'"
        ) from exc
    exporter = _exporter(timeout)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider.get_tracer(service_name), TraceContextTextMapPropagator(), provider)


def _exporter(timeout: float) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
            OTLPSpanExporter,
        )

        return OTLPSpanExporter(timeout=int(timeout))
    except ImportError:
        pass
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter(timeout=int(timeout))
    except ImportError as exc:
        raise TracingError(
            "--enable-tracing needs an OTLP exporter: pip install opentelemetry-exporter-otlp-proto-grpc"
        ) from exc
