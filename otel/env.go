package otel

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Span exporter kinds (the values of OTEL_TRACES_EXPORTER).
const (
	ExporterOTLP    = "otlp"    // OTLP over HTTP/protobuf, configured by OTEL_EXPORTER_OTLP_*
	ExporterConsole = "console" // JSON lines on stdout ("stdout" is accepted too)
	ExporterNone    = "none"
)

// NewSpanExporter returns the span exporter of kind: ExporterOTLP
// (otlptracehttp, which reads OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS,
// _TIMEOUT, … itself), ExporterConsole (to w, os.Stdout when nil) or
// ExporterNone (nil, nil).
func NewSpanExporter(ctx context.Context, kind string, w io.Writer) (sdktrace.SpanExporter, error) {
	switch strings.ToLower(strings.TrimSpace(kind)) {
	case ExporterOTLP, "otlphttp":
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otel: otlp exporter: %w", err)
		}
		return exp, nil
	case ExporterConsole, "stdout":
		if w == nil {
			w = os.Stdout
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, fmt.Errorf("otel: stdout exporter: %w", err)
		}
		return exp, nil
	case ExporterNone:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: unknown span exporter %q (want otlp, console or none)", ErrInvalidOption, kind)
}

// NewTracerProviderFromEnv returns an SDK tracer provider configured by the
// standard environment variables: OTEL_TRACES_EXPORTER picks the exporter
// (otlp by default, console, none; see NewSpanExporter), and the SDK itself
// reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (sampler),
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES (resource), OTEL_BSP_*
// (batching) and OTEL_SPAN_*_LIMIT (limits). opts are applied after those
// (e.g. sdktrace.WithSampler to override). The caller owns the provider:
// Shutdown flushes it. Nothing global is set.
func NewTracerProviderFromEnv(ctx context.Context, opts ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, error) {
	kind := os.Getenv("OTEL_TRACES_EXPORTER")
	if kind == "" {
		kind = ExporterOTLP
	}
	if i := strings.IndexByte(kind, ','); i >= 0 {
		kind = kind[:i] // one exporter: the first listed
	}
	exp, err := NewSpanExporter(ctx, kind, nil)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("otel: resource: %w", err)
	}
	all := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if exp != nil {
		all = append(all, sdktrace.WithBatcher(exp))
	}
	return sdktrace.NewTracerProvider(append(all, opts...)...), nil
}
