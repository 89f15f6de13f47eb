"""OpenTelemetry tracing (spec §3.12), as upstream's 1.0.8 `trace_manager`, loaded only when enabled.

Flows mark their spans with `Trace` steps (`_steps.py`); the driver that runs a flow with a `Tracing`
turns them into spans here. A flow has at most one open span: `Trace("op")` ends the previous one and
starts `<trace_service_name>.op` as a child of the caller's context when the flow started (so
`create_claim` and `wait_for_claim_ready` are siblings, as upstream's). While a span is open, every HTTP
request of the flow carries its W3C `traceparent`/`tracestate`.

Choices against upstream (docs/sdk/python.md "Tracing"):
- `enable_tracing=True` without OpenTelemetry installed raises `ImportError` naming the `tracing` extra;
  upstream logs and traces nothing.
- Like upstream, the first tracing client installs a global `TracerProvider` (service.name = the
  trace service name, OTLP gRPC exporter configured by `OTEL_EXPORTER_OTLP_*`, batch processor, flushed
  at exit) — but only when the application has not set one; an application's provider is always used.

Nothing here imports opentelemetry at module import: with tracing off it is never imported.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ._steps import HttpRequest, Trace
from .models import SandboxTracerConfig

__all__ = ["EXTRA_HINT", "FlowTrace", "Tracing", "tracing_for"]

EXTRA_HINT = "pip install 'agent-sandbox-sdk[tracing]'"

log = logging.getLogger("agent_sandbox_sdk")
_provider_lock = threading.Lock()
#: The provider this module installed (None: none yet, or the application brought its own).
_installed_provider: Any = None


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"SandboxTracerConfig(enable_tracing=True) needs OpenTelemetry: {EXTRA_HINT} "
            f"(opentelemetry-api, opentelemetry-sdk, opentelemetry-exporter-otlp-proto-grpc); "
            f"importing {module} failed: {err}"
        ) from err


def _ensure_provider(trace: Any, service_name: str) -> None:
    """Install the OTLP provider unless a global provider is already set (by the application or by us)."""
    global _installed_provider
    with _provider_lock:
        current = trace.get_tracer_provider()
        if _installed_provider is not None:
            name = _installed_provider.resource.attributes.get("service.name")
            if name != service_name:
                log.warning(
                    "tracing: the global TracerProvider was set up for service %r; spans of %r go there",
                    name,
                    service_name,
                )
            return
        if not isinstance(current, trace.ProxyTracerProvider):
            return  # the application's provider
        sdk_trace = _import("opentelemetry.sdk.trace")
        export = _import("opentelemetry.sdk.trace.export")
        resources = _import("opentelemetry.sdk.resources")
        otlp = _import("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
        provider = sdk_trace.TracerProvider(
            resource=resources.Resource(attributes={"service.name": service_name})
        )
        provider.add_span_processor(export.BatchSpanProcessor(otlp.OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        atexit.register(provider.shutdown)
        _installed_provider = provider


class Tracing:
    """One client's (or standalone handle's) tracer: span names `<service_name>.<op>`."""

    def __init__(self, service_name: str) -> None:
        self.service_name = service_name
        self._trace = _import("opentelemetry.trace")
        self._context = _import("opentelemetry.context")
        propagation = _import("opentelemetry.trace.propagation.tracecontext")
        _import("opentelemetry.sdk.trace")  # the extra, not only the API: fail now, not at first span
        _ensure_provider(self._trace, service_name)
        # Upstream's instrumentation scope: the service name with '-' -> '_'.
        self._tracer = self._trace.get_tracer(service_name.replace("-", "_"))
        self._propagator = propagation.TraceContextTextMapPropagator()

    def current_context(self) -> Any:
        return self._context.get_current()

    def start(self, op: str, attributes: Mapping[str, Any], parent: Any) -> Any:
        return self._tracer.start_span(
            f"{self.service_name}.{op}", context=parent, attributes=dict(attributes)
        )

    def carrier(self, span: Any) -> dict[str, str]:
        """`traceparent` (+ `tracestate`) of `span`; no baggage (upstream's annotation content)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier

    def end(self, span: Any, error: BaseException | None) -> None:
        if error is not None:
            span.record_exception(error)
            span.set_status(
                self._trace.Status(self._trace.StatusCode.ERROR, f"{type(error).__name__}: {error}")
            )
        span.end()


def tracing_for(config: SandboxTracerConfig) -> Tracing | None:
    """The tracer for `config`, or None when tracing is off (then opentelemetry is not imported)."""
    return Tracing(config.trace_service_name) if config.enable_tracing else None


class FlowTrace:
    """The span state of one running flow (used by the drivers only)."""

    __slots__ = ("_parent", "_span", "headers", "tracing")

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing
        self._parent: Any = None
        self._span: Any = None
        #: Trace-context headers of the open span ({} when none is open).
        self.headers: dict[str, str] = {}

    def step(self, step: Trace) -> dict[str, str]:
        """Handle a `Trace` step; its result is the open span's trace-context carrier."""
        if step.op is None:
            if self._span is not None and step.attributes:
                self._span.set_attributes(dict(step.attributes))
            return dict(self.headers)
        if self._span is None:
            self._parent = self.tracing.current_context()
        else:
            self.tracing.end(self._span, None)
        self._span = self.tracing.start(step.op, step.attributes, self._parent)
        self.headers = self.tracing.carrier(self._span)
        return dict(self.headers)

    def stamp(self, request: HttpRequest) -> HttpRequest:
        """`request` with the open span's trace-context headers (unchanged when no span is open)."""
        if not self.headers:
            return request
        return replace(request, headers={**request.headers, **self.headers})

    def finish(self, error: BaseException | None) -> None:
        """End the open span when the flow ends; an error (cancellation included) marks it failed, a stream
        closed early by its reader (`GeneratorExit`) does not."""
        if self._span is not None:
            self.tracing.end(self._span, None if isinstance(error, GeneratorExit) else error)
            self._span = None
            self.headers = {}
