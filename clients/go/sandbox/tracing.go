package sandbox

import (
	"context"
	"encoding/json"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracing wraps the configured TracerProvider (nil: no spans) and the W3C propagator. The propagator is a
// value, not otel's global one, so the SDK never depends on process-wide state.
type tracing struct {
	tracer  trace.Tracer
	service string
	prop    propagation.TraceContext
}

func newTracing(tp trace.TracerProvider, service string) *tracing {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &tracing{tracer: tp.Tracer(service), service: service}
}

// start opens span "<service>.<op>".
func (t *tracing) start(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, t.service+"."+op, trace.WithAttributes(attrs...))
}

// end records err (if any) on the span and ends it.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// inject writes traceparent/tracestate of ctx's span into h (nothing when ctx has no valid span).
func (t *tracing) inject(ctx context.Context, h http.Header) {
	t.prop.Inject(ctx, propagation.HeaderCarrier(h))
}

// annotation is the JSON trace context stored on the claim (opentelemetry.io/trace-context), or "".
func (t *tracing) annotation(ctx context.Context) string {
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return ""
	}
	b, err := json.Marshal(map[string]string(carrier))
	if err != nil {
		return ""
	}
	return string(b)
}
